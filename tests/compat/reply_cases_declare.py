"""Reply-text cases: queue.declare and exchange.declare (inequivalent redeclares, x-* argument
validation, quorum queues and streams; see ``reply_cases.py``)."""

from __future__ import annotations

from typing import Any

from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from .reply_harness import (
    CASES,
    Case,
    args_case,
    channel_case,
    declare_twice,
)

# -- 406 inequivalent -----------------------------------------------------------------------------

CASES["inequivalent_durable"] = declare_twice({}, {"durable": True}, "c.ineq1")
CASES["inequivalent_auto_delete"] = declare_twice({}, {"auto_delete": True}, "c.ineq2")
CASES["inequivalent_ttl_value"] = declare_twice(
    {"arguments": {"x-message-ttl": 1000}}, {"arguments": {"x-message-ttl": 2000}}, "c.ineq3"
)
CASES["inequivalent_ttl_missing"] = declare_twice(
    {"arguments": {"x-message-ttl": 1000}}, {}, "c.ineq4"
)
CASES["inequivalent_ttl_added"] = declare_twice(
    {}, {"arguments": {"x-message-ttl": 1000}}, "c.ineq5"
)
CASES["inequivalent_dlx_string"] = declare_twice(
    {"arguments": {"x-dead-letter-exchange": "a"}},
    {"arguments": {"x-dead-letter-exchange": "b"}},
    "c.ineq6",
)
CASES["inequivalent_queue_type"] = declare_twice(
    {"durable": True},
    {"durable": True, "arguments": {"x-queue-type": "quorum"}},
    "c.ineq7",
)


def _exchange_twice(first: dict[str, Any], second: dict[str, Any]) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.exchange_declare("c.ex", **first)
        ch.exchange_declare("c.ex", **second)

    return channel_case(body, exchanges=("c.ex",))


CASES["inequivalent_exchange_type"] = _exchange_twice(
    {"exchange_type": "direct"}, {"exchange_type": "fanout"}
)
CASES["inequivalent_exchange_durable"] = _exchange_twice({}, {"durable": True})
CASES["inequivalent_exchange_internal"] = _exchange_twice({}, {"internal": True})


# -- x-* argument validation (406) ----------------------------------------------------------------

_BAD_ARGUMENTS: dict[str, dict[str, Any]] = {
    "max_length_negative": {"x-max-length": -1},
    "max_length_string": {"x-max-length": "10"},
    "max_length_bytes_negative": {"x-max-length-bytes": -1},
    "message_ttl_string": {"x-message-ttl": "1000"},
    "message_ttl_negative": {"x-message-ttl": -1},
    "expires_zero": {"x-expires": 0},
    "expires_string": {"x-expires": "1000"},
    "max_priority_too_large": {"x-max-priority": 256},
    "max_priority_negative": {"x-max-priority": -1},
    "overflow_bad": {"x-overflow": "drop-tail"},
    "overflow_int": {"x-overflow": 1},
    "queue_mode_bad": {"x-queue-mode": "fast"},
    "queue_type_unknown": {"x-queue-type": "fancy"},
    "dead_letter_routing_key_alone": {"x-dead-letter-routing-key": "rk"},
    "dead_letter_exchange_int": {"x-dead-letter-exchange": 1},
    "single_active_consumer_int": {"x-single-active-consumer": 1},
    "delivery_limit_string": {"x-delivery-limit": "5"},
}
for _name, _arguments in _BAD_ARGUMENTS.items():
    CASES[f"arg_{_name}"] = args_case(f"c.arg.{_name}", _arguments)

# -- queue types ---------------------------------------------------------------------------------

_QUORUM = {"x-queue-type": "quorum"}
CASES["quorum_non_durable"] = args_case("c.qq1", _QUORUM)
CASES["quorum_exclusive"] = args_case("c.qq2", _QUORUM, durable=True, exclusive=True)
CASES["quorum_auto_delete"] = args_case("c.qq3", _QUORUM, durable=True, auto_delete=True)
CASES["quorum_max_priority"] = args_case("c.qq4", {**_QUORUM, "x-max-priority": 5}, durable=True)
CASES["quorum_queue_mode"] = args_case("c.qq5", {**_QUORUM, "x-queue-mode": "lazy"}, durable=True)
CASES["quorum_overflow_reject_publish_dlx"] = args_case(
    "c.qq6", {**_QUORUM, "x-overflow": "reject-publish-dlx"}, durable=True
)
CASES["quorum_message_ttl"] = args_case("c.qq7", {**_QUORUM, "x-message-ttl": 1000}, durable=True)
CASES["quorum_delivery_limit"] = args_case(
    "c.qq8", {**_QUORUM, "x-delivery-limit": 3}, durable=True
)
CASES["quorum_dead_letter_strategy"] = args_case(
    "c.qq9",
    {
        **_QUORUM,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    },
    durable=True,
)
CASES["quorum_dead_letter_strategy_bad"] = args_case(
    "c.qq10", {**_QUORUM, "x-dead-letter-strategy": "exactly-once"}, durable=True
)
CASES["quorum_delivery_limit_negative"] = args_case(
    "c.qq11", {**_QUORUM, "x-delivery-limit": -1}, durable=True
)
CASES["quorum_redeclare_as_classic"] = declare_twice(
    {"durable": True, "arguments": _QUORUM},
    {"durable": True, "arguments": {"x-queue-type": "classic"}},
    "c.qq13",
)
CASES["quorum_redeclare_without_type"] = declare_twice(
    {"durable": True, "arguments": _QUORUM}, {"durable": True}, "c.qq14"
)
CASES["classic_redeclare_with_type"] = declare_twice(
    {"durable": True}, {"durable": True, "arguments": {"x-queue-type": "classic"}}, "c.qq16"
)
CASES["classic_typed_redeclare_without"] = declare_twice(
    {"durable": True, "arguments": {"x-queue-type": "classic"}}, {"durable": True}, "c.qq17"
)
CASES["classic_typed_redeclare_as_quorum"] = declare_twice(
    {"durable": True, "arguments": {"x-queue-type": "classic"}},
    {"durable": True, "arguments": _QUORUM},
    "c.qq18",
)
CASES["classic_max_age"] = args_case("c.qq19", {"x-max-age": "1D"})
CASES["classic_segment_size"] = args_case("c.qq20", {"x-stream-max-segment-size-bytes": 2_000_000})
CASES["classic_dead_letter_strategy"] = args_case(
    "c.qq21", {"x-dead-letter-strategy": "at-least-once"}
)
CASES["quorum_leader_locator"] = args_case(
    "c.qq22", {**_QUORUM, "x-queue-leader-locator": "client-local"}, durable=True
)
CASES["quorum_passive"] = declare_twice(
    {"durable": True, "arguments": _QUORUM}, {"passive": True}, "c.qq15"
)
CASES["stream_non_durable"] = args_case("c.sq1", {"x-queue-type": "stream"})
CASES["stream_exclusive"] = args_case(
    "c.sq2", {"x-queue-type": "stream"}, durable=True, exclusive=True
)
CASES["stream_max_age_bad"] = args_case(
    "c.sq4", {"x-queue-type": "stream", "x-max-age": "1x"}, durable=True
)
CASES["stream_max_priority"] = args_case(
    "c.sq3", {"x-queue-type": "stream", "x-max-priority": 5}, durable=True
)
