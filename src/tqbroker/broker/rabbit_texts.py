"""RabbitMQ's wording of argument errors, which prints Erlang terms.

Responsibilities:
- ``amqp_type``: the AMQP field type RabbitMQ names for a decoded value (``signedint``,
  ``longstr``...); tqbroker's codec keeps values, not tags, so an integer is named by its
  range (pika sends ``I`` up to 32 bits, ``l`` beyond, as RabbitMQ decodes them);
- ``erlang_term``: a value as Erlang's ``~p`` prints it (``{value_negative,-1}``,
  ``invalid_overflow``, ``"expected integer, got longstr"``), for the ``invalid arg`` texts;
- ``equivalence_value``: a value as ``rabbit_misc:assert_args_equivalent`` shows it;
- the value checks of the queue-argument table (``broker/arguments.py``): each returns None
  when the value is fine, else RabbitMQ's reason as an Erlang term;
- ``parse_interval``: RabbitMQ's interval strings (``7D``, ``12h``; units Y M D h m s).

The texts were captured from RabbitMQ 3.10 (tests/compat/rabbitmq_replies.json).
"""

from __future__ import annotations

import datetime
import decimal
import logging
import re
from collections.abc import Callable
from typing import Final

from ..protocol.codec import FieldValue, Timestamp

log = logging.getLogger(__name__)

INTEGER_TYPES: Final = frozenset(
    {"byte", "short", "signedint", "long", "unsignedbyte", "unsignedshort", "unsignedint"}
)


def amqp_type(value: FieldValue) -> str:
    """RabbitMQ's name for the field type of ``value``."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, bytes | bytearray | memoryview):
        return "binary"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime | Timestamp):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    return "void"


class Atom(str):
    """An Erlang atom: printed bare by ``erlang_term``."""


def erlang_term(term: object) -> str:
    """``term`` as Erlang's ``~p`` prints it: tuples in braces, atoms bare, strings
    (charlists) in double quotes, integers as digits."""
    if isinstance(term, Atom):
        return str(term)
    if isinstance(term, tuple):
        return "{" + ",".join(erlang_term(item) for item in term) + "}"
    if isinstance(term, bool):
        return "true" if term else "false"
    if isinstance(term, str):
        return '"' + term.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(term)


def unacceptable_type(value: FieldValue) -> tuple[Atom, Atom]:
    """``{unacceptable_type,Type}``."""
    return Atom("unacceptable_type"), Atom(amqp_type(value))


def _type_class(value: FieldValue) -> str:
    kind = amqp_type(value)
    if kind in INTEGER_TYPES:
        return "int"
    return "float" if kind in ("float", "double") else kind


def same_class(a: FieldValue, b: FieldValue) -> bool:
    """Whether two present values have the same type class (any integer type matches
    another), as ``assert_args_equivalent`` compares them."""
    return _type_class(a) == _type_class(b)


def _plain(value: FieldValue) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def equivalence_value(value: FieldValue, *, typed: bool) -> str:
    """How ``rabbit_misc:val`` shows one side of an ``inequivalent arg`` text: ``none`` when
    absent, ``the value 'V' of type 'T'`` when ``typed``, else ``'V'``."""
    if value is None:
        return "none"
    if typed:
        return f"the value '{_plain(value)}' of type '{amqp_type(value)}'"
    return f"'{_plain(value)}'"


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


# -- the value checks: None when the value is fine, else RabbitMQ's reason (an Erlang term) -----

Check = Callable[[FieldValue], object | None]
_MAX_EXPIRY: Final = 2**32 - 1  # tqbroker's timers; RabbitMQ 3.10 lets larger TTLs through


def integer(value: FieldValue) -> object | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return None
    return f"expected integer, got {amqp_type(value)}"


def non_negative(value: FieldValue) -> object | None:
    problem = integer(value)
    if problem is None and value < 0:  # type: ignore[operator]
        return Atom("value_negative"), value
    return problem


def expires(value: FieldValue) -> object | None:
    problem = non_negative(value)
    return (Atom("value_zero"), value) if problem is None and value == 0 else problem


def message_ttl(value: FieldValue) -> object | None:
    problem = non_negative(value)
    if problem is None and value > _MAX_EXPIRY:  # type: ignore[operator]
        return Atom("value_too_large"), value
    return problem


def max_priority(value: FieldValue) -> object | None:
    problem = non_negative(value)
    if problem is None and value > 255:  # type: ignore[operator]
        return Atom("max_value_exceeded"), value
    return problem


def at_least(low: int) -> Check:
    """tqbroker's own lower bounds (RabbitMQ has none for these)."""

    def check(value: FieldValue) -> object | None:
        problem = integer(value)
        if problem is None and value < low:  # type: ignore[operator]
            return f"must be >= {low}"
        return problem

    return check


def member(reason: Callable[[str], object], *allowed: str) -> Check:
    """A string from ``allowed``: ``{unacceptable_type,T}`` for another type, else
    ``reason(value)``."""

    def check(value: FieldValue) -> object | None:
        if not isinstance(value, str):
            return unacceptable_type(value)
        return None if value in allowed else reason(value)

    return check


def string(value: FieldValue) -> object | None:
    return None if isinstance(value, str) else unacceptable_type(value)


def boolean(value: FieldValue) -> object | None:
    return None if isinstance(value, bool) else unacceptable_type(value)


def interval(value: FieldValue) -> object | None:
    if not isinstance(value, str):
        return unacceptable_type(value)
    return None if parse_interval(value) else Atom("invalid_max_age")


def as_interval(value: FieldValue) -> int | None:
    return parse_interval(value) if isinstance(value, str) else None
