"""Queue and consumer ``x-*`` arguments: one table, checked and parsed once.

Responsibilities:
- ``QUEUE_ARGUMENTS``: one row per queue argument RabbitMQ (or tqbroker) knows: its check, the
  queue kinds that accept it, whether a redeclare compares it, and the ``QueueArguments`` field
  it fills; arguments not in the table are accepted and ignored, as RabbitMQ does;
- ``check_declaration``: RabbitMQ's 406 answers for ill-typed or out-of-range arguments, an
  unknown ``x-queue-type``, or a property or an argument the kind refuses;
- ``check_equivalent``: the 406 for a redeclare (of a queue or an exchange) whose properties or
  compared arguments differ;
- ``QueueArguments``: the typed arguments, built once at declare (or restore) time; queues read
  it, nobody parses ``x-*`` arguments again;
- ``check_consumer_arguments`` / ``ConsumerArguments``: the same for ``basic.consume``'s
  ``x-priority`` and ``x-consumer-timeout``;
- ``parse_interval``: RabbitMQ's interval strings (``7D``, ``12h``; units Y M D h m s).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Final

import attrs

from ..protocol.codec import FieldTable, FieldValue, encode_table
from ..protocol.errors import AMQPError, ReplyCode

log = logging.getLogger(__name__)

_INTERVAL: Final = re.compile(r"([0-9]+)([YMDhms])")
_UNIT_SECONDS: Final = {
    "Y": 365 * 86400,
    "M": 30 * 86400,
    "D": 86400,
    "h": 3600,
    "m": 60,
    "s": 1,
}


def parse_interval(value: str) -> int | None:
    """Milliseconds in a RabbitMQ interval string (``"7D"``, ``"1h"``), or None if invalid."""
    match = _INTERVAL.fullmatch(value)
    if match is None:
        return None
    return int(match.group(1)) * _UNIT_SECONDS[match.group(2)] * 1000


# -- checks: None when the value is fine, else what is wrong ------------------------------------

Check = Callable[[FieldValue], str | None]


def _int_range(low: int, high: int | None = None) -> Check:
    def check(value: FieldValue) -> str | None:
        if not isinstance(value, int) or isinstance(value, bool):
            return "an integer is required"
        if value < low or (high is not None and value > high):
            return f"must be between {low} and {high}" if high is not None else f"must be >= {low}"
        return None

    return check


def _one_of(*allowed: str) -> Check:
    def check(value: FieldValue) -> str | None:
        return None if value in allowed else f"must be one of {', '.join(allowed)}"

    return check


def _string(value: FieldValue) -> str | None:
    return None if isinstance(value, str) else "a string is required"


def _boolean(value: FieldValue) -> str | None:
    return None if isinstance(value, bool) else "a boolean is required"


def _interval(value: FieldValue) -> str | None:
    if isinstance(value, str) and parse_interval(value) is not None:
        return None
    return "an interval such as 7D or 12h is required (units Y M D h m s)"


def _as_interval(value: FieldValue) -> int | None:
    return parse_interval(value) if isinstance(value, str) else None


# -- the table ------------------------------------------------------------------------------------

CLASSIC: Final = "classic"
STREAM: Final = "stream"
KINDS: Final = (CLASSIC, STREAM)
_ANY: Final = frozenset(KINDS)
_CLASSIC_ONLY: Final = frozenset({CLASSIC})


@attrs.frozen
class Argument:
    """One queue argument: ``check`` (None: checked elsewhere, see the row's comment), the queue
    kinds that accept it, whether a redeclare compares it, and the ``QueueArguments`` field its
    (checked) value fills, through ``parse`` (identity by default)."""

    name: str
    check: Check | None
    kinds: frozenset[str]
    compared: bool
    field: str | None = None
    parse: Callable[[FieldValue], Any] | None = None


# The queue arguments tqbroker knows, one row each:
#   Argument(name, check, kinds accepting it, compared on redeclare, QueueArguments field[, parse])
QUEUE_ARGUMENTS: Final = (
    Argument("x-expires", _int_range(1), _CLASSIC_ONLY, True, "expires_ms"),
    Argument("x-message-ttl", _int_range(0, 2**32 - 1), _CLASSIC_ONLY, True, "message_ttl"),
    Argument("x-max-length", _int_range(0), _CLASSIC_ONLY, True, "max_length"),
    # On a stream: retention (whole segments).
    Argument("x-max-length-bytes", _int_range(0), _ANY, True, "max_length_bytes"),
    Argument("x-max-priority", _int_range(0, 255), _CLASSIC_ONLY, True, "max_priority"),
    Argument("x-delivery-limit", _int_range(0), _CLASSIC_ONLY, True, "delivery_limit"),
    Argument("x-consumer-timeout", _int_range(0), _ANY, False, "consumer_timeout_ms"),
    Argument(
        "x-overflow",
        _one_of("drop-head", "reject-publish", "reject-publish-dlx"),
        _CLASSIC_ONLY,
        True,
        "overflow",
    ),
    Argument("x-queue-mode", _one_of("default", "lazy"), _ANY, True),
    Argument("x-dead-letter-exchange", _string, _CLASSIC_ONLY, True, "dead_letter_exchange"),
    Argument("x-dead-letter-routing-key", _string, _CLASSIC_ONLY, True, "dead_letter_routing_key"),
    Argument("x-single-active-consumer", _boolean, _CLASSIC_ONLY, True, "single_active_consumer"),
    Argument("x-max-age", _interval, _ANY, True, "max_age_ms", _as_interval),
    # A segment keeps three files open: tiny segments would let one client exhaust the
    # broker's file descriptors, so 1 MiB is the least (RabbitMQ's default is 500 MB).
    Argument(
        "x-stream-max-segment-size-bytes", _int_range(1024 * 1024), _ANY, True, "segment_bytes"
    ),
    # Compaction (Kafka's cleanup.policy=compact): the latest record per key is kept.
    Argument(
        "x-stream-cleanup-policy",
        _one_of("delete", "compact", "compact,delete", "delete,compact"),
        _ANY,
        True,
        "cleanup_policy",
    ),
    Argument("x-stream-compaction-key-header", _string, _ANY, True, "compaction_key_header"),
    Argument(
        "x-stream-delete-retention", _interval, _ANY, False, "delete_retention_ms", _as_interval
    ),
    # Checked by ``queue_kind`` (after the others, with its own wording).
    Argument("x-queue-type", None, _ANY, True),
    # Checked when the backend is chosen, against the installed backends (new queues only).
    Argument("x-queue-backend", None, _CLASSIC_ONLY, True, "backend"),
)

_BY_NAME: Final = {row.name: row for row in QUEUE_ARGUMENTS}
_COMPARED: Final = frozenset(row.name for row in QUEUE_ARGUMENTS if row.compared)


def _where(name: str, vhost: str) -> str:
    return f"for queue '{name}' in vhost '{vhost}'"


def check_queue_arguments(name: str, vhost: str, arguments: FieldTable) -> None:
    """Refuse ill-typed or out-of-range ``x-`` arguments with RabbitMQ's 406."""
    for key, value in arguments.items():
        row = _BY_NAME.get(key)
        problem = row.check(value) if row is not None and row.check is not None else None
        if (
            problem is None
            and key == "x-dead-letter-routing-key"
            and "x-dead-letter-exchange" not in arguments
        ):
            problem = "x-dead-letter-routing-key set but x-dead-letter-exchange is not"
        if problem is not None:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{key}' {_where(name, vhost)}: {problem} (got {value!r})",
            )


def queue_kind(name: str, vhost: str, arguments: FieldTable) -> str:
    """The kind ``x-queue-type`` asks for (classic by default); 406 for one tqbroker lacks."""
    kind = arguments.get("x-queue-type", CLASSIC)
    if kind not in KINDS:
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid arg 'x-queue-type' {_where(name, vhost)}: "
            f"{kind!r} is not supported (supported: 'classic', 'stream')",
        )
    assert isinstance(kind, str)
    return kind


def check_kind(
    name: str,
    vhost: str,
    kind: str,
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: FieldTable,
) -> None:
    """RabbitMQ's rules for the kind: a stream is durable, not exclusive or auto-delete; no
    queue takes an argument its kind does not support (RabbitMQ's feature matrix)."""
    if kind == STREAM:
        for problem, present in (
            ("non-durable", not durable),
            ("exclusive", exclusive),
            ("auto-delete", auto_delete),
        ):
            if present:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid property '{problem}' {_where(name, vhost)}",
                )
    for key in arguments:
        row = _BY_NAME.get(key)
        if row is not None and kind not in row.kinds:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{key}' {_where(name, vhost)}: not supported by {kind} queues",
            )


def check_declaration(
    name: str,
    vhost: str,
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: FieldTable,
) -> str:
    """Check a ``queue.declare`` in RabbitMQ's order (arguments, then the kind, then what the
    kind refuses); return the queue's kind."""
    check_queue_arguments(name, vhost, arguments)
    kind = queue_kind(name, vhost, arguments)
    check_kind(
        name,
        vhost,
        kind,
        durable=durable,
        exclusive=exclusive,
        auto_delete=auto_delete,
        arguments=arguments,
    )
    return kind


def check_equivalent(
    what: str,
    flags: dict[str, tuple[object, object]],
    arguments: FieldTable,
    current: FieldTable,
) -> None:
    for flag, (received, now) in flags.items():
        if received != now:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"inequivalent arg '{flag}' {what}: received '{_fmt(received)}' but "
                f"current is '{_fmt(now)}'",
            )
    for key in sorted(set(arguments) | set(current)):
        got: FieldValue = arguments.get(key)
        now_value: FieldValue = current.get(key)
        if encode_table({key: got}) != encode_table({key: now_value}):
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"inequivalent arg '{key}' {what}: received "
                f"{'none' if got is None else repr(got)} but current is "
                f"{'none' if now_value is None else repr(now_value)}",
            )


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def compared_arguments(arguments: FieldTable) -> FieldTable:
    """The arguments a redeclare must match; others are accepted and ignored."""
    return {k: v for k, v in arguments.items() if k in _COMPARED}


@attrs.frozen
class QueueArguments:
    """A queue's arguments, typed: what ``table`` (the arguments as declared, kept for the
    definitions file and redeclares) says, each field None (or its default) when absent."""

    table: FieldTable = attrs.field(factory=dict)
    kind: str = CLASSIC
    backend: FieldValue = None  # any value: checked against the installed backends
    expires_ms: int | None = None
    message_ttl: int | None = None  # ms
    max_length: int | None = None
    max_length_bytes: int | None = None
    max_priority: int | None = None
    delivery_limit: int | None = None
    consumer_timeout_ms: int | None = None
    overflow: str = "drop-head"
    dead_letter_exchange: str | None = None
    dead_letter_routing_key: str | None = None
    single_active_consumer: bool = False
    max_age_ms: int | None = None
    segment_bytes: int | None = None
    cleanup_policy: str | None = None
    compaction_key_header: str | None = None
    delete_retention_ms: int | None = None

    @classmethod
    def parse(cls, arguments: FieldTable) -> QueueArguments:
        """Type the arguments. A value its row's check refuses is left out (declare refused it
        already; restore and tests may hand in anything)."""
        fields: dict[str, Any] = {}
        for key, value in arguments.items():
            row = _BY_NAME.get(key)
            if row is None or row.field is None:
                continue
            if row.check is not None and row.check(value) is not None:
                continue
            fields[row.field] = row.parse(value) if row.parse is not None else value
        kind = STREAM if arguments.get("x-queue-type") == STREAM else CLASSIC
        return cls(table=arguments, kind=kind, **fields)

    @property
    def priority_levels(self) -> int:
        """``x-max-priority`` when it asks for priorities (above 0), else 0."""
        return self.max_priority if self.max_priority is not None else 0


# -- consumer arguments ---------------------------------------------------------------------------

# basic.consume arguments checked for every queue: (name, least value or None).
CONSUMER_ARGUMENTS: Final = (("x-priority", None), ("x-consumer-timeout", 0))


def check_consumer_arguments(queue: str, arguments: FieldTable) -> None:
    """Refuse ill-typed ``x-priority`` / ``x-consumer-timeout`` with RabbitMQ's 406."""
    for name, low in CONSUMER_ARGUMENTS:
        value = arguments.get(name)
        if value is not None and (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (low is not None and value < low)
        ):
            required = "an integer" if low is None else f"an integer >= {low}"
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{name}' for consumer on queue '{queue}': {required} is "
                f"required (got {value!r})",
            )


@attrs.frozen
class ConsumerArguments:
    """A consumer's ``x-priority`` (higher first, 0 by default) and ``x-consumer-timeout`` (ms;
    overrides the queue's and the broker's)."""

    priority: int = 0
    timeout_ms: int | None = None

    @classmethod
    def parse(cls, arguments: FieldTable) -> ConsumerArguments:
        priority = arguments.get("x-priority", 0)
        timeout = arguments.get("x-consumer-timeout")
        return cls(
            priority if isinstance(priority, int) else 0,
            timeout if isinstance(timeout, int) else None,
        )
