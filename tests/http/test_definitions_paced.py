"""A big definitions body is parsed by the bounded parser a piece at a time: other clients'
round trips go on while it is parsed (a broker process; a pika canary doing passive declares
while ``POST /api/definitions`` sends 2 million JSON values), and a body over the bound of
values is refused (413) before any parsing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pika
import pytest

from tqbroker.server.http.definitions_routes import DEFINITIONS_MAX_VALUES
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(180)

JSON = {"content-type": "application/json"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with start_broker_process(tmp_path / "data") as running:
        yield running


def _body(rows: int) -> bytes:
    """A document RabbitMQ's import accepts (unknown keys are ignored) with ``rows`` rows of
    ten numbers: eleven values a row."""
    padding = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]] * rows
    return json.dumps({"vhosts": [{"name": "/"}], "padding": padding}).encode()


def test_a_big_definitions_body_does_not_stall_other_clients(broker: BrokerProcess) -> None:
    body = _body(180_000)
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    queue = channel.queue_declare("", exclusive=True).method.queue
    gaps: list[float] = []
    posting = threading.Event()
    done = threading.Event()

    def canary() -> None:
        posting.wait()
        while not done.is_set():
            started = time.perf_counter()
            channel.queue_declare(queue, passive=True)
            gaps.append(time.perf_counter() - started)

    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=120) as api:
        api.post("/api/definitions", content=_body(10), headers=JSON).raise_for_status()
        thread = threading.Thread(target=canary)
        thread.start()
        posting.set()
        time.sleep(0.2)
        started = time.perf_counter()
        answer = api.post("/api/definitions", content=body, headers=JSON)
        took = time.perf_counter() - started
        done.set()
        thread.join()
    connection.close()
    assert answer.status_code == 204, answer.text
    print(
        f"{len(body) / 2**20:.1f} MiB of definitions answered in {took * 1000:.0f} ms; canary: "
        f"{len(gaps)} round trips, max {max(gaps) * 1000:.0f} ms"
    )
    assert len(gaps) > 10
    assert max(gaps) < 0.3  # never held for the parse (in one go: 0.45 s and more)


def test_a_body_over_the_bound_of_values_is_refused_unparsed(broker: BrokerProcess) -> None:
    body = _body(DEFINITIONS_MAX_VALUES // 11 + 10)
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=120) as api:
        answer = api.post("/api/definitions", content=body, headers=JSON)
    assert answer.status_code == 413, answer.text
