"""A canary client: a real AMQP client (pika's BlockingConnection, in its own thread) that keeps
publishing and consuming round trips against a broker while a test abuses that broker.

Usage::

    with Canary(host, port) as canary:   # returns once the first round trip succeeded
        canary.mark()                    # (optional) start a new observation window
        ...                              # abuse the broker
        canary.check()                   # more round trips since the mark, no error, no stall
        canary.blocked                   # connection.blocked notifications so far (alarms)

One canary may watch many tests in turn (``mark`` / ``check`` per test).

Each round trip publishes a message (publisher confirms on, ``mandatory``) to an exclusive queue,
waits for its delivery to the canary's consumer, checks the body and acks it.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import pika

ROUND_TRIP_TIMEOUT = 5.0
# A round trip slower than this means the broker stalled (its event loop blocked).
MAX_LATENCY = 2.0


class Canary:
    def __init__(self, host: str, port: int, *, pause: float = 0.005) -> None:
        self.host = host
        self.port = port
        self.pause = pause
        self.round_trips = 0
        self.max_latency = 0.0
        self.blocked = 0  # connection.blocked notifications (a resource alarm) received
        self._baseline = 0
        self.errors: list[BaseException] = []
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary", daemon=True)

    # -- lifetime ----------------------------------------------------------------------------

    def __enter__(self) -> Canary:
        self._thread.start()
        if not self._started.wait(10):
            self._stop.set()
            raise AssertionError("the canary did not complete a first round trip within 10s")
        if self.errors:
            raise AssertionError(f"the canary failed to start: {self.errors[0]!r}") from (
                self.errors[0]
            )
        self.mark()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self.errors

    def mark(self) -> None:
        """Start a new observation window for ``check``."""
        self._baseline = self.round_trips
        self.max_latency = 0.0

    def check(
        self, min_round_trips: int = 3, timeout: float = 5.0, max_latency: float = MAX_LATENCY
    ) -> None:
        """At least ``min_round_trips`` more round trips since the last ``mark``, no error and no
        round trip slower than ``max_latency``. The canary keeps running."""
        deadline = time.monotonic() + timeout
        want = self._baseline + min_round_trips
        while self.round_trips < want and not self.errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self.errors, f"the canary (a healthy second client) failed: {self.errors!r}"
        assert self.round_trips >= want, (
            f"the canary made only {self.round_trips - self._baseline} round trips during the "
            f"test (wanted {min_round_trips})"
        )
        assert self.max_latency < max_latency, (
            f"a canary round trip took {self.max_latency:.2f}s: the broker stalled"
        )

    # -- the client thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            params = pika.ConnectionParameters(
                host=self.host,
                port=self.port,
                credentials=pika.PlainCredentials("guest", "guest"),
                connection_attempts=1,
                socket_timeout=5,
                blocked_connection_timeout=5,
            )
            connection = pika.BlockingConnection(params)
            connection.add_on_connection_blocked_callback(self._on_blocked)
            try:
                self._loop(connection)
            finally:
                if connection.is_open:
                    connection.close()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self._started.set()

    def _on_blocked(self, _connection: object, _frame: object) -> None:
        self.blocked += 1

    def _loop(self, connection: pika.BlockingConnection) -> None:
        channel = connection.channel()
        channel.confirm_delivery()
        queue = channel.queue_declare("", exclusive=True).method.queue
        deliveries = channel.consume(queue, inactivity_timeout=ROUND_TRIP_TIMEOUT)
        n = 0
        while not self._stop.is_set():
            body = b"canary %d" % n
            began = time.monotonic()
            # Raises on nack / return (confirms + mandatory).
            channel.basic_publish("", queue, body, mandatory=True)
            method, _properties, got = next(deliveries)
            if method is None:
                raise AssertionError(f"round trip {n}: no delivery within {ROUND_TRIP_TIMEOUT}s")
            if got != body:
                raise AssertionError(f"round trip {n}: got {got!r}, expected {body!r}")
            channel.basic_ack(method.delivery_tag)
            self.max_latency = max(self.max_latency, time.monotonic() - began)
            n += 1
            self.round_trips = n
            self._started.set()
            connection.sleep(self.pause)
        channel.cancel()
