"""Storage benchmark: prints what the log backend achieves on this machine's disk.

    python benchmarks/storage.py [--dir PATH] [--messages N] [--queued N]

Reports (each against the machine's own limit where one exists):
- append MB/s of the log backend (records into segments, page cache) vs ``dd`` sequential writes
  with fdatasync on the same disk;
- fsyncs per second of the disk (append 1 KiB + fdatasync, one at a time);
- confirmed persistent msg/s through the broker: a raw-socket publisher with a window of 256
  unconfirmed messages, 1 KiB bodies, persistent, to a durable queue (group commit at work);
- unclean-recovery scan MB/s (a log reopened without its clean-shutdown marker, scanned whole);
- broker RSS per queued message with N (default 1M) persistent 1 KiB messages queued.
This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from tqbroker.backends.log import LogBackend
from tqbroker.backends.log.log import Log
from tqbroker.model import Message
from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_END_BYTE,
    FRAME_HEAD,
    FRAME_HEADER,
    PROTOCOL_HEADER,
    encode_method,
)
from tqbroker.protocol.methods import (
    BasicProperties,
    BasicPublish,
    ChannelOpen,
    ConfirmSelect,
    ConnectionOpen,
    ConnectionStartOk,
    ConnectionTuneOk,
    QueueDeclare,
)
from tqbroker.testing import start_broker_process

BODY = b"x" * 1024


def dd_mb_per_s(directory: Path) -> float:
    target = directory / "dd.bin"
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=1M", "count=512", "conv=fdatasync"],
        capture_output=True,
        text=True,
    ).stderr
    target.unlink(missing_ok=True)
    match = re.search(r"copied, ([\d.]+) s", out)
    return 512 / float(match.group(1)) if match else float("nan")


def append_mb_per_s(directory: Path, count: int) -> float:
    backend = LogBackend()
    backend.open(directory / "append")
    store = backend.open_queue("/", "bench")
    message = Message("", "bench", BasicProperties(delivery_mode=2).encode(), BODY)
    start = time.perf_counter()
    for _ in range(count):
        store.push(message, True)
    work = backend.begin_flush()
    if work is not None:
        work()
    elapsed = time.perf_counter() - start
    size = sum(s.size for s in store.log.segments)
    backend.close()
    return size / elapsed / 1e6


def fsyncs_per_s(directory: Path, seconds: float = 2.0) -> float:
    fd = os.open(directory / "fsync.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        os.write(fd, BODY)
        os.fdatasync(fd)
        count += 1
    os.close(fd)
    return count / (time.perf_counter() - start)


def recovery_mb_per_s(directory: Path, megabytes: int = 512) -> float:
    log_dir = directory / "recovery"
    log = Log(log_dir)
    log.open()
    message = Message("", "bench", b"\x00\x00", BODY * 4)
    for _ in range(megabytes * 1024 // 4):
        log.append(message, 1)
    work = log.sync_work()
    if work is not None:
        work()
    log.close(clean=False)
    size = sum(p.stat().st_size for p in log_dir.glob("*.log"))
    for p in log_dir.glob("*.index"):
        p.unlink()  # force the scan to rebuild the indexes too
    start = time.perf_counter()
    Log(log_dir).open(recovery_point=0)
    return size / (time.perf_counter() - start) / 1e6


# -- through the broker ----------------------------------------------------------------------


class Publisher:
    """A lean raw-socket AMQP publisher (our own codec): handshake, confirm mode, publish."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.sock.sendall(PROTOCOL_HEADER)
        self.read_frame()  # start
        self.send(0, ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US"))
        self.read_frame()  # tune
        self.send(0, ConnectionTuneOk(2047, 131072, 0))
        self.send(0, ConnectionOpen("/"))
        self.read_frame()
        self.send(1, ChannelOpen())
        self.read_frame()
        self.send(1, QueueDeclare(queue="bench", durable=True))
        self.read_frame()
        self.send(1, ConfirmSelect())
        self.read_frame()
        props = BasicProperties(delivery_mode=2).encode()
        self.one = (
            encode_method(1, BasicPublish(exchange="", routing_key="bench"))
            + FRAME_HEAD.pack(FRAME_HEADER, 1, 12 + len(props))
            + struct.pack(">HHQ", 60, 0, len(BODY))
            + props
            + FRAME_END_BYTE
            + FRAME_HEAD.pack(FRAME_BODY, 1, len(BODY))
            + BODY
            + FRAME_END_BYTE
        )

    def send(self, channel: int, method: object) -> None:
        self.sock.sendall(encode_method(channel, method))  # type: ignore[arg-type]

    def read_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 7:
                _type, _channel, size = FRAME_HEAD.unpack_from(self.buf, 0)
                if len(self.buf) >= 8 + size:
                    payload = self.buf[7 : 7 + size]
                    self.buf = self.buf[8 + size :]
                    return _type, payload
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self.buf += chunk

    def publish_confirmed(self, count: int, window: int = 256) -> float:
        """Publish ``count`` messages keeping ``window`` unconfirmed; return msg/s."""
        sent = confirmed = 0
        start = time.perf_counter()
        while confirmed < count:
            burst = min(window - (sent - confirmed), count - sent)
            if burst > 0:
                self.sock.sendall(self.one * burst)
                sent += burst
            _type, payload = self.read_frame()
            class_method = struct.unpack_from(">HH", payload)
            if class_method == (60, 80):  # basic.ack
                tag, multiple = struct.unpack_from(">QB", payload, 4)
                confirmed = tag if multiple & 1 else max(confirmed, tag)
        return count / (time.perf_counter() - start)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a temp dir)")
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--queued", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        dd = dd_mb_per_s(directory)
        append = append_mb_per_s(directory, args.messages)
        print(
            f"append (log backend):        {append:8.1f} MB/s   dd sequential: {dd:.1f} MB/s"
            f"   ratio {append / dd:.2f}"
        )
        print(f"fsyncs per second (disk):    {fsyncs_per_s(directory):8.0f}")
        print(f"unclean recovery scan:       {recovery_mb_per_s(directory):8.1f} MB/s")
        with start_broker_process(directory / "broker", durable_backend="log") as broker:
            publisher = Publisher(broker.port)
            rate = publisher.publish_confirmed(args.messages)
            print(f"confirmed persistent msg/s:  {rate:8.0f}   (window 256, 1 KiB, fsync batch)")
            baseline = rss_kib(broker.proc.pid)
            publisher.publish_confirmed(args.queued)
            queued = args.messages + args.queued
            grown = rss_kib(broker.proc.pid) - baseline
            print(
                f"RSS per queued message:      {grown * 1024 / args.queued:8.1f} bytes   "
                f"({queued} queued, RSS {rss_kib(broker.proc.pid) / 1024:.0f} MiB)"
            )


if __name__ == "__main__":
    main()
