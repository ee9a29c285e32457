"""Kill the broker with SIGKILL during confirmed persistent publishing and consuming; after each
restart every confirmed message must still be there exactly once (or come back flagged
redelivered). The publisher and consumer are pika clients; the broker is another process."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from pathlib import Path

import pika
import pytest

from tqbroker.testing import start_broker_process

QUEUE = "crash-test"


class Log:
    """What the clients saw: confirmed ids, and every delivery (id, redelivered)."""

    def __init__(self) -> None:
        self.confirmed: set[int] = set()
        self.deliveries: list[tuple[int, bool]] = []
        self.next_id = 0
        self.lock = threading.Lock()


def publish(port: int, log: Log, stop: threading.Event) -> None:
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare(QUEUE, durable=True)
        while not stop.is_set():
            with log.lock:
                msg_id = log.next_id
                log.next_id += 1
            body = str(msg_id).encode() + b"." * random.randint(0, 4096)
            ch.basic_publish("", QUEUE, body, pika.BasicProperties(delivery_mode=2))
            with log.lock:
                log.confirmed.add(msg_id)
    except (pika.exceptions.AMQPError, OSError):
        pass  # the broker was killed


def consume(port: int, log: Log, stop: threading.Event) -> None:
    try:
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
            ch.basic_ack(method.delivery_tag)
    except (pika.exceptions.AMQPError, OSError):
        pass


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
    for _ in range(rounds):
        broker = start_broker_process(tmp_path, durable_backend=backend)
        stop = threading.Event()
        threads = [
            threading.Thread(target=publish, args=(broker.port, log, stop)),
            threading.Thread(target=publish, args=(broker.port, log, stop)),
            threading.Thread(target=consume, args=(broker.port, log, stop)),
        ]
        for t in threads:
            t.start()
        time.sleep(random.uniform(0.3, 1.5))
        broker.kill()
        stop.set()
        for t in threads:
            t.join(timeout=10)
    broker = start_broker_process(tmp_path, durable_backend=backend)
    try:
        drain(broker.port, log)
    finally:
        broker.kill()

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
