"""The power-cut workload of new durable queues: an in-process broker on the recorded data
directory declares queues with ``queue.declare`` (pika) and in bulk with ``POST
/api/definitions`` (queues and their bindings), then publishes persistent messages, each
confirmed, to some of them; the others stay empty (a new queue's directory and files are made
by its first write: the definitions file is what makes it exist).

Recovery on a crash state starts a broker on it, then checks with pika: every queue whose
``declare-ok`` or import answer was received exists, accepts a publish (confirmed) and hands
back every message confirmed in it and that publish; an imported binding routes.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pika
import pika.exceptions

from tests.support.pikaqueue import drain
from tqbroker.config import BrokerConfig
from tqbroker.storage_env import FileSystem, StorageEnv
from tqbroker.testing import running_broker

from .recorder import Recorder
from .workloads import body, ident, union

PERSISTENT = pika.BasicProperties(delivery_mode=2)
EXCHANGE = "imported.x"
# On the log backend whatever durable backend the tests run with: the recording file system
# sees every write of the log backend's, none of RocksDB's.
ON_LOG = {"x-queue-backend": "log"}


def config(data_dir: Path) -> BrokerConfig:
    return BrokerConfig(
        port=0,
        http_port=0,
        metrics_port=None,
        data_dir=data_dir,
        durable_backend="log",
        auth_failure_delay=0.0,
        shutdown_timeout=1.0,
    )


def definitions(queues: list[str]) -> dict[str, Any]:
    """A definitions document: ``queues``, durable, each bound to ``EXCHANGE`` by its name."""
    return {
        "vhosts": [{"name": "/"}],
        "exchanges": [
            {
                "name": EXCHANGE,
                "vhost": "/",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "queues": [
            {"name": q, "vhost": "/", "durable": True, "auto_delete": False, "arguments": ON_LOG}
            for q in queues
        ],
        "bindings": [
            {
                "source": EXCHANGE,
                "vhost": "/",
                "destination": q,
                "destination_type": "queue",
                "routing_key": q,
                "arguments": {},
            }
            for q in queues
        ],
    }


class DeclareWorkload:
    name = "new durable queues: declared, imported"
    sync_delay = 0.005  # a slow disk: an answer sent before its write completes shows

    def __init__(self, declared: int = 3, imported: int = 40, messages: int = 3) -> None:
        self.declared = [f"d{n}" for n in range(declared)]
        self.imported = [f"i{n}" for n in range(imported)]
        self.messages = messages

    def run(self, data_dir: Path, recorder: Recorder) -> None:
        with running_broker(config(data_dir), env=StorageEnv.default(recorder)) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            channel = connection.channel()
            channel.confirm_delivery()
            for queue in self.declared:
                channel.queue_declare(queue, durable=True, arguments=ON_LOG)
                recorder.mark(queues=[queue])
            with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as api:
                answer = api.post("/api/definitions", json=definitions(self.imported))
                answer.raise_for_status()
            recorder.mark(queues=self.imported, bound=self.imported)
            # Messages in the first declared queue and in two imported ones; the rest stay
            # empty (their directories' entries never synced by a flush of their own).
            for queue in (self.declared[0], self.imported[0], self.imported[-1]):
                for n in range(self.messages):
                    channel.basic_publish("", queue, body(queue, n), PERSISTENT, mandatory=True)
                    recorder.mark(confirmed=[(queue, n)])
            connection.close()

    def check(self, data_dir: Path, marks: list[dict[str, Any]], fs: FileSystem) -> Counter[str]:
        found: Counter[str] = Counter()
        declared, bound = union(marks, "queues"), union(marks, "bound")
        confirmed = {tuple(who) for who in union(marks, "confirmed")}
        with running_broker(config(data_dir), env=StorageEnv.default(fs)) as broker:
            connection = pika.BlockingConnection(pika.URLParameters(broker.url))
            for queue in self.declared + self.imported:
                channel = connection.channel()
                try:
                    channel.queue_declare(queue, durable=True, passive=True, arguments=ON_LOG)
                except pika.exceptions.ChannelClosedByBroker:
                    found["lost"] += queue in declared  # a declare-ok'd queue is gone
                    continue
                channel.confirm_delivery()
                exchange = EXCHANGE if queue in bound else ""
                try:
                    channel.basic_publish(exchange, queue, body(queue, 99), PERSISTENT, True)
                except pika.exceptions.UnroutableError:
                    found["unexpected"] += 1  # the queue (or its binding) takes no message
                except pika.exceptions.ChannelClosedByBroker:
                    found["lost"] += 1  # the imported exchange is gone
                    continue
                got = drain(channel, queue)
                channel.close()
                seen = Counter(ident(data) for data in got)
                found["corrupt"] += seen.pop(None, 0)
                found["duplicated"] += sum(count - 1 for count in seen.values() if count > 1)
                promised = {(q, n) for q, n in confirmed if q == queue} | {(queue, 99)}
                found["lost"] += len(promised - set(seen))
                found["unexpected"] += sum(1 for who in seen if who and who[0] != queue)
            connection.close()
        return found
