"""A transaction's uncommitted publishes give their memory back at ``tx.rollback``: a broker
process, 50,000 publishes of 1 KiB in one transaction, rolled back; the broker's resident
memory afterwards is within a margin of what it was before (it held 50 MiB and more)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pika
import pytest

from tests.support.polling import eventually
from tqbroker.testing import start_broker_process

pytestmark = pytest.mark.timeout(180)

PUBLISHES = 50_000
BODY = b"x" * 1024


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_rollback_gives_the_memory_of_its_publishes_back(tmp_path: Path) -> None:
    with start_broker_process(tmp_path / "data") as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue
        channel.tx_select()
        for _ in range(2):  # the memory is given back each time, not kept for the next
            before = _rss_mib(broker.proc.pid)
            for _ in range(PUBLISHES):
                channel.basic_publish("", queue, BODY)
            channel.queue_declare(queue, passive=True)  # a round trip: all of them arrived
            held = _rss_mib(broker.proc.pid)
            channel.tx_rollback()
            # Given back by the time rollback-ok came; allowed a while on a busy machine.
            after = eventually(
                _given_back(broker.proc.pid, before),
                timeout=10,
                what="the rolled-back publishes' memory given back",
            )
            print(f"RSS before {before:.0f} MiB, holding {held:.0f}, after rollback {after:.0f}")
            assert held - before > 40  # the publishes were held
            assert after - before < 15
        assert channel.queue_declare(queue, passive=True).method.message_count == 0
        connection.close()


def _given_back(pid: int, before: float) -> Callable[[], float | None]:
    """The process's RSS once it is within 15 MiB of ``before`` (else None)."""

    def check() -> float | None:
        rss = _rss_mib(pid)
        return rss if rss - before < 15 else None

    return check
