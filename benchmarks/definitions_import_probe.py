"""How long a definitions import of many durable queues takes: a broker process on the log
backend, one ``POST /api/definitions`` of ``N`` durable classic queues (each bound to a
direct exchange), timed from the request to the answer; then the broker is stopped, restarted
and the queues counted (what the import answered for is durable), both timed too.

    python benchmarks/definitions_import_probe.py [N] [--strace]     # default 10000

``--strace``: the fsync and fdatasync calls the broker makes during the import, counted by
``strace -c`` attached to every thread of the broker process (its worker threads too).
``--file``: the same document imported at start-up instead (``--definitions FILE``), timed
from the start to the broker's ready line.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tqbroker.testing import BrokerProcess, start_broker_process


def document(queues: int) -> dict[str, object]:
    return {
        "vhosts": [{"name": "/"}],
        "exchanges": [
            {
                "name": "probe.x",
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "queues": [
            {
                "name": f"probe.q{n}",
                "vhost": "/",
                "durable": True,
                "auto_delete": False,
                "arguments": {"x-queue-type": "classic"},
            }
            for n in range(queues)
        ],
        "bindings": [
            {
                "source": "probe.x",
                "vhost": "/",
                "destination": f"probe.q{n}",
                "destination_type": "queue",
                "routing_key": f"k{n}",
                "arguments": {},
            }
            for n in range(queues)
        ],
    }


def _api(broker: BrokerProcess) -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=600)


def _strace(pid: int) -> subprocess.Popen[str]:
    """``strace -c`` of the fsyncs of every thread of ``pid`` (and of threads started later)."""
    threads = [arg for tid in os.listdir(f"/proc/{pid}/task") for arg in ("-p", tid)]
    command = ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", *threads]
    tracer = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # attached (strace prints nothing until it detaches)
    return tracer


def _syncs(tracer: subprocess.Popen[str]) -> dict[str, int]:
    tracer.send_signal(signal.SIGINT)
    _out, summary = tracer.communicate(timeout=60)
    counts = re.findall(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", summary, re.M)
    return {name: int(calls) for calls, name in counts if name != "total"}


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    queues = int(args[0]) if args else 10_000
    body = json.dumps(document(queues)).encode()
    if "--file" in sys.argv:
        at_start(queues, body)
        return
    syncs: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        with start_broker_process(data, durable_backend="log") as broker, _api(broker) as api:
            tracer = _strace(broker.proc.pid) if "--strace" in sys.argv else None
            started = time.perf_counter()
            answer = api.post(
                "/api/definitions", content=body, headers={"content-type": "application/json"}
            )
            seconds = time.perf_counter() - started
            answer.raise_for_status()
            if tracer is not None:
                syncs = _syncs(tracer)
            print(f"{queues} durable queues imported in {seconds:.2f} s", flush=True)
            stopping = time.perf_counter()
            broker.stop(timeout=600)
            stopped = time.perf_counter() - stopping
        starting = time.perf_counter()
        restarted = start_broker_process(data, durable_backend="log", timeout=600)
        with restarted as broker, _api(broker) as api:
            restart = time.perf_counter() - starting
            names = {q["name"] for q in api.get("/api/queues").json()}
        kept = sum(1 for n in range(queues) if f"probe.q{n}" in names)
    print(
        f"{queues} durable queues imported in {seconds:.2f} s "
        f"({seconds / queues * 1000:.2f} ms each); after a restart {kept} of {queues} are there"
    )
    print(f"clean stop {stopped:.2f} s; restart (recovery) {restart:.2f} s")
    if syncs:
        total = sum(syncs.values())
        print(f"during the import: {syncs} ({total / queues:.2f} per queue)")


def at_start(queues: int, body: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        definitions = Path(tmp) / "definitions.json"
        definitions.write_bytes(body)
        started = time.perf_counter()
        extra = ["--definitions", str(definitions)]
        broker = start_broker_process(
            Path(tmp) / "data", durable_backend="log", extra_args=extra, timeout=600
        )
        with broker, _api(broker) as api:
            seconds = time.perf_counter() - started
            names = {q["name"] for q in api.get("/api/queues").json()}
        kept = sum(1 for n in range(queues) if f"probe.q{n}" in names)
    print(f"{queues} durable queues imported at start-up: ready in {seconds:.2f} s ({kept} there)")


if __name__ == "__main__":
    main()
