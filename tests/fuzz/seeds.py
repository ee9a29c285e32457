"""The seed inputs of each fuzz target: small valid (and a few nearly valid) inputs that show the
fuzzer each format. ``python -m tests.fuzz.seeds`` writes them to ``tests/fuzz/corpus/``
(checked in); the test suite replays them.
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
import tempfile
from array import array
from collections.abc import Iterator
from pathlib import Path

from tqbroker.backends.log.format import encode_batch, encode_record
from tqbroker.backends.log.segment import Segment, segment_name
from tqbroker.model import Message
from tqbroker.protocol.codec import FieldTable, Long, encode_table
from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_HEAD,
    FRAME_HEADER,
    HEARTBEAT_FRAME,
    encode_method,
)
from tqbroker.protocol.methods import (
    BasicAck,
    BasicConsume,
    BasicProperties,
    BasicPublish,
    BasicQos,
    ChannelClose,
    ChannelCloseOk,
    ConfirmSelect,
    ConnectionClose,
    ConnectionStartOk,
    QueueDeclare,
)
from tqbroker.recordbatch import (
    BinaryColumn,
    ReadBatch,
    WriteBatch,
    encode_read,
    encode_write,
)
from tqbroker.storage_env import StorageEnv
from tqbroker.storage_env.filecache import Directory

from .amqp_targets import HANDSHAKE
from .http_targets import json_body

HERE = Path(__file__).resolve().parent
TABLE: FieldTable = {
    "bool": True,
    "int": 7,
    "long": Long(-(2**40)),
    "float": 1.5,
    "decimal": decimal.Decimal("3.14"),
    "text": "héllo",
    "bytes": b"\x00\xff",
    "time": datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),
    "table": {"nested": [1, "two", None]},
    "void": None,
}
PROPERTIES = BasicProperties(
    content_type="text/plain",
    headers={"x-match": "all", "n": 1},
    delivery_mode=2,
    priority=3,
    correlation_id="c1",
    reply_to="amq.rabbitmq.reply-to",
    expiration="60000",
    message_id="m1",
    timestamp=1_700_000_000,
    type="t",
    user_id="guest",
    app_id="a",
)


def content(channel: int, properties: bytes, body: bytes, frame: int = 0) -> bytes:
    """A content header frame and body frames of at most ``frame`` bytes (0: one)."""
    head = struct.pack(">HHQ", 60, 0, len(body)) + properties
    out = FRAME_HEAD.pack(FRAME_HEADER, channel, len(head)) + head + b"\xce"
    step = frame or max(len(body), 1)
    for start in range(0, len(body), step):
        part = body[start : start + step]
        out += FRAME_HEAD.pack(FRAME_BODY, channel, len(part)) + part + b"\xce"
    return out


def publish(channel: int, properties: bytes, body: bytes, frame: int = 0) -> bytes:
    return encode_method(channel, BasicPublish(0, "", "q", False, False)) + content(
        channel, properties, body, frame
    )


def frames() -> Iterator[bytes]:
    plain = BasicProperties(delivery_mode=2).encode()
    # flags: 1 = after the handshake, 2 = also a byte at a time; 2 chunk sizes
    yield b"\x00\x02\x07\x40" + HANDSHAKE
    yield b"\x01\x02\x03\x10" + publish(1, plain, b"hello") + HEARTBEAT_FRAME
    yield (
        b"\x01\x01\x20"
        + publish(1, PROPERTIES.encode(), b"x" * 300, 100)
        + publish(2, b"\x00\x00", b"")
    )
    yield (
        b"\x01\x00"
        + b"".join(
            encode_method(1, m)
            for m in (ConfirmSelect(False), BasicQos(0, 10, False), BasicAck(1, False))
        )
        + publish(1, plain, b"y" * 3000, 1000)
    )  # over max_message_size: 406
    yield (
        b"\x01\x00"
        + encode_method(1, ChannelClose(200, "bye", 0, 0))
        + encode_method(1, ChannelCloseOk())
        + encode_method(0, ConnectionClose(200, "bye", 0, 0))
    )
    yield b"\x01\x00" + encode_method(1, BasicPublish(0, "", "q", False, False)) + b"\x01\x00"
    # A frame over the negotiated frame_max (4096), a byte at a time: refused from its head.
    big = QueueDeclare(0, "q", False, True, False, False, False, {"x": "y" * 5000})
    yield b"\x03\x00" + encode_method(1, big)


def methods() -> Iterator[bytes]:
    yield QueueDeclare(0, "q", False, True, False, False, False, TABLE).encode()
    yield BasicPublish(0, "amq.direct", "key", True, False).encode()
    yield BasicConsume(0, "q", "ctag", False, False, False, False, {"x-priority": 1}).encode()
    yield ConnectionStartOk({"product": "fuzz"}, "PLAIN", "\0u\0p", "en_US").encode()


def tables() -> Iterator[bytes]:
    yield encode_table(TABLE)
    yield encode_table({"i": 1}).replace(b"I", b"i")  # the unsigned 32-bit letter


def properties() -> Iterator[bytes]:
    yield PROPERTIES.encode()
    yield BasicProperties(delivery_mode=1, message_id="m").encode()
    yield BasicProperties(content_type="a", content_encoding="b", headers=TABLE).encode()


def sasl() -> Iterator[bytes]:
    yield b"\x00" + b"\0guest\0guest"
    yield b"\x01" + encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:]


def log() -> Iterator[bytes]:
    with tempfile.TemporaryDirectory() as name:
        directory = Path(name)
        segment = Segment(StorageEnv.default().files, Directory(directory), 1000, 64)
        properties = BasicProperties(delivery_mode=2).encode()
        for i in range(4):
            message = Message("ex", f"rk{i}", properties, b"body %d" % i * (i + 1))
            segment.append(1000 + i, 5000 + i, encode_record(1000 + i, 5000 + i, 1, message))
        segment.write_out()
        files = [
            (directory / segment_name(1000, suffix)).read_bytes()
            for suffix in (".log", ".index", ".timeindex")
        ]
        segment.close()
    log_raw, index_raw, time_raw = files

    def framed(mode: int, index: bytes, times: bytes, records: bytes) -> bytes:
        parts = struct.pack(">H", len(index)) + index + struct.pack(">H", len(times)) + times
        return bytes((mode, 0, 1)) + parts + records

    yield framed(1, index_raw, time_raw, log_raw)  # load: trusted files
    yield framed(2, b"", b"", log_raw[:-3])  # scan, truncating a torn tail
    damaged = bytearray(log_raw)
    damaged[40] ^= 0x10
    yield framed(4 + 8 * 6, b"", b"", bytes(damaged))  # scan a sealed segment, step over
    batch = encode_batch(
        1000, [(5000 + i, 1, Message("ex", f"b{i}", b"\x00\x00", b"x")) for i in range(3)]
    )
    yield framed(2, b"", b"", batch + log_raw[: len(log_raw) // 2])  # a batch, then a torn tail


def recordbatch() -> Iterator[bytes]:
    yield b"\x00" + write_batch()
    read = ReadBatch(
        7,
        array("q", [5, 6]),
        array("q", [1000, 1001]),
        BinaryColumn.of([b"k", b""]),
        BinaryColumn.of([b"v1", b"v2"]),
        BinaryColumn.of([b"{}", b'{"a":1}']),
    )
    yield b"\x02" + encode_read(read)
    yield b"\x01" + encode_read(
        ReadBatch(0, array("q"), array("q"), BinaryColumn.of([]), BinaryColumn.of([]), None)
    )


def write_batch() -> bytes:
    return encode_write(
        WriteBatch(
            array("i", [-1, 0]),
            BinaryColumn.of([b"key", b""]),
            BinaryColumn.of([b"value", b"\xff"]),
            BinaryColumn.of([b"", json.dumps({"h": [1, "x", {"n": None}]}).encode()]),
        )
    )


def bulk_records() -> Iterator[bytes]:
    yield write_batch()
    for size in (255, 256):  # a routing key's limit, each side of it
        columns = [BinaryColumn.of([b"k" * size]), BinaryColumn.of([b"v"]), BinaryColumn.of([b""])]
        yield encode_write(WriteBatch(array("i", [0]), *columns))


def http_json() -> Iterator[bytes]:
    def framed(route: int, query: bytes, body: bytes) -> bytes:
        return bytes((route,)) + struct.pack(">H", len(query)) + query + body

    yield framed(0, b"", json_body({"partitions": 3, "arguments": {"x-max-age": "7D"}}))
    yield framed(1, b"", json_body({"value": "hi", "key": "k", "headers": {"a": [1, 2.5]}}))
    yield framed(
        1,
        b"",
        json_body(
            {"records": [{"value": "aGk=", "encoding": "base64", "partition": 0}, {"value": ""}]}
        ),
    )
    for size in (255, 256):  # a routing key's limit, each side of it
        yield framed(1, b"", json_body({"value": "v", "key": "k" * size}))
    yield framed(2, b"partition=1&limit=10&offset=earliest&max_bytes=100", b"")
    yield framed(2, b"timestamp=2024-01-01T00:00:00Z", b"")


SEEDS = {
    "frames": frames,
    "methods": methods,
    "tables": tables,
    "properties": properties,
    "sasl": sasl,
    "log": log,
    "recordbatch": recordbatch,
    "bulk-records": bulk_records,
    "http-json": http_json,
}


def main() -> None:
    for name, make in SEEDS.items():
        directory = HERE / "corpus" / name
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.glob("seed-*"):
            old.unlink()
        for i, data in enumerate(make()):
            (directory / f"seed-{i}").write_bytes(data)


if __name__ == "__main__":
    main()
