"""The JSON routes of topics: declare, produce, consume and offsets (administration: listing,
describing, deleting, growing and consumer groups, is in ``topic_admin_routes.py``).

Responsibilities: each route reads its request (``inputs``), finds the vhost (``auth``) in the
same order as ever (so that the same bad request gets the same error), calls
the vhost's ``StreamService`` and answers JSON; a record's value travels as UTF-8 text when it is,
else as base64, and its header values as ``recordbatch.json_value`` renders them. A read is at most
``max_bytes`` of values (1 MiB by default, as Kafka's ``max.partition.fetch.bytes``).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
from collections.abc import Iterator
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.pacing import Pacer
from ...broker.read_budget import Piece, ReadBody
from ...broker.streams.service import (
    ConsumerRecord,
    NotFound,
    RecordRead,
    StreamService,
    TopicError,
)
from ...recordbatch import json_value
from . import inputs, topic_access
from .auth import broker_of, vhost_of
from .errors import RequestError
from .read_response import read_response

log = logging.getLogger(__name__)

# A piece of a JSON read (``_Messages``): at most this many records, about this many bytes of
# values; this much of the read budget is reserved before one is built (or the size of the one
# before, when that was more).
PIECE_RECORDS: Final = 1000
PIECE_VALUES: Final = 512 * 1024
PIECE_BYTES: Final = 1024 * 1024
# As ``JSONResponse`` renders.
_dumps = functools.partial(
    json.dumps, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
)


async def declare_topic(request: Request) -> Response:
    """``PUT /topics/{topic}``: a partitioned stream, 201 if created, 200 if it was there;
    ``arguments`` are its streams' (``x-max-age``...), ``configs`` Kafka's topic configs
    (``retention.ms``...: ``topic_config``); a name that is neither is 400."""
    vhost = await vhost_of(request)  # credentials before the body is read
    body = await inputs.json_object(request)
    count = inputs.integer(body.get("partitions", 1), "partitions")
    arguments = inputs.field_table(body.get("arguments", {}), "arguments")
    configs = inputs.topic_configs(body.get("configs", {}))
    topic = request.path_params["topic"]
    await topic_access.check_declare(request, vhost, count)
    created = await StreamService(vhost).declare(topic, count, arguments, configs)
    return JSONResponse(
        {"topic": topic, "partitions": count, "created": created},
        status_code=201 if created else 200,
    )


async def produce(request: Request) -> Response:
    """``POST /topics/{topic}/messages``: one record, or ``{"records": [...]}``; where each
    landed once durable."""
    vhost = await vhost_of(request)
    await topic_access.check_produce(request, vhost)
    body = await inputs.json_object(request)
    single = "records" not in body
    raw = [body] if single else body["records"]
    if not isinstance(raw, list) or not raw:
        raise RequestError(400, "'records' must be a non-empty list of records")
    config = broker_of(request).config
    records = []
    pacer = Pacer()  # checking 20,000 records takes ~100 ms: other clients go on meanwhile
    for r in raw:
        records.append(inputs.producer_record(r, config.max_message_size, config.frame_max))
        await pacer.step()
    landed = await StreamService(vhost).produce(request.path_params["topic"], records)
    assert landed is not None  # no producer id: never a duplicate
    results = [{"partition": p, "offset": o} for p, o in landed]
    return JSONResponse(results[0] if single else {"offsets": results}, status_code=201)


async def consume(request: Request) -> Response:
    """``GET /topics/{topic}/messages``: records of one partition from an offset (a number,
    ``earliest`` or ``latest``) or a timestamp, and the offset to read next; streamed a piece
    at a time under the broker's read budget (``_Messages``)."""
    query = request.query_params
    partition = inputs.integer(query.get("partition", "0"), "partition")
    limit = inputs.integer(query.get("limit", "100"), "limit")
    max_bytes = inputs.max_bytes(query)
    offset = inputs.start_offset(query.get("offset"))
    timestamp = inputs.timestamp(query["timestamp"]) if "timestamp" in query else None
    if offset is not None and timestamp is not None:
        raise RequestError(400, "give 'offset' or 'timestamp', not both")
    vhost = await vhost_of(request)
    await topic_access.check_read(request, vhost, partition)
    topic = request.path_params["topic"]
    streams = StreamService(vhost)
    if offset == "latest":
        offset = streams.high_watermark(topic, partition)
    read = await streams.record_read(
        topic,
        partition,
        offset=offset if isinstance(offset, int) else None,
        timestamp_ms=timestamp,
        limit=limit,
        max_bytes=max_bytes,
    )
    messages = _Messages(topic, partition, read)
    body = ReadBody(streams.read_budget, messages.pieces(), None)
    return await read_response(body, "application/json")


class _Messages:
    """The JSON of a read, a piece at a time, byte for byte what ``JSONResponse`` would render
    of ``{"topic", "partition", "messages": [...], "next_offset"}``: each piece is a run of
    the read (at most ``PIECE_RECORDS`` records, about ``PIECE_VALUES`` bytes of values), the
    first opens the object, the last closes it. A run that fails after the first piece (the
    partition failed or went away meanwhile) ends the answer there: its ``next_offset`` is
    where the next read starts, and meets the failure."""

    def __init__(self, topic: str, partition: int, read: RecordRead) -> None:
        self._read = read
        self._head = f'{{"topic":{_dumps(topic)},"partition":{partition},"messages":['.encode()
        self._opening = True  # no piece sent yet
        self._written = 0  # records sent
        self._estimate = PIECE_BYTES
        self._built = (0, False)  # the last piece built: its records, whether it ends
        self._finished = False

    def pieces(self) -> Iterator[Piece]:
        while not self._finished:
            yield Piece(self._estimate, self._build)
            count, ends = self._built
            self._read.advance()
            self._opening = False
            self._written += count
            self._finished = ends

    async def _build(self) -> bytes:
        read = self._read
        parts = [self._head] if self._opening else []
        try:
            if not self._opening and read.partition.closed:  # deleted (or failed) meanwhile
                raise NotFound(f"partition {read.partition_index} went away")
            records = read.take(PIECE_RECORDS, PIECE_VALUES)
            ends = read.run_ends_read
        except TopicError:
            if self._opening:
                raise  # before anything is sent: its status
            records, ends = [], True
        if records:
            listed = _dumps([_record_json(r) for r in records])
            parts.append(
                listed[1:-1].encode() if not self._written else b"," + listed[1:-1].encode()
            )
        if ends:
            if records:
                next_offset = records[-1].offset + 1
            elif read.last_offset is not None:
                next_offset = read.last_offset + 1
            else:
                next_offset = read.partition.high_watermark
            parts.append(b'],"next_offset":%d}' % next_offset)
        self._built = (len(records), ends)
        piece = b"".join(parts)
        self._estimate = max(PIECE_BYTES, len(piece))
        return piece


async def offsets(request: Request) -> Response:
    """``GET /topics/{topic}/offsets``: each partition's earliest and latest offsets (and with
    ``timestamp``, its first offset at or after that time)."""
    vhost = await vhost_of(request)
    await topic_access.check_read(request, vhost)
    topic = request.path_params["topic"]
    streams = StreamService(vhost)
    found: list[dict[str, int | str | None]] = [
        {
            "partition": o.partition,
            "queue": o.queue,
            "earliest": o.earliest,
            "latest": o.latest,
        }
        for o in streams.list_offsets(topic)
    ]
    if "timestamp" in request.query_params:
        timestamp = inputs.timestamp(request.query_params["timestamp"])
        for entry, offset in zip(
            found, streams.offsets_for_timestamp(topic, timestamp), strict=True
        ):
            entry["timestamp"] = offset
    return JSONResponse({"topic": topic, "partitions": found})


def _record_json(record: ConsumerRecord) -> dict[str, Any]:
    try:
        value, encoding = record.value.decode(), "utf-8"
    except UnicodeDecodeError:
        value, encoding = base64.b64encode(record.value).decode(), "base64"
    return {
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
        "key": json_value(record.key),  # a key AMQP stored undecodable is shown replaced
        "headers": json_value(record.headers),
        "value": value,
        "encoding": encoding,
    }
