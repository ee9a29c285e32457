"""Reads within the broker's read budget, over real sockets (httpx; pika for the publisher).

- Issue 33 row 5: 32 concurrent reads of 64 MiB (JSON, columns, frames) used to build every body
  whole: the broker's RSS went from 58 MB to 2.2 GB and the memory alarm they set blocked
  every AMQP publisher for 8 s. Now they stream under the budget: a broker in a child process
  (``--memory-high-watermark``) stays under its watermark, sampled all along, while a publisher
  on another connection keeps having its messages confirmed, never blocked. The default suite
  runs 32 reads of 16 MiB under a 192 MiB watermark; ``-m slow`` the issue's 64 MiB under 512.
- A streamed JSON read is byte for byte what ``JSONResponse`` would render, and takes the
  records the read in one go takes.
- While the memory alarm is set, new reads wait, and past the budget's patience are answered
  503 with ``Retry-After``; once it clears they are served.
- A frame read whose partition goes away while it streams is cut short (the client sees an
  incomplete body, never a shorter one), and a client that goes away mid-read gives back what
  its read held.
"""

from __future__ import annotations

import json
import threading
from array import array
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.canary import Canary
from tests.support.polling import eventually_async
from tqbroker.broker.alarms import MEMORY
from tqbroker.broker.read_budget import ReadBudget
from tqbroker.broker.streams.service import ProducerRecord, StreamService
from tqbroker.config import BrokerConfig
from tqbroker.recordbatch import BinaryColumn, WriteBatch, decode_read, encode_write
from tqbroker.testing import BrokerProcess, RunningBroker, start_broker, start_broker_process

MIB = 1024 * 1024
RECORD = 64 * 1024
GUEST = ("guest", "guest")
READS = {
    "frames": ("/topics/reads/partitions/0/records", {"format": "frames"}),
    "columns": ("/topics/reads/partitions/0/records", {}),
    "json": ("/topics/reads/messages", {"limit": "10000"}),
}


def resident(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * 4096


class PeakResident:
    """The most a process held resident, sampled every 10 ms while in the ``with`` block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = resident(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, resident(self.pid))

    def __enter__(self) -> PeakResident:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def fill(http: httpx.Client, total: int) -> None:
    """``total`` bytes of 64 KiB records in topic ``reads`` (4 MiB a request)."""
    assert http.put("/topics/reads", json={"partitions": 1}).status_code == 201
    per_request = 4 * MIB // RECORD
    for first in range(0, total // RECORD, per_request):
        body = encode_write(
            WriteBatch(
                array("i", [0] * per_request),
                BinaryColumn.of([b"k%d" % (first + i) for i in range(per_request)]),
                BinaryColumn.of(
                    [b"%08d" % (first + i) * (RECORD // 8) for i in range(per_request)]
                ),
                BinaryColumn.of([b""] * per_request),
            )
        )
        assert http.post("/topics/reads/records", content=body).status_code == 201


def read(base: str, kind: str, max_bytes: int, results: list[tuple[int, int]]) -> None:
    """One read on a connection of its own, its body counted as it comes, not kept."""
    path, query = READS[kind]
    with (
        httpx.Client(base_url=base, auth=GUEST, timeout=120) as http,
        http.stream("GET", path, params={**query, "max_bytes": str(max_bytes)}) as response,
    ):
        results.append((response.status_code, sum(len(c) for c in response.iter_raw())))


@pytest.fixture(params=["frames", "columns", "json"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def concurrent_reads(tmp_path: Path, kind: str, watermark: int, reads: int, size: int) -> None:
    """``reads`` concurrent reads of ``size`` bytes from a broker whose memory high watermark
    is ``watermark``: its RSS stays under it, and a publisher on another connection is never
    blocked and keeps having its messages confirmed."""
    with start_broker_process(
        tmp_path / "data",
        durable_backend="log",
        extra_args=["--memory-high-watermark", str(watermark)],
    ) as broker:
        with httpx.Client(base_url=broker.http_url, auth=GUEST, timeout=120) as http:
            fill(http, size + 4 * MIB)
        results: list[tuple[int, int]] = []
        with Canary(broker.host, broker.port) as canary, PeakResident(broker.proc.pid) as rss:
            threads = [
                threading.Thread(target=read, args=(broker.http_url, kind, size, results))
                for _ in range(reads)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            # Round trips (a confirmed publish, its delivery) went on all along.
            canary.check(min_round_trips=10, max_latency=5.0)
        assert rss.peak < watermark, f"{rss.peak / MIB:.0f} MiB resident, over the watermark"
        assert canary.blocked == 0, "the publisher was blocked: the memory alarm was set"
        assert len(results) == reads
        assert {status for status, _ in results} == {200}
        assert all(got >= size for _, got in results), results
        assert _alarms(broker) == {"status": "ok"}


def _alarms(broker: BrokerProcess) -> Any:
    return httpx.get(f"{broker.http_url}/api/health/checks/alarms", auth=GUEST).json()


def test_32_concurrent_reads_stay_under_the_watermark(tmp_path: Path, kind: str) -> None:
    concurrent_reads(tmp_path, kind, watermark=192 * MIB, reads=32, size=16 * MIB)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_32_concurrent_64_mib_reads_stay_under_a_512_mib_watermark(
    tmp_path: Path, kind: str
) -> None:
    concurrent_reads(tmp_path, kind, watermark=512 * MIB, reads=32, size=64 * MIB)


# -- in one process: what a streamed read answers ---------------------------------------------


def render(content: object) -> bytes:
    """What ``JSONResponse`` makes of ``content``."""
    return json.dumps(
        content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    ).encode()


async def topic_t(running: RunningBroker) -> tuple[ReadBudget, StreamService]:
    """The broker's read budget and its stream service, with topic "t" (one partition)."""
    assert running.broker is not None
    streams = StreamService(running.broker.vhosts["/"])
    await streams.declare("t", 1, {})
    return running.broker.read_budget, streams


async def test_a_streamed_json_read_is_what_json_response_renders() -> None:
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery)
        _budget, streams = await topic_t(running)
        records = [
            ProducerRecord(
                b"\xff\xfe%d" % n if n % 3 == 0 else f"v-é-{n}".encode() * (n % 50),
                key=f"k{n % 7}",
                headers={"n": n, "f": 1.5, "b": b"\x00"} if n % 5 == 0 else {},
            )
            for n in range(2500)
        ]
        await streams.produce("t", records)
        async with httpx.AsyncClient(base_url=running.http_url, auth=GUEST) as http:
            cases: list[dict[str, Any]] = [
                {"limit": 2500, "max_bytes": 64 * MIB},  # pieces of 1,000 records
                {"offset": 7, "limit": 2000, "max_bytes": 30_000},
                {"offset": 2400, "limit": 10_000},  # to the end
                {"offset": "latest"},  # nothing
                {"timestamp": 0, "limit": 1200},
            ]
            for query in cases:
                response = await http.get("/topics/t/messages", params=query)
                assert response.status_code == 200, response.text
                got = response.json()
                assert response.content == render(got), query
                whole = streams.read(
                    "t",
                    0,
                    offset=streams.high_watermark("t", 0)
                    if query.get("offset") == "latest"
                    else query.get("offset"),
                    timestamp_ms=query.get("timestamp"),
                    limit=query.get("limit", 100),
                    max_bytes=query.get("max_bytes", MIB),
                )
                assert [m["offset"] for m in got["messages"]] == [r.offset for r in whole]
            many = await http.get("/topics/t/messages", params={"limit": 2500})
            assert many.headers.get("transfer-encoding") == "chunked"
            few = await http.get("/topics/t/messages", params={"limit": 3})
            assert few.headers["content-length"] == str(len(few.content))  # one piece
        nursery.cancel_scope.cancel()


async def test_reads_wait_while_the_memory_alarm_is_set_and_are_refused_past_patience(
    tmp_path: Path,
) -> None:
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path, memory_high_watermark=1)
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, config)
        broker = running.broker
        assert broker is not None
        await eventually_async(lambda: MEMORY in broker.alarms.active)  # 1 byte: always over
        streams = StreamService(broker.vhosts["/"])
        await streams.declare("t", 1, {})
        await streams.produce("t", [ProducerRecord(b"hello", key="k")])
        broker.read_budget.patience = 0.3
        async with httpx.AsyncClient(base_url=running.http_url, auth=GUEST) as http:
            for path, query in [
                ("/topics/t/messages", {}),
                ("/topics/t/partitions/0/records", {}),
                ("/topics/t/partitions/0/records", {"format": "frames"}),
            ]:
                refused = await http.get(path, params=query)
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"] == "unavailable"
                assert "low on memory" in refused.json()["message"]
                assert "reads wait while the memory alarm is set" in refused.json()["message"]
            broker.read_budget.patience = 30
            answers: list[httpx.Response] = []

            async def read_once() -> None:
                answers.append(await http.get("/topics/t/messages"))

            nursery.start_soon(read_once)
            await trio.sleep(0.5)
            assert answers == []  # waiting for the alarm to clear
            broker.memory_monitor.limit = 1 << 50  # the next check clears it
            await eventually_async(lambda: answers)
            assert answers[0].status_code == 200
            assert [m["value"] for m in answers[0].json()["messages"]] == ["hello"]
        nursery.cancel_scope.cancel()


async def test_a_frame_read_whose_partition_goes_away_is_cut_short() -> None:
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery)
        budget, streams = await topic_t(running)
        for n in range(48):  # a frame each, 48 MiB: more than socket buffers hold
            await streams.produce("t", [ProducerRecord(b"%02d" % n + b"x" * MIB)])
        async with (
            httpx.AsyncClient(base_url=running.http_url, auth=GUEST) as http,
            http.stream(
                "GET",
                "/topics/t/partitions/0/records",
                params={"format": "frames", "max_bytes": 64 * MIB},
            ) as response,
        ):
            assert response.status_code == 200
            promised = int(response.headers["content-length"])
            assert promised > 48 * MIB
            chunks = response.aiter_raw()
            got = [len(await chunks.__anext__())]
            await streams.delete("t")
            with pytest.raises(httpx.RemoteProtocolError, match="without sending complete"):
                await _count(chunks, got)
            assert sum(got) < promised
        await eventually_async(lambda: budget.in_use == 0)
        nursery.cancel_scope.cancel()


async def test_a_read_that_waited_past_the_body_timeout_is_answered_whole(
    tmp_path: Path,
) -> None:
    """A GET has no body to wait for: a read that waits for room in the budget longer than
    ``http_body_timeout`` is still answered (the body deadline once took the late first
    ``receive`` of a streamed response for a client gone away: 0 bytes of a 64 MiB body)."""
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path, http_body_timeout=0.2)
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery, config)
        budget, streams = await topic_t(running)
        await streams.produce("t", [ProducerRecord(b"x" * MIB)])
        await budget.reserve(budget.limit)  # no room for anyone
        answers: list[httpx.Response] = []

        async def read(query: dict[str, str]) -> None:
            async with httpx.AsyncClient(base_url=running.http_url, auth=GUEST) as http:
                answers.append(await http.get("/topics/t/partitions/0/records", params=query))

        for query in [{"format": "frames"}, {}]:
            nursery.start_soon(read, query)
        await eventually_async(lambda: budget.waiting == 2)
        await trio.sleep(0.5)  # past the body timeout
        budget.release(budget.limit)
        await eventually_async(lambda: len(answers) == 2)
        assert [a.status_code for a in answers] == [200, 200]
        assert all(len(a.content) > MIB for a in answers)
        nursery.cancel_scope.cancel()


async def test_a_client_that_goes_away_gives_back_what_its_read_held() -> None:
    async with trio.open_nursery() as nursery:
        running = await start_broker(nursery)
        budget, streams = await topic_t(running)
        for _ in range(32):
            await streams.produce("t", [ProducerRecord(b"x" * MIB)])
        for query in [{"format": "frames"}, {}]:  # streamed; built whole
            async with (
                httpx.AsyncClient(base_url=running.http_url, auth=GUEST) as http,
                http.stream(
                    "GET",
                    "/topics/t/partitions/0/records",
                    params={**query, "max_bytes": 32 * MIB},
                ) as response,
            ):
                await response.aiter_raw().__anext__()
                assert budget.in_use > 0
            await eventually_async(lambda: budget.in_use == 0)
        columns = await _get(running.http_url, "/topics/t/partitions/0/records")
        assert len(decode_read(columns, headers=False).offsets) == 1  # 1 MiB by default
        nursery.cancel_scope.cancel()


async def _count(chunks: AsyncIterator[bytes], got: list[int]) -> None:
    async for chunk in chunks:
        got.append(len(chunk))


async def _get(base: str, path: str) -> bytes:
    async with httpx.AsyncClient(base_url=base, auth=GUEST) as http:
        response = await http.get(path)
        assert response.status_code == 200
        return response.content
