"""The power-cut workload through the real broker: an in-process broker (``running_broker``) on
the recorded data directory, driven by pika with publisher confirms. Durable queues declared,
persistent messages published (each confirmed before the next: the mark follows the confirm),
some through a durable ``x-delayed-message`` exchange (150 ms), some to a stream, messages got
and acked, a queue deleted, another declared, then a clean stop.

Recovery on a crash state starts a broker on it, then checks with pika: every queue whose
``declare-ok`` was received exists, a queue whose ``delete-ok`` was received does not, no
confirmed message is missing (unless acked; a delayed one is waited for until due), no acked
message comes back once promised (an ack is promised by the confirm of a later publish on the
same channel: the flush that confirmed it wrote the ack's checkpoint too), no body is corrupt.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from tqbroker.config import BrokerConfig
from tqbroker.storage_env import FileSystem, StorageEnv
from tqbroker.testing import running_broker

from .recorder import Recorder
from .workloads import body, ident, union

PERSISTENT = pika.BasicProperties(delivery_mode=2)
DELAYED = "x-delayed-message"


def config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0,
        http_port=None,
        data_dir=data_dir,
        durable_backend="log",
        backend_options={"log": {"segment_bytes": 2048, "index_interval_bytes": 256}},
        auth_failure_delay=0.0,
        shutdown_timeout=1.0,
    )


class BrokerWorkload:
    name = "broker+pika"
    sync_delay = 0.03  # a slow disk: an ok sent before its write completes shows in the trace

    def __init__(self, messages: int = 12) -> None:
        self.messages = messages

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        with running_broker(config(data_dir), env=StorageEnv.default(recorder)) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            channel = connection.channel()
            channel.confirm_delivery()
            for queue in ("a", "b", "dq"):
                channel.queue_declare(queue, durable=True)
            channel.exchange_declare(
                "dx", DELAYED, durable=True, arguments={"x-delayed-type": "direct"}
            )
            channel.queue_bind("dq", "dx", "dq")
            recorder.mark(queues=["a", "b", "dq"])
            for n in range(3):  # due while the rest runs, or at the restart after a crash
                delayed = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 150})
                channel.basic_publish("dx", "dq", body("dq", n), delayed)
                recorder.mark(confirmed=[("dq", n)])

            def publish(queue: str, n: int, **extra: Any) -> None:
                channel.basic_publish("", queue, body(queue, n), PERSISTENT, mandatory=True)
                recorder.mark(confirmed=[(queue, n)], **extra)

            channel.queue_declare("st", durable=True, arguments={"x-queue-type": "stream"})
            recorder.mark(queues=["st"])
            for n in range(self.messages):
                publish("a", n)
                if n % 2:
                    publish("st", n)
            acked = []
            for _ in range(self.messages // 2):
                method, _properties, data = channel.basic_get("a")
                assert method is not None
                channel.basic_ack(method.delivery_tag)
                acked.append(ident(data))
            recorder.mark(acking=acked)
            publish("a", self.messages, acked=acked)
            for n in range(4):
                publish("b", n)
            recorder.mark(deleting=["b"])
            channel.queue_delete("b")
            recorder.mark(deleted=["b"])
            channel.queue_declare("c", durable=True)
            recorder.mark(queues=["c"])
            for n in range(3):
                publish("c", n)
            connection.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        declared, deleted = union(marks, "queues"), union(marks, "deleted")
        deleting = union(marks, "deleting")
        got: dict[str, list[bytes]] = {}
        with running_broker(config(data_dir), env=StorageEnv.default(fs)) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            for queue in ("a", "b", "c", "dq", "st"):
                channel = connection.channel()
                try:
                    channel.queue_declare(queue, durable=True, passive=True)
                except pika.exceptions.ChannelClosedByBroker:
                    if queue in declared and queue not in deleting:
                        found["lost"] += 1  # a declare-ok'd queue is gone
                    continue
                if queue in deleted:
                    found["resurrected"] += 1  # a delete-ok'd queue came back
                if queue == "st":
                    promised = {n for (q, n) in map(tuple, union(marks, "confirmed")) if q == queue}
                    got[queue] = _read_stream(channel, queue, promised)
                    continue
                got[queue] = []
                # Delayed messages come when due (at once if overdue): wait for those promised.
                waiting = {n for (q, n) in map(tuple, union(marks, "confirmed")) if q == queue}
                deadline = time.monotonic() + (2.0 if queue == "dq" else 0.0)
                while True:
                    method, _properties, data = channel.basic_get(queue, auto_ack=True)
                    if method is not None:
                        got[queue].append(data)
                        waiting.discard((ident(data) or ("", -1))[1])
                        continue
                    if not waiting or time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
                channel.close()
            connection.close()
        seen: Counter[tuple[str, int]] = Counter()
        for queue, bodies in got.items():
            for data in bodies:
                who = ident(data)
                if who is None or who[0] != queue:
                    found["corrupt"] += 1
                else:
                    seen[who] += 1
        # The delayed exchange is at-least-once across a crash (delivered, then acked in its
        # store once durable in the queue): duplicates allowed there.
        found["duplicated"] += sum(c - 1 for (q, _n), c in seen.items() if c > 1 and q != "dq")
        acking = {tuple(x) for x in union(marks, "acking")}
        acked = {tuple(x) for x in union(marks, "acked")}
        for who in union(marks, "confirmed"):
            who = tuple(who)
            if who in acking or (who[0] in deleting):
                continue
            if who not in seen:
                found["lost"] += 1
        found["resurrected"] += len(acked & set(seen))
        if "b" in deleted:
            found["resurrected"] += sum(c for (queue, _n), c in seen.items() if queue == "b")
        return found


def _read_stream(channel: BlockingChannel, queue: str, promised: set[int]) -> list[bytes]:
    """The records of a stream from its first offset: until every ``promised`` one came (the
    last one confirmed is the end of what was promised), or none came for 0.5 s."""
    channel.basic_qos(prefetch_count=100)
    bodies = []
    arguments = {"x-stream-offset": "first"}
    for method, _properties, data in channel.consume(
        queue, arguments=arguments, inactivity_timeout=0.5
    ):
        if method is None:
            break
        bodies.append(data)
        channel.basic_ack(method.delivery_tag)
        promised.discard((ident(data) or ("", -1))[1])
        if not promised:
            break
    channel.cancel()
    channel.close()
    return bodies


__all__ = ["BrokerWorkload", "body"]
