"""A partitioned topic on a real cluster (``cluster_nodes.Nodes``) under load, for fault tests:
``Topic`` (made through the HTTP topic API; its partition records in etcd: every partition led
by a running node, or also with three in-sync replicas), ``Load`` (a pika publisher thread per
node, recording a ``cluster_history.History``), ``final_replicas`` (every node's copy of every
partition once they agree, read over each node's HTTP API) and ``assert_passes`` (the checker);
``checked_load``: all of these around a test's faults.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import httpx
import pika
import pika.exceptions

from tests.support.cluster_history import (
    CONFIRMED,
    NACKED,
    History,
    Publish,
    Replica,
    check,
    payload_of,
)
from tests.support.cluster_nodes import POLL, Nodes
from tests.support.polling import eventually
from tqbroker.cluster.records import PartitionRecord

PROGRESS = 30  # confirms a phase of a run must add (it proves nothing otherwise)
SETTLE = 90  # seconds a failover or a catch-up may take on a busy two-core machine


class Topic:
    def __init__(self, nodes: Nodes, partitions: int, name: str = "orders") -> None:
        self.nodes = nodes
        self.name = name
        self.queues = tuple(f"{name}-{n}" for n in range(partitions))

    def create(self) -> None:
        """Made through the first running node; returns once every partition is in sync."""
        process = next(iter(self.nodes.running.values()))
        with httpx.Client(base_url=process.http_url, auth=("guest", "guest")) as api:
            response = api.put(f"/topics/{self.name}", json={"partitions": len(self.queues)})
        assert response.status_code == 201, response.text
        self.wait_in_sync("the topic's partitions in sync")

    def records(self) -> dict[str, PartitionRecord]:
        found = {}
        for queue in self.queues:
            record = self.nodes.record(queue)
            if record is not None:
                found[queue] = record
        return found

    def led(self) -> dict[str, PartitionRecord] | None:
        """The records, once every partition is led by a running node."""
        placed = self.records()
        running = self.nodes.running
        ready = len(placed) == len(self.queues) and all(
            r.leader in running for r in placed.values()
        )
        return placed if ready else None

    def in_sync(self) -> dict[str, PartitionRecord] | None:
        """The records, once every partition is led by a running node with three in sync."""
        placed = self.led()
        return placed if placed and all(len(r.isr) == 3 for r in placed.values()) else None

    def wait_led(self, what: str) -> dict[str, PartitionRecord]:
        return eventually(self.led, SETTLE, POLL, what=what)

    def wait_in_sync(self, what: str) -> dict[str, PartitionRecord]:
        return eventually(self.in_sync, SETTLE, POLL, what=what)


class Producer(threading.Thread):
    """Publishes through ``home`` (another running node while it is down) until stopped, one
    message at a time, round robin over the partitions, recording each outcome; a message
    nacked or cut off (the connection died before its confirm) is sent again under the same
    sequence number."""

    def __init__(self, name: str, home: str, topic: Topic, history: History) -> None:
        super().__init__(name=name, daemon=True)
        self.home = home
        self.topic = topic
        self.history = history
        self.stopping = threading.Event()
        self.confirmed = 0
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._publish()
        except BaseException as exc:  # reported by ``Load.stop``
            self.failure = exc

    def _publish(self) -> None:
        queues = self.topic.queues
        seq, resend = 0, False
        while not self.stopping.is_set():
            connection = self._connect()
            if connection is None:
                time.sleep(POLL)
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                while not self.stopping.is_set():
                    publish = Publish(self.name, seq, queues[seq % len(queues)], resent=resend)
                    self.history.publishes.append(publish)
                    resend = True  # unless confirmed below
                    try:
                        channel.basic_publish(
                            "", publish.partition, payload_of(self.name, seq), mandatory=True
                        )
                    except (pika.exceptions.NackError, pika.exceptions.UnroutableError):
                        publish.outcome = NACKED  # not confirmed; perhaps written
                        time.sleep(POLL)
                        continue
                    publish.outcome = CONFIRMED
                    self.confirmed += 1
                    seq, resend = seq + 1, False
            except (pika.exceptions.AMQPError, OSError):
                pass  # the node died under us: the last outcome stays unknown
            finally:
                if connection.is_open:
                    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
                        connection.close()

    def _connect(self) -> pika.BlockingConnection | None:
        running = dict(self.topic.nodes.running)
        for name in [self.home, *sorted(n for n in running if n != self.home)]:
            process = running.get(name)
            if process is None:
                continue
            try:
                return pika.BlockingConnection(pika.URLParameters(process.url))
            except (pika.exceptions.AMQPError, OSError):
                continue
        return None


class Load:
    """A ``Producer`` per node (``p0`` at home on ``n0``, ...), started at once."""

    def __init__(self, topic: Topic, history: History, producers: int = 3) -> None:
        self.producers = [Producer(f"p{n}", f"n{n}", topic, history) for n in range(producers)]
        for producer in self.producers:
            producer.start()

    @property
    def confirmed(self) -> int:
        return sum(p.confirmed for p in self.producers)

    def wait_progress(self, what: str, since: int | None = None) -> None:
        """Until ``PROGRESS`` more publishes are confirmed than ``since`` (default: now)."""
        start = self.confirmed if since is None else since
        eventually(lambda: self.confirmed >= start + PROGRESS, SETTLE, POLL, what=what)

    def stop(self) -> None:
        for producer in self.producers:
            producer.stopping.set()
        for producer in self.producers:
            producer.join(SETTLE)
            assert not producer.is_alive(), f"{producer.name} hangs"
            assert producer.failure is None, producer.failure


def final_replicas(topic: Topic) -> list[Replica]:
    """Every running node's copy of every partition, once they report one high watermark per
    partition: its records below it (the "frames" compared are offset:payload pairs, the
    bytes of the frames being out of reach of a client)."""
    apis = {
        name: httpx.Client(base_url=process.http_url, auth=("guest", "guest"), timeout=30)
        for name, process in topic.nodes.running.items()
    }
    try:
        marks = eventually(lambda: _agreed(topic, apis), SETTLE, POLL, what="one high watermark")
        return [
            _replica(topic, api, name, index, marks[queue])
            for name, api in apis.items()
            for index, queue in enumerate(topic.queues)
        ]
    finally:
        for api in apis.values():
            api.close()


def _agreed(topic: Topic, apis: dict[str, httpx.Client]) -> dict[str, int] | None:
    seen = []
    for api in apis.values():
        found = api.get(f"/topics/{topic.name}/offsets").json()["partitions"]
        seen.append({p["queue"]: p["latest"] for p in found})
    return seen[0] if all(s == seen[0] for s in seen) else None


def _replica(
    topic: Topic, api: httpx.Client, node: str, index: int, high_watermark: int
) -> Replica:
    records: dict[int, bytes] = {}
    offset = 0
    while offset < high_watermark:
        read = api.get(
            f"/topics/{topic.name}/messages",
            params={"partition": index, "offset": offset, "limit": 1000},
        )
        assert read.status_code == 200, read.text
        found = read.json()
        for message in found["messages"]:
            records[message["offset"]] = str(message["value"]).encode()
        assert found["next_offset"] > offset, f"{node} stopped reading at {offset}"
        offset = found["next_offset"]
    frames = [b"%d:%s" % (o, records[o]) for o in sorted(records) if o < high_watermark]
    return Replica(node, topic.queues[index], records, frames, high_watermark)


def assert_passes(history: History) -> None:
    confirmed = [p for p in history.publishes if p.outcome == CONFIRMED]
    assert len(confirmed) >= PROGRESS, "too few confirms: the run proves nothing"
    violations = check(history)
    assert violations == [], "\n".join(violations[:20])
    print(f"{len(history.publishes)} publishes, {len(confirmed)} confirmed: checker passed")


@contextlib.contextmanager
def checked_load(nodes: Nodes, partitions: int) -> Iterator[tuple[Topic, Load]]:
    """A topic of ``partitions`` under a ``Load`` that has made progress; at the end (the
    nodes still running), the load stopped once it made progress again, and the history with
    every replica checked."""
    history = History()
    topic = Topic(nodes, partitions)
    topic.create()
    load = Load(topic, history)
    load.wait_progress("first confirms", since=0)
    try:
        yield topic, load
    except BaseException:
        for producer in load.producers:  # the test failed: its publishers end with it
            producer.stopping.set()
        raise
    load.wait_progress("confirms at the end")
    load.stop()
    history.replicas = final_replicas(topic)
    assert_passes(history)
