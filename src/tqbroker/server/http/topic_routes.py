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
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.pacing import Pacer
from ...broker.streams.service import ConsumerRecord, StreamService
from ...recordbatch import json_value
from . import inputs, topic_access
from .auth import broker_of, vhost_of
from .errors import RequestError

log = logging.getLogger(__name__)


async def declare_topic(request: Request) -> Response:
    """``PUT /topics/{topic}``: a partitioned stream, 201 if created, 200 if it was there."""
    vhost = await vhost_of(request)  # credentials before the body is read
    body = await inputs.json_object(request)
    count = inputs.integer(body.get("partitions", 1), "partitions")
    arguments = inputs.field_table(body.get("arguments", {}), "arguments")
    topic = request.path_params["topic"]
    await topic_access.check_declare(request, vhost, count)
    created = await StreamService(vhost).declare(topic, count, arguments)
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
    ``earliest`` or ``latest``) or a timestamp, and the offset to read next."""
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
    records = streams.read(
        topic,
        partition,
        offset=offset if isinstance(offset, int) else None,
        timestamp_ms=timestamp,
        limit=limit,
        max_bytes=max_bytes,
    )
    next_offset = records[-1].offset + 1 if records else streams.high_watermark(topic, partition)
    return JSONResponse(
        {
            "topic": topic,
            "partition": partition,
            "messages": [_record_json(r) for r in records],
            "next_offset": next_offset,
        }
    )


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
