"""The queue-argument table (``broker/arguments.py``): every row fills a real field, typed
values come out typed, refused values stay out, and the kind rules follow the rows. The reply
texts on the wire are checked in tests/interop/test_bad_input.py and test_queue_features.py."""

from __future__ import annotations

import attrs
import pytest

from tqbroker.broker.arguments import (
    QUEUE_ARGUMENTS,
    ConsumerArguments,
    QueueArguments,
    check_consumer_arguments,
    check_declaration,
    compared_arguments,
)
from tqbroker.protocol.codec import FieldTable
from tqbroker.protocol.errors import AMQPError, ReplyCode


def test_every_row_names_a_queue_arguments_field() -> None:
    fields = {field.name for field in attrs.fields(QueueArguments)}
    for row in QUEUE_ARGUMENTS:
        assert row.field is None or row.field in fields, row.name
    assert len({row.name for row in QUEUE_ARGUMENTS}) == len(QUEUE_ARGUMENTS)


def test_parse_types_the_arguments_once() -> None:
    table: FieldTable = {
        "x-expires": 1000,
        "x-max-length": 5,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
        "x-single-active-consumer": True,
        "x-max-age": "1h",
        "x-stream-delete-retention": "2m",
        "x-max-priority": 3,
        "x-unknown": "ignored",
    }
    parsed = QueueArguments.parse(table)
    assert parsed.table is table
    assert parsed.kind == "classic"
    assert (parsed.expires_ms, parsed.max_length, parsed.overflow) == (1000, 5, "reject-publish")
    assert parsed.dead_letter_exchange == "dlx"
    assert parsed.single_active_consumer is True
    assert parsed.max_age_ms == 3_600_000
    assert parsed.delete_retention_ms == 120_000
    assert parsed.priority_levels == 3
    assert QueueArguments.parse({"x-queue-type": "stream"}).kind == "stream"
    assert QueueArguments().overflow == "drop-head"


@pytest.mark.parametrize(
    "table",
    [{"x-max-length-bytes": True}, {"x-max-length-bytes": -1}, {"x-max-age": "soon"}],
)
def test_parse_leaves_out_what_the_check_refuses(table: dict[str, object]) -> None:
    parsed = QueueArguments.parse(table)  # type: ignore[arg-type]
    assert parsed.max_length_bytes is None
    assert parsed.max_age_ms is None


# A valid value for each argument a stream refuses for being there.
NOT_STREAM_EXAMPLES: dict[str, object] = {
    "x-expires": 1,
    "x-message-ttl": 1,
    "x-max-length": 1,
    "x-max-priority": 1,
    "x-delivery-limit": 1,
    "x-overflow": "drop-head",
    "x-dead-letter-exchange": "dlx",
    "x-dead-letter-routing-key": "k",
    "x-single-active-consumer": True,
    "x-queue-backend": "memory",
}


def test_streams_refuse_what_rabbitmq_streams_refuse() -> None:
    stream = {"durable": True, "exclusive": False, "auto_delete": False}
    assert check_declaration("s", "/", **stream, arguments={"x-queue-type": "stream"}) == "stream"
    not_stream = {row.name for row in QUEUE_ARGUMENTS if "stream" not in row.kinds}
    assert not_stream == set(NOT_STREAM_EXAMPLES) | {"x-dead-letter-strategy"}
    for name, value in NOT_STREAM_EXAMPLES.items():
        arguments = {name: value, "x-dead-letter-exchange": "dlx", "x-queue-type": "stream"}
        with pytest.raises(AMQPError) as caught:
            check_declaration("s", "/", **stream, arguments=arguments)  # type: ignore[arg-type]
        assert caught.value.code == ReplyCode.PRECONDITION_FAILED
        assert caught.value.text == (
            f"invalid arg '{name}' for queue 's' in vhost '/' of queue type rabbit_stream_queue"
        )


def test_compared_arguments_follow_the_rows() -> None:
    table: FieldTable = {
        "x-message-ttl": 1,
        "x-consumer-timeout": 5,
        "x-stream-delete-retention": "1h",
    }
    assert compared_arguments(table) == {"x-message-ttl": 1}


def test_consumer_arguments() -> None:
    assert ConsumerArguments.parse({"x-priority": 4}) == ConsumerArguments(4, None)
    assert ConsumerArguments.parse({"x-consumer-timeout": 10}).timeout_ms == 10
    with pytest.raises(AMQPError) as caught:
        check_consumer_arguments("q", "/", {"x-consumer-timeout": -1})
    assert caught.value.text == (
        "invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/': {value_negative,-1}"
    )
