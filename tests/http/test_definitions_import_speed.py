"""A definitions import of many durable queues opens their stores many at a time, and a new
queue's store creates nothing on disk (it once created six files and fsynced four times):
1,000 durable queues on the log backend in well under the minute that one open after another
took on the shared 2-core machine, every one of them there after a restart, and the
document's order kept in the export (10,000: ``benchmarks/definitions_import_probe.py``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tqbroker.testing import start_broker_process

pytestmark = pytest.mark.timeout(400)

QUEUES = 1000


def _document() -> dict[str, object]:
    queues = [
        {"name": f"q{n}", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        for n in range(QUEUES)
    ]
    return {"vhosts": [{"name": "/"}], "queues": queues}


def _api(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, auth=("guest", "guest"), timeout=300)


def test_a_thousand_durable_queues_import_in_seconds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_broker_process(data, durable_backend="log") as broker, _api(broker.http_url) as api:
        started = time.perf_counter()
        api.post("/api/definitions", json=_document()).raise_for_status()
        took = time.perf_counter() - started
        exported = [q["name"] for q in api.get("/api/definitions").json()["queues"]]
    print(f"{QUEUES} durable queues imported in {took:.2f} s")
    assert exported == [f"q{n}" for n in range(QUEUES)]
    assert took < 25  # one open after another: about 60 s
    restarted = start_broker_process(data, durable_backend="log", timeout=300)
    with restarted as broker, _api(broker.http_url) as api:
        names = {q["name"] for q in api.get("/api/definitions").json()["queues"]}
    assert names == {f"q{n}" for n in range(QUEUES)}
