"""Reply-text cases: consuming from streams (prefetch, acknowledgement mode, offsets) and what a
stream refuses (see ``reply_cases.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pika.adapters.blocking_connection import BlockingChannel, BlockingConnection

from .reply_harness import CASES, Case, args_case, channel_case

STREAM = {"x-queue-type": "stream"}


def _on_stream(queue: str, operation: Callable[[BlockingChannel], Any]) -> Case:
    def body(_conn: BlockingConnection, ch: BlockingChannel) -> None:
        ch.queue_declare(queue, durable=True, arguments=STREAM)
        operation(ch)

    return channel_case(body, queues=(queue,))


def _consume(
    queue: str, *, qos: int = 10, auto_ack: bool = False, arguments: dict[str, Any] | None = None
) -> Case:
    def operation(ch: BlockingChannel) -> None:
        if qos:
            ch.basic_qos(prefetch_count=qos)
        ch.basic_consume(queue, lambda *_: None, auto_ack=auto_ack, arguments=arguments or {})

    return _on_stream(queue, operation)


CASES["stream_consume_without_prefetch"] = _consume("c.st1", qos=0)
CASES["stream_consume_auto_ack"] = _consume("c.st2", auto_ack=True)
CASES["stream_offset_bad"] = _consume("c.st3", arguments={"x-stream-offset": "bogus"})
CASES["stream_offset_ok"] = _consume("c.st4", arguments={"x-stream-offset": "first"})
CASES["stream_get"] = _on_stream("c.st5", lambda ch: ch.basic_get("c.st5"))
CASES["stream_purge"] = _on_stream("c.st6", lambda ch: ch.queue_purge("c.st6"))
CASES["stream_max_length_bytes_negative"] = args_case(
    "c.st7", {**STREAM, "x-max-length-bytes": -1}, durable=True
)
CASES["stream_segment_size_small"] = args_case(
    "c.st8", {**STREAM, "x-stream-max-segment-size-bytes": 1000}, durable=True
)
CASES["stream_redeclare_as_classic"] = _on_stream(
    "c.st9", lambda ch: ch.queue_declare("c.st9", durable=True)
)
