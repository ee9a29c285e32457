"""Kill the broker with SIGKILL during confirmed persistent publishing and consuming; after each
restart every confirmed message must still be there exactly once (or come back flagged
redelivered). Every round must confirm and deliver, no publish may be nacked, and a client may
end quietly only because its socket went away. The publisher and consumer are pika clients; the
broker is another process. (The fuller checker: ``tests/reliability``.)"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pika
import pytest

from tqbroker.testing import start_broker_process

QUEUE = "crash-test"


class Log:
    """What the clients saw: confirmed ids (and per round), nacked ids, every delivery (id,
    redelivered), and any error other than the broker's socket going away."""

    def __init__(self) -> None:
        self.confirmed: set[int] = set()
        self.nacked: set[int] = set()
        self.deliveries: list[tuple[int, bool]] = []
        self.errors: list[BaseException] = []
        self.round = 0
        self.confirmed_in: Counter[int] = Counter()  # round -> confirms
        self.delivered_in: Counter[int] = Counter()  # round -> deliveries
        self.next_id = 0
        self.lock = threading.Lock()
        self.killing = threading.Event()  # set just before the kill

    def got_going(self, rnd: int, timeout: float = 20) -> bool:
        """Wait until round ``rnd`` has confirmed a publish and made a delivery."""
        deadline = time.monotonic() + timeout
        while not (self.confirmed_in[rnd] and self.delivered_in[rnd]) and not self.errors:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return not self.errors


@contextmanager
def killed_is_fine(log: Log, stop: threading.Event) -> Iterator[None]:
    """Let a client end quietly when the broker was killed under it (its socket lost, or
    refused once the kill had come); anything else (a nack, a channel or connection closed by
    the broker, a bug) is kept in ``log.errors`` for the test to fail on."""
    try:
        yield
    except (pika.exceptions.StreamLostError, ConnectionError):
        pass
    except pika.exceptions.AMQPConnectionError as exc:  # a connect or handshake failed
        if not log.killing.is_set() or isinstance(exc, pika.exceptions.ConnectionClosedByBroker):
            log.errors.append(exc)
    except BaseException as exc:
        log.errors.append(exc)


def publish(port: int, log: Log, stop: threading.Event) -> None:
    with killed_is_fine(log, stop):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(QUEUE, durable=True)
        while not stop.is_set():
            with log.lock:
                msg_id = log.next_id
                log.next_id += 1
            body = str(msg_id).encode() + b"." * random.randint(0, 4096)
            try:
                ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
            except pika.exceptions.NackError:
                with log.lock:
                    log.nacked.add(msg_id)
                continue
            with log.lock:
                log.confirmed.add(msg_id)
                log.confirmed_in[log.round] += 1


def consume(port: int, log: Log, stop: threading.Event) -> None:
    with killed_is_fine(log, stop):
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare(QUEUE, durable=True)
        ch.basic_qos(prefetch_count=50)
        for method, _props, body in ch.consume(QUEUE, inactivity_timeout=0.1):
            if stop.is_set():
                break
            if method is None:
                continue
            with log.lock:
                log.deliveries.append((int(body.split(b".")[0]), method.redelivered))
                log.delivered_in[log.round] += 1
            ch.basic_ack(method.delivery_tag)


def drain(port: int, log: Log) -> None:
    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
    ch = conn.channel()
    ch.queue_declare(QUEUE, durable=True)
    while True:
        method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
        if method is None:
            break
        log.deliveries.append((int(body.split(b".")[0]), method.redelivered))
    conn.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["log", "rocksdb"])
def test_kill_restart_loses_no_confirmed_message(tmp_path: Path, backend: str) -> None:
    rounds = 10
    log = Log()
    for rnd in range(rounds):
        log.round = rnd
        log.killing.clear()
        broker = start_broker_process(tmp_path, durable_backend=backend)
        stop = threading.Event()
        threads = [
            threading.Thread(target=publish, args=(broker.port, log, stop)),
            threading.Thread(target=publish, args=(broker.port, log, stop)),
            threading.Thread(target=consume, args=(broker.port, log, stop)),
        ]
        for t in threads:
            t.start()
        going = log.got_going(rnd)
        time.sleep(random.uniform(0.1, 1.2))
        log.killing.set()
        broker.kill()
        stop.set()
        for t in threads:
            t.join(timeout=10)
        assert not log.errors, f"round {rnd}: {log.errors[:3]!r}"
        # Every round, not only the run as a whole, confirms and delivers: a broker that
        # nacked (or refused) every publish after a restart fails here.
        did = f"{log.confirmed_in[rnd]} confirms, {log.delivered_in[rnd]} deliveries"
        assert going, f"round {rnd} did not get going: {did} in 20 s"
    broker = start_broker_process(tmp_path, durable_backend=backend)
    try:
        drain(broker.port, log)
    finally:
        broker.kill()

    assert not log.nacked, f"{len(log.nacked)} publishes nacked, e.g. {sorted(log.nacked)[:10]}"
    seen = Counter(msg_id for msg_id, _ in log.deliveries)
    lost = log.confirmed - set(seen)
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:10]}"
    unexpected = set(seen) - set(range(log.next_id))
    assert not unexpected
    # A message seen more than once must carry the redelivered flag on its repeats.
    first_seen: set[int] = set()
    for msg_id, redelivered in log.deliveries:
        if msg_id in first_seen:
            assert redelivered, f"message {msg_id} delivered twice without the redelivered flag"
        first_seen.add(msg_id)
    print(f"confirmed={len(log.confirmed)} deliveries={len(log.deliveries)}")
    assert len(log.confirmed) > 100  # the rounds did real work
