"""Queue and consumer ``x-*`` arguments: one table, checked and parsed once.

Responsibilities:
- ``QUEUE_ARGUMENTS``: one row per queue argument RabbitMQ (or tqbroker) knows: its check, the
  queue kinds that accept it, whether a redeclare compares it, and the ``QueueArguments`` field
  it fills; arguments not in the table are accepted and ignored, as RabbitMQ does;
- ``check_declaration``: RabbitMQ's 406 answers for ill-typed or out-of-range arguments, an
  unknown ``x-queue-type``, or a property or an argument the kind refuses (classic, quorum,
  stream: a quorum queue is a durable classic queue with quorum rules, see docs);
- ``check_equivalent``: the 406 for a redeclare (of a queue or an exchange) whose properties or
  compared arguments differ;
- ``QueueArguments``: the typed arguments, built once at declare (or restore) time; queues read
  it, nobody parses ``x-*`` arguments again;
- ``check_consumer_arguments`` / ``ConsumerArguments``: the same for ``basic.consume``'s
  ``x-priority`` and ``x-consumer-timeout``;
- the value checks and RabbitMQ's Erlang-term wording live in ``broker/rabbit_texts.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from ..protocol.codec import FieldTable, FieldValue, encode_table
from ..protocol.errors import AMQPError, ReplyCode
from .rabbit_texts import (
    Atom,
    Check,
    amqp_type,
    as_interval,
    at_least,
    boolean,
    equivalence_value,
    erlang_term,
    expires,
    integer,
    interval,
    max_priority,
    member,
    message_ttl,
    non_negative,
    same_class,
    string,
)
from .rabbit_texts import (
    parse_interval as parse_interval,  # re-exported: streams use it
)

log = logging.getLogger(__name__)

OVERFLOWS: Final = ("drop-head", "reject-publish", "reject-publish-dlx")
# Kafka's compression.type values (``TopicConfig.java``, ``BrokerCompressionType``).
COMPRESSION_TYPES: Final = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")
# -- the table ------------------------------------------------------------------------------------

CLASSIC: Final = "classic"
QUORUM: Final = "quorum"
STREAM: Final = "stream"
KINDS: Final = (CLASSIC, QUORUM, STREAM)
# RabbitMQ's module names, in its "of queue type" texts.
_MODULES: Final = {
    CLASSIC: "rabbit_classic_queue",
    QUORUM: "rabbit_quorum_queue",
    STREAM: "rabbit_stream_queue",
}
_ANY: Final = frozenset(KINDS)
_CLASSIC_ONLY: Final = frozenset({CLASSIC})
_NOT_STREAM: Final = frozenset({CLASSIC, QUORUM})
_NOT_QUORUM: Final = frozenset({CLASSIC, STREAM})
_STREAM_ONLY: Final = frozenset({STREAM})
# A quorum queue's x-delivery-limit when it names none (RabbitMQ 4.0's default).
QUORUM_DELIVERY_LIMIT: Final = 20


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


def _unsupported(what: str) -> Callable[[str], object]:
    return lambda value: f"unsupported {what} '{value}'"


# The queue arguments tqbroker knows, one row each, in the order RabbitMQ checks them
# (RabbitMQ 4's ``rabbit_amqqueue:declare_args``; tqbroker's own after):
#   Argument(name, check, kinds accepting it, compared on redeclare, QueueArguments field[, parse])
# The kinds follow RabbitMQ 4's ``capabilities()`` of each queue type, plus tqbroker's own
# extensions (x-delivery-limit on classic queues; the x-stream-* compaction arguments).
QUEUE_ARGUMENTS: Final = (
    Argument("x-expires", expires, _NOT_STREAM, True, "expires_ms"),
    Argument("x-message-ttl", message_ttl, _NOT_STREAM, True, "message_ttl"),
    Argument("x-dead-letter-exchange", string, _NOT_STREAM, True, "dead_letter_exchange"),
    # Needs x-dead-letter-exchange too: checked in ``check_queue_arguments``.
    Argument("x-dead-letter-routing-key", string, _NOT_STREAM, True, "dead_letter_routing_key"),
    Argument(
        "x-dead-letter-strategy",
        member(lambda _: Atom("invalid_dlx_strategy"), "at-most-once", "at-least-once"),
        frozenset({QUORUM}),
        True,
    ),
    Argument("x-max-length", non_negative, _NOT_STREAM, True, "max_length"),
    # On a stream: retention (whole segments).
    Argument("x-max-length-bytes", non_negative, _ANY, True, "max_length_bytes"),
    Argument("x-max-priority", max_priority, _CLASSIC_ONLY, True, "max_priority"),
    Argument(
        "x-overflow",
        member(lambda _: Atom("invalid_overflow"), *OVERFLOWS),
        _NOT_STREAM,
        True,
        "overflow",
    ),
    Argument(
        "x-queue-mode", member(_unsupported("queue mode"), "default", "lazy"), _NOT_QUORUM, True
    ),
    Argument("x-single-active-consumer", boolean, _NOT_STREAM, True, "single_active_consumer"),
    Argument("x-queue-type", member(_unsupported("queue type"), *KINDS), _ANY, True),
    Argument("x-max-age", interval, _STREAM_ONLY, True, "max_age_ms", as_interval),
    # A segment keeps three files open: tiny segments would let one client exhaust the
    # broker's file descriptors, so 1 MiB is the least (RabbitMQ's default is 500 MB).
    Argument(
        "x-stream-max-segment-size-bytes",
        at_least(1024 * 1024),
        _STREAM_ONLY,
        True,
        "segment_bytes",
    ),
    # Negative: no limit (RabbitMQ 4); a quorum queue's default is QUORUM_DELIVERY_LIMIT.
    Argument("x-delivery-limit", integer, _NOT_STREAM, True, "delivery_limit"),
    Argument("x-consumer-timeout", non_negative, _ANY, False, "consumer_timeout_ms"),
    # Compaction (Kafka's cleanup.policy=compact): the latest record per key is kept.
    Argument(
        "x-stream-cleanup-policy",
        member(
            lambda _: "must be one of delete, compact, compact,delete, delete,compact",
            "delete",
            "compact",
            "compact,delete",
            "delete,compact",
        ),
        _NOT_QUORUM,
        True,
        "cleanup_policy",
    ),
    Argument("x-stream-compaction-key-header", string, _NOT_QUORUM, True, "compaction_key_header"),
    Argument(
        "x-stream-delete-retention",
        interval,
        _NOT_QUORUM,
        False,
        "delete_retention_ms",
        as_interval,
    ),
    # Kafka's max.message.bytes and compression.type of a topic's streams (topic_config.py):
    # the largest record a Kafka producer may write, and the codec batches are stored with
    # (stored and described; compressing is not done yet).
    Argument("x-stream-max-message-bytes", non_negative, _STREAM_ONLY, True, "max_message_bytes"),
    Argument(
        "x-stream-compression-type",
        member(
            lambda _: "must be one of " + ", ".join(COMPRESSION_TYPES),
            *COMPRESSION_TYPES,
        ),
        _STREAM_ONLY,
        True,
        "compression_type",
    ),
    # Replication in a cluster (Kafka's replication.factor and min.insync.replicas): how many
    # nodes hold the stream, and how many must have a publish before it is confirmed.
    Argument("x-stream-replicas", at_least(1), _STREAM_ONLY, True, "replicas"),
    Argument("x-stream-min-insync-replicas", at_least(1), _STREAM_ONLY, True, "min_isr"),
    # Checked when the backend is chosen, against the installed backends (new queues only).
    Argument("x-queue-backend", None, _NOT_STREAM, True, "backend"),
)

_BY_NAME: Final = {row.name: row for row in QUEUE_ARGUMENTS}
_COMPARED: Final = frozenset(row.name for row in QUEUE_ARGUMENTS if row.compared)
# The arguments a stream queue takes (the topic routes refuse others rather than ignore them).
STREAM_ARGUMENT_NAMES: Final = frozenset(row.name for row in QUEUE_ARGUMENTS if STREAM in row.kinds)


def _where(name: str, vhost: str) -> str:
    return f"for queue '{name}' in vhost '{vhost}'"


def check_queue_arguments(name: str, vhost: str, arguments: FieldTable) -> None:
    """Refuse ill-typed or out-of-range ``x-`` arguments with RabbitMQ's 406, in its order:
    the dead-letter exchange's type (``rabbit_channel``), then the table's rows."""
    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, str):
        raise AMQPError(
            ReplyCode.PRECONDITION_FAILED,
            f"invalid type '{amqp_type(dlx)}' for arg 'x-dead-letter-exchange' in queue "
            f"'{name}' in vhost '{vhost}'",
        )
    for row in QUEUE_ARGUMENTS:
        if row.name not in arguments or row.check is None:
            continue
        value = arguments[row.name]
        problem = row.check(value)
        if (
            problem is None
            and row.name == "x-dead-letter-routing-key"
            and "x-dead-letter-exchange" not in arguments
        ):
            problem = Atom("routing_key_but_no_dlx_defined")
        if problem is not None:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{row.name}' {_where(name, vhost)}: {erlang_term(problem)}",
            )


def queue_kind(arguments: FieldTable) -> str:
    """The kind ``x-queue-type`` asks for (classic by default; checked by its row)."""
    kind = arguments.get("x-queue-type", CLASSIC)
    return kind if isinstance(kind, str) and kind in KINDS else CLASSIC


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
    """RabbitMQ's rules for the kind: no queue takes an argument its kind does not support
    (RabbitMQ 4's ``capabilities()``, in the client's order), then a quorum queue or a stream
    is durable, not exclusive or auto-delete (checked in that order)."""
    for key in arguments:
        row = _BY_NAME.get(key)
        if row is not None and kind not in row.kinds:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{key}' {_where(name, vhost)} of queue type {_MODULES[kind]}",
            )
    if kind in (QUORUM, STREAM):
        for problem, present in (
            ("auto-delete", auto_delete),
            ("exclusive-owner", exclusive),
            ("non-durable", not durable),
        ):
            if present:
                raise AMQPError(
                    ReplyCode.PRECONDITION_FAILED,
                    f"invalid property '{problem}' {_where(name, vhost)}",
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
    """Check a ``queue.declare`` in RabbitMQ's order (arguments, then what the kind refuses);
    return the queue's kind."""
    check_queue_arguments(name, vhost, arguments)
    kind = queue_kind(arguments)
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
    """RabbitMQ's ``assert_args_equivalent``: flags first, then each argument; two values of
    the same type class are shown bare, anything else with its type."""
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
        if key == "x-queue-type" and got in (None, CLASSIC) and now_value in (None, CLASSIC):
            continue  # no type is classic (RabbitMQ keeps an explicit one, and compares it)
        if encode_table({key: got}) != encode_table({key: now_value}):
            typed = got is None or now_value is None or not same_class(got, now_value)
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"inequivalent arg '{key}' {what}: received "
                f"{equivalence_value(got, typed=typed)} but current is "
                f"{equivalence_value(now_value, typed=typed)}",
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
    kind: str = CLASSIC  # classic, quorum (a durable classic queue) or stream
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
    max_message_bytes: int | None = None  # a Kafka producer's largest record (None: broker's)
    # x-stream-compression-type: how the stream's batches are stored (None: as produced)
    compression_type: str | None = None
    replicas: int | None = None  # a cluster's stream replicas (None: min(3, nodes))
    min_isr: int | None = None  # and in-sync replicas (None: min(2, replicas))

    @classmethod
    def parse(cls, arguments: FieldTable) -> QueueArguments:
        """Type the arguments. A value its row's check refuses is left out (declare refused it
        already; restore and tests may hand in anything)."""
        if not arguments:  # most declares: one shared instance, nothing to type
            return NO_ARGUMENTS
        fields: dict[str, Any] = {}
        for key, value in arguments.items():
            row = _BY_NAME.get(key)
            if row is None or row.field is None:
                continue
            if row.check is not None and row.check(value) is not None:
                continue
            fields[row.field] = row.parse(value) if row.parse is not None else value
        kind = queue_kind(arguments)
        limit = fields.get("delivery_limit", QUORUM_DELIVERY_LIMIT if kind == QUORUM else None)
        fields["delivery_limit"] = limit if limit is None or limit >= 0 else None
        return cls(table=arguments, kind=kind, **fields)

    @property
    def priority_levels(self) -> int:
        """``x-max-priority`` when it asks for priorities (above 0), else 0."""
        return self.max_priority if self.max_priority is not None else 0


NO_ARGUMENTS: Final = QueueArguments()  # a queue declared without arguments (shared)


# -- consumer arguments ---------------------------------------------------------------------------

# basic.consume arguments checked for every queue, as RabbitMQ's ``consume_args``.
CONSUMER_ARGUMENTS: Final = (("x-priority", integer), ("x-consumer-timeout", non_negative))


def check_consumer_arguments(queue: str, vhost: str, arguments: FieldTable) -> None:
    """Refuse ill-typed ``x-priority`` / ``x-consumer-timeout`` with RabbitMQ's 406."""
    for name, check in CONSUMER_ARGUMENTS:
        value = arguments.get(name)
        problem = check(value) if value is not None else None
        if problem is not None:
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"invalid arg '{name}' {_where(queue, vhost)}: {erlang_term(problem)}",
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
