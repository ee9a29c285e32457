"""Delayed-delivery benchmark: how late do delayed messages come out with 100,000 pending?

    python benchmarks/delayed.py [--count 100000] [--lead 20] [--span 20] [--transient]
                                 [--durable-backend log] [--config tqbroker.toml]

Starts a broker (a separate process, with the x-delayed-message plugin installed:
``pip install -e plugins/delayed_message``), declares a durable ``x-delayed-message`` exchange
bound to a durable queue, and publishes ``--count`` persistent messages (``--transient``: a
non-durable exchange and queue, transient messages) whose due times are spread uniformly over
``--span`` seconds starting ``--lead`` seconds after the start, in random order, so that all of
them are pending when the first comes due. A consumer then records when each message arrives and
prints the lateness (arrival - due) percentiles, p50 / p99 / max in milliseconds, and whether the
max is within 50 ms, against two due times:
- the publisher's: send time + ``x-delay``, what a user sees (it also counts any stall of the
  broker while it was taking the message in);
- the broker's: it computes receipt + ``x-delay``; the receipt is at the latest the round trip
  the publisher makes every ``SYNC_EVERY`` messages, which bounds it (this lateness is the
  broker's timer, routing, queue, socket and client, and no more).
This is a benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import pika

from tqbroker.testing import start_broker_process

TARGET_MS = 50.0
SYNC_EVERY = 50  # a round trip every N publishes keeps the broker within a few ms of us


def percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"p50 {percentile(ordered, 0.50):.1f}  p99 {percentile(ordered, 0.99):.1f}  "
        f"max {ordered[-1]:.1f}  min {ordered[0]:.1f}"
    )


def run(args: argparse.Namespace, port: int) -> None:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
    durable = not args.transient
    publisher = pika.BlockingConnection(params)
    ch = publisher.channel()
    ch.exchange_declare(
        "bench-delayed", "x-delayed-message", durable=durable,
        arguments={"x-delayed-type": "direct"},
    )  # fmt: skip
    ch.queue_declare("bench-delayed-q", durable=durable)
    ch.queue_bind("bench-delayed-q", "bench-delayed", "k")
    mode = 1 if args.transient else 2

    start_ms = time.time() * 1000
    first_due = start_ms + args.lead * 1000
    targets = [first_due + random.random() * args.span * 1000 for _ in range(args.count)]
    # Per message: when we sent it plus its x-delay (the publisher's due time), and the time of
    # the round trip that followed it plus its x-delay (the latest the broker's due can be: the
    # broker computes due = its receipt + x-delay).
    sent_due = [0.0] * args.count
    synced_due = [0.0] * args.count
    batch_start = 0
    published = time.monotonic()
    for i, target in enumerate(targets):
        now_ms = time.time() * 1000
        delay = max(1, int(target - now_ms))
        sent_due[i] = now_ms + delay
        synced_due[i] = delay  # completed below
        ch.basic_publish(
            "bench-delayed",
            "k",
            b"%d" % i,
            pika.BasicProperties(delivery_mode=mode, headers={"x-delay": delay}),
        )
        if i % SYNC_EVERY == SYNC_EVERY - 1 or i == args.count - 1:
            ch.queue_declare("bench-delayed-q", passive=True)
            reply_ms = time.time() * 1000
            for j in range(batch_start, i + 1):
                synced_due[j] += reply_ms
            batch_start = i + 1
    publish_s = time.monotonic() - published
    done_ms = time.time() * 1000
    print(
        f"published {args.count} delayed messages in {publish_s:.1f} s "
        f"({args.count / publish_s:,.0f} msg/s); first due {(first_due - done_ms) / 1000:.1f} s "
        "after the last publish"
    )
    if done_ms > first_due:
        print("warning: publishing overran the first due time; raise --lead")
    publisher.close()

    consumer = pika.BlockingConnection(params)
    ch = consumer.channel()
    arrivals: list[tuple[int, float]] = []
    deadline = time.monotonic() + (first_due + args.span * 1000 - time.time() * 1000) / 1000 + 30
    for method, _properties, body in ch.consume(
        "bench-delayed-q", auto_ack=True, inactivity_timeout=1
    ):
        if method is not None:
            arrivals.append((int(body), time.time() * 1000))
            if len(arrivals) == args.count:
                break
        elif time.monotonic() > deadline:
            break
    consumer.close()

    if not arrivals:
        print("no message arrived")
        return
    vs_publisher = [at - sent_due[i] for i, at in arrivals]
    vs_broker = [at - synced_due[i] for i, at in arrivals]
    print(f"received {len(arrivals)}/{args.count}; lateness (arrival - due), ms:")
    print(f"  after the publisher's due (send + x-delay):         {summary(vs_publisher)}")
    print(f"  after the broker's due (at most receipt + x-delay): {summary(vs_broker)}")
    worst = sorted(zip(vs_broker, (i for i, _at in arrivals), strict=True), reverse=True)[:5]
    print(
        "  latest after the broker's due: "
        + ", ".join(
            f"{late:.1f} ms at +{(sent_due[i] - first_due) / 1000:.2f} s" for late, i in worst
        )
    )
    complete = len(arrivals) == args.count
    for what, values in (("broker's", vs_broker), ("publisher's", vs_publisher)):
        verdict = "yes" if complete and max(values) <= TARGET_MS else "NO"
        print(f"every message within {TARGET_MS:.0f} ms of the {what} due time: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--lead", type=float, default=20.0, help="seconds to the first due time")
    parser.add_argument("--span", type=float, default=20.0, help="seconds the due times span")
    parser.add_argument("--transient", action="store_true", help="non-durable, in memory")
    parser.add_argument("--durable-backend", default="log")
    parser.add_argument("--dir", type=Path, help="data directory (default: a temporary one)")
    parser.add_argument("--config", type=Path, help="a broker configuration file (TOML)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tqbroker-bench-") as tmp:
        data_dir = args.dir or Path(tmp)
        config = ["--config", str(args.config)] if args.config else []
        with start_broker_process(
            data_dir, durable_backend=args.durable_backend, extra_args=config, stderr=None
        ) as broker:
            mode = "transient, in memory" if args.transient else "persistent, durable"
            print(f"x-delayed-message on {args.durable_backend} ({mode})")
            run(args, broker.port)


if __name__ == "__main__":
    main()
