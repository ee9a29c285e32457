"""A stream consumer's ``basic.consume`` arguments, typed once from one table (as the queue
arguments are, ``broker/arguments.py``):

- ``x-stream-offset``: where it starts: ``first``, ``last``, ``next`` (the default), an offset,
  a timestamp, or an interval such as ``"1h"`` (that long ago); null asks for server-side
  offset tracking, starting from ``first`` the first time;
- ``x-stream-group``: the consumer group it reads for (Kafka's way, ``groups.py``);
- ``x-stream-automatic-offset-tracking``: server-side offset tracking (LavinMQ's way).

A value a row refuses is RabbitMQ's 406 PRECONDITION_FAILED, ``invalid arg '<name>' for consumer
on stream <queue>: <why>``; so are the combinations that cannot work (tracking without a consumer
tag, tracking in a group). Where a start points is the queue's to say (``StreamQueue``), against
its partition's ends at the time the consumer starts.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Final

import attrs

from ...protocol.codec import FieldTable, FieldValue, Timestamp
from ...protocol.errors import AMQPError, ReplyCode
from ..arguments import parse_interval

OFFSET: Final = "x-stream-offset"
GROUP: Final = "x-stream-group"
TRACKING: Final = "x-stream-automatic-offset-tracking"


@attrs.frozen
class Start:
    """Where a consumer starts: ``kind`` is ``first``, ``last``, ``next``, ``offset``
    (``value`` the offset), ``timestamp`` (``value`` in ms) or ``ago`` (``value`` ms before
    the consumer starts)."""

    kind: str
    value: int = 0


NEXT: Final = Start("next")


_AFTER_EVERYTHING_MS: Final = 2**63 - 1  # a record's timestamp is a signed 64-bit of ms


class _Refused(Exception):
    """A row's refusal: why (the end of RabbitMQ's text)."""


def _start(value: FieldValue) -> Start:
    if value is None or value == "first":  # None: offset tracking, first time from the start
        return Start("first")
    if value in ("last", "next"):
        assert isinstance(value, str)
        return Start(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return Start("offset", value)
    if isinstance(value, datetime.datetime):
        return Start("timestamp", int(value.timestamp() * 1000))
    if isinstance(value, Timestamp):  # past year 9999: after every record, the end
        return Start("timestamp", _AFTER_EVERYTHING_MS)
    if isinstance(value, str) and (interval := parse_interval(value)) is not None:
        return Start("ago", interval)
    raise _Refused(
        f"first, last, next, an offset, a timestamp or an interval such as 1h (got {value!r})"
    )


def _group(value: FieldValue) -> str:
    if not isinstance(value, str) or not value:
        raise _Refused(f"a group name is required (got {value!r})")
    return value


def _boolean(value: FieldValue) -> bool:
    if not isinstance(value, bool):
        raise _Refused(f"a boolean is required (got {value!r})")
    return value


# The table: each argument, the field it types, how (raising ``_Refused``), in checking order.
ROWS: Final[tuple[tuple[str, str, Callable[[FieldValue], object]], ...]] = (
    (TRACKING, "automatic_tracking", _boolean),
    (GROUP, "group", _group),
    (OFFSET, "start", _start),
)


@attrs.frozen
class StreamConsumerArguments:
    """A stream consumer's arguments, typed (see the module doc)."""

    start: Start = NEXT
    group: str | None = None
    automatic_tracking: bool = False
    null_offset: bool = False  # ``x-stream-offset`` given as null: tracking, LavinMQ's other way

    @property
    def tracks_offset(self) -> bool:
        """Server-side offset tracking asked for (either way)."""
        return self.automatic_tracking or self.null_offset

    @classmethod
    def parse(cls, arguments: FieldTable, *, tag: str, where: str) -> StreamConsumerArguments:
        """Type ``arguments`` of a consumer with ``tag`` on the stream ``where`` describes
        (``queue 'q' in vhost 'v'``), or refuse them (``AMQPError`` 406)."""
        fields: dict[str, object] = {}
        for name, field, parse in ROWS:
            if name not in arguments:
                continue
            try:
                fields[field] = parse(arguments[name])
            except _Refused as refused:
                problem = f"invalid arg '{name}' for consumer on stream {where}: {refused}"
                raise _precondition(problem) from None
        parsed = cls(null_offset=OFFSET in arguments and arguments[OFFSET] is None, **fields)  # type: ignore[arg-type]
        if parsed.tracks_offset and not tag:
            raise _precondition(f"offset tracking on stream {where} needs a consumer tag")
        if parsed.group is not None and parsed.tracks_offset:
            raise _precondition(
                f"consumer on stream {where}: '{GROUP}' and offset tracking cannot be combined "
                "(the group's offsets are tracked)"
            )
        return parsed


def _precondition(text: str) -> AMQPError:
    return AMQPError(ReplyCode.PRECONDITION_FAILED, text)
