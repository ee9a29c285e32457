"""How long a definitions import of many durable queues takes: a broker process on the log
backend, one ``POST /api/definitions`` of ``N`` durable classic queues (each bound to a
direct exchange), timed from the request to the answer; then the broker is restarted and
the queues counted (what the import answered for is durable).

    python benchmarks/definitions_import_probe.py [N]     # default 10000
"""

from __future__ import annotations

import json
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


def main() -> None:
    queues = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    body = json.dumps(document(queues)).encode()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        with start_broker_process(data, durable_backend="log") as broker, _api(broker) as api:
            started = time.perf_counter()
            answer = api.post(
                "/api/definitions", content=body, headers={"content-type": "application/json"}
            )
            seconds = time.perf_counter() - started
            answer.raise_for_status()
        print(f"{queues} durable queues imported in {seconds:.2f} s", flush=True)
        restarted = start_broker_process(data, durable_backend="log", timeout=600)
        with restarted as broker, _api(broker) as api:
            names = {q["name"] for q in api.get("/api/queues").json()}
        kept = sum(1 for n in range(queues) if f"probe.q{n}" in names)
    print(
        f"{queues} durable queues imported in {seconds:.2f} s "
        f"({seconds / queues * 1000:.2f} ms each); after a restart {kept} of {queues} are there"
    )


if __name__ == "__main__":
    main()
