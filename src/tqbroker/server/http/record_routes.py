"""The columnar bulk routes of topics, for the Spark data source: records in
``recordbatch.py``'s binary formats rather than JSON.

Responsibilities:
- ``GET /topics/{topic}/partitions/{p}/records``: a ``ReadBatch`` of one partition from an
  offset up to an optional end, at most ``max_bytes`` of keys and values, headers on request
  (built whole, within the broker's read budget), or the log's frames (streamed a chunk at a
  time under it: ``read_response.py``);
- ``POST /topics/{topic}/records``: a ``WriteBatch`` produced in one go, each record checked
  as a JSON produce checks it (value size 413, key and header names of at most 255 bytes,
  headers a JSON object); idempotent with an ``x-producer-id`` and the
  ``x-producer-sequence`` of its first record.
"""

from __future__ import annotations

import logging

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...broker.pacing import Pacer, release
from ...broker.streams.service import ProducerRecord, StreamService
from ...recordbatch import WriteBatch, decode_write
from . import inputs, jsonbody, topic_access
from .auth import broker_of, vhost_of
from .errors import RequestError
from .read_response import read_response

log = logging.getLogger(__name__)

RECORDS_MEDIA_TYPE = "application/x-tqbroker-records"
FRAMES_MEDIA_TYPE = "application/x-tqbroker-frames"
# Decoding (and checking) a body takes ~0.2 us a record: bodies over 1 MiB (>= 16 bytes a
# record) are decoded in a worker
# thread, so that a 500k-record body does not stop the broker for ~100 ms.
DECODE_IN_THREAD_BYTES = 1 << 20


async def read_records(request: Request) -> Response:
    """The bulk read: columns (``recordbatch.ReadBatch``, ``TQR1``), or with
    ``format=frames`` the log's frames as they lie on disk (``TQF1``)."""
    query = request.query_params
    vhost = await vhost_of(request)
    await topic_access.check_read(request, vhost, request.path_params["partition"])
    topic = request.path_params["topic"]
    index = inputs.integer(request.path_params["partition"], "partition")
    offset = inputs.integer(query.get("offset", "0"), "offset")
    end = inputs.integer(query["end"], "end") if "end" in query else None
    headers = query.get("headers", "false") == "true"
    kind = query.get("format", "columns")
    if kind == "frames":
        if headers:
            raise RequestError(400, "frames carry the headers: drop headers=true")
        frames = await StreamService(vhost).fetch_body(
            topic, index, offset=offset, end=end, max_bytes=inputs.max_bytes(query)
        )
        return await read_response(frames, FRAMES_MEDIA_TYPE)
    if kind != "columns":
        raise RequestError(400, f"format must be columns or frames (got {kind})")
    columns = await StreamService(vhost).columns_body(
        topic,
        index,
        offset=offset,
        end=end,
        max_bytes=inputs.max_bytes(query),
        headers=headers,
    )
    return await read_response(columns, RECORDS_MEDIA_TYPE)


async def write_records(request: Request) -> Response:
    """The columnar bulk write (``recordbatch.WriteBatch``), idempotent with a producer
    id and the sequence of its first record."""
    vhost = await vhost_of(request)
    await topic_access.check_produce(request, vhost)
    producer = _producer(request)
    body = await inputs.read_body(request)
    try:
        if len(body) < DECODE_IN_THREAD_BYTES:
            batch = decode_write(body)
        else:  # pure work on the body alone; the event loop keeps running meanwhile
            batch = await trio.to_thread.run_sync(decode_write, body)
    except ValueError as exc:
        raise RequestError(400, f"not a valid TQW1 body: {exc}") from None
    records: list[ProducerRecord] = []
    try:
        config = broker_of(request).config
        await _records(batch, config.max_message_size, config.frame_max, records)
        topic = request.path_params["topic"]
        landed = await StreamService(vhost).produce(topic, records, producer=producer)
    finally:
        total = len(records)
        await release(records)
    if landed is None:
        return JSONResponse({"duplicate": True, "count": 0, "skipped": total})
    count = len(landed)
    await release(landed)
    return JSONResponse({"count": count, "skipped": total - count}, status_code=201)


def _producer(request: Request) -> tuple[str, int] | None:
    """The idempotent producer's id and the sequence of the write's first record, if any."""
    if "x-producer-id" not in request.headers:
        return None
    sequence = inputs.integer(request.headers.get("x-producer-sequence"), "x-producer-sequence")
    return request.headers["x-producer-id"], sequence


async def _records(
    batch: WriteBatch, limit: int, frame_max: int, records: list[ProducerRecord]
) -> None:
    """Append the batch's records to ``records``, each checked (``record_at``), giving way to
    other clients now and then."""
    pacer = Pacer()
    for i in range(len(batch)):
        records.append(record_at(batch, i, limit, frame_max))
        await pacer.step()


def record_at(batch: WriteBatch, i: int, limit: int, frame_max: int = 0) -> ProducerRecord:
    """Record ``i`` of the batch, checked: a value of at most ``limit`` bytes (413), a key of
    UTF-8 within 255 bytes and headers that are a JSON object of field-table values that fit
    in an AMQP frame of ``frame_max`` bytes (400)."""
    value = batch.values[i]
    if len(value) > limit:
        raise RequestError(413, f"a value is limited to {limit} bytes (got {len(value)})")
    raw_headers = batch.headers[i]
    try:
        key = batch.keys[i].decode()
        headers = jsonbody.parse_json(raw_headers, f"record {i}'s headers") if raw_headers else {}
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"record {i}: {exc}") from None
    if len(batch.keys[i]) > 255:
        raise RequestError(400, f"record {i}: a key is limited to 255 bytes")
    partition = batch.partitions[i]
    table = inputs.field_table(headers, "headers")
    inputs.headers_fit(table, frame_max)
    return ProducerRecord(value, key, table, partition if partition >= 0 else None)
