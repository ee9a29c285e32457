"""The load generator of the benchmark suite: worker processes driving a broker with the lean
raw-socket client (``rawclient.py``).

Responsibilities:
- jobs: picklable descriptions of what one worker process does (``Publish``, ``Consume``,
  ``ConsumeEach``, ``PacedPublish``), each with a ``prepare`` step (connect, qos, subscribe where
  the queue is still empty: before the clock starts) and a ``run`` step (timed);
- ``run_jobs``: one process per job (``multiprocessing``, spawned), all released together once
  every one is prepared, so that several cores generate load and no Python process is the limit;
  the result holds the wall time from the first start to the last finish, the CPU seconds the
  workers spent in their run steps (client CPU) and those the broker spent meanwhile (broker CPU,
  from ``/proc`` through ``procstats.py``), and what each worker measured (latencies);
- no hang: a worker whose socket stays silent for ``STALL_SECONDS`` fails with what it was
  waiting for, a worker that dies fails the run at once, and the whole run has a timeout.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import time
import traceback
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Protocol

from multiconsume import STALL_SECONDS, receive_each
from procstats import cpu_seconds, machine_cpu_seconds
from rawclient import Endpoint, RawClient, publish_frames, stamp, stamp_offset

from tqbroker.protocol.codec import FieldTable

BODY_SIZE = 1024


# -- jobs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one worker measured in its run step (``perf_counter()`` times: one clock on Linux
    for every process, so times from different workers compare)."""

    started: float
    finished: float
    messages: int
    cpu: float  # this process's CPU seconds (user + system) during the run step
    latencies_ns: array[int] | None = None


class Job(Protocol):
    def prepare(self, client: RawClient) -> None: ...

    def run(self, client: RawClient) -> Outcome: ...


@dataclass(frozen=True)
class Publish:
    """Publish ``count`` messages of ``body_size`` bytes to ``exchange`` with ``routing_key``.
    With ``window``, in confirm mode keeping that many unconfirmed (finished when all are
    confirmed); without, as fast as the socket takes them, and finished when ``wait_queue``
    (if given) holds ``count`` messages."""

    routing_key: str
    count: int
    exchange: str = ""
    body_size: int = BODY_SIZE
    persistent: bool = False
    window: int | None = None
    wait_queue: str | None = None

    def prepare(self, client: RawClient) -> None:
        if self.window is not None:
            client.confirm_select()

    def run(self, client: RawClient) -> Outcome:
        frames = publish_frames(
            self.routing_key,
            b"x" * self.body_size,
            exchange=self.exchange,
            persistent=self.persistent,
        )
        cpu, started = time.process_time(), time.perf_counter()
        if self.window is not None:
            client.publish_confirmed_frames(frames, self.count, window=self.window)
        else:
            client.publish(frames, self.count)
            if self.wait_queue is not None:
                client.wait_for_count(self.wait_queue, self.count)
        finished = time.perf_counter()
        return Outcome(started, finished, self.count, time.process_time() - cpu)


@dataclass(frozen=True)
class Consume:
    """Consume ``count`` messages from ``queue`` (manual acks, ``multiple`` every ``ack_every``).
    ``subscribe_early``: subscribe in the prepare step (the queue is empty until the clock
    starts); otherwise the run step subscribes (a queue filled beforehand). ``latency``: record
    each delivery's end-to-end latency from the stamp a ``PacedPublish`` put in its body.
    ``also``: more queues consumed on the same connection and channel (one consumer each,
    all subscribed early); ``count`` is then the deliveries from all of them."""

    queue: str
    count: int
    prefetch: int = 1000
    ack_every: int = 100
    arguments: FieldTable | None = None
    subscribe_early: bool = False
    latency: bool = False
    also: Sequence[str] = ()

    def prepare(self, client: RawClient) -> None:
        client.qos(self.prefetch)
        if self.subscribe_early or self.also:
            for i, queue in enumerate((self.queue, *self.also)):
                tag = f"bench.{i}"
                client.subscribe(queue, prefetch=self.prefetch, arguments=self.arguments, tag=tag)

    def run(self, client: RawClient) -> Outcome:
        stamps: array[int] | None = array("q") if self.latency else None
        cpu, started = time.process_time(), time.perf_counter()
        if not (self.subscribe_early or self.also):
            client.subscribe(self.queue, prefetch=self.prefetch, arguments=self.arguments)
        client.receive(self.count, ack_every=self.ack_every, stamps=stamps)
        finished = time.perf_counter()
        return Outcome(started, finished, self.count, time.process_time() - cpu, stamps)


@dataclass(frozen=True)
class ConsumeEach:
    """Consume ``count`` messages from each of ``queues``, each queue on a connection of its
    own (one consumer each, subscribed in the prepare step, prefetch and ``multiple`` acks as in
    ``Consume``), all from this one process: the broker sees a connection per consumer while
    the generator stays a few processes (fanout-16's sixteen consumers in two processes, not
    sixteen, which on two cores starved the broker)."""

    queues: tuple[str, ...]
    count: int  # per queue
    prefetch: int = 1000
    ack_every: int = 100

    def prepare(self, client: RawClient) -> None:
        client.subscribe(self.queues[0], prefetch=self.prefetch, tag="bench.0")

    def run(self, client: RawClient) -> Outcome:
        raise AssertionError("ConsumeEach runs with its own connections (run_each)")

    def prepare_each(self, client: RawClient, endpoint: Endpoint) -> list[RawClient]:
        """The first queue on ``client``, each other one on a new connection."""
        self.prepare(client)
        clients = [client]
        for i, queue in enumerate(self.queues[1:], 1):
            extra = RawClient.connect(endpoint, timeout=STALL_SECONDS)
            extra.subscribe(queue, prefetch=self.prefetch, tag=f"bench.{i}")
            clients.append(extra)
        return clients

    def run_each(self, clients: list[RawClient]) -> Outcome:
        cpu, started = time.process_time(), time.perf_counter()
        receive_each(clients, self.count, ack_every=self.ack_every)
        finished = time.perf_counter()
        return Outcome(started, finished, self.count * len(clients), time.process_time() - cpu)


@dataclass(frozen=True)
class PacedPublish:
    """Publish ``count`` transient messages at a fixed ``rate`` (msg/s), each stamped with the
    time it is sent; a late schedule is caught up without sleeping, never skipped."""

    routing_key: str
    count: int
    rate: float
    body_size: int = BODY_SIZE

    def prepare(self, client: RawClient) -> None:
        pass

    def run(self, client: RawClient) -> Outcome:
        body = b"x" * max(self.body_size, 8)
        frames = bytearray(publish_frames(self.routing_key, body))
        offset = stamp_offset(bytes(frames), body)
        interval = 1.0 / self.rate
        sock, clock, sleep = client.sock, time.perf_counter, time.sleep
        cpu, started = time.process_time(), clock()
        due = started
        for _ in range(self.count):
            wait = due - clock()
            if wait > 0:
                sleep(wait)
            stamp(frames, offset)
            sock.sendall(frames)
            due += interval
        finished = clock()
        return Outcome(started, finished, self.count, time.process_time() - cpu)


# -- running jobs in worker processes ---------------------------------------------------------


class WorkerFailed(RuntimeError):
    """A worker process raised (the message holds its traceback) or died."""


@dataclass
class RunResult:
    """One release of a set of workers."""

    wall: float  # first start to last finish, seconds
    client_cpu: float  # the workers' CPU seconds in their run steps
    broker_cpu: float | None  # the broker's CPU seconds meanwhile (None: no pid)
    outcomes: list[Outcome] = field(default_factory=list)
    machine_cpu: float = 0.0  # CPU seconds of the whole machine meanwhile (all cores)

    @property
    def other_cpu(self) -> float:
        """Machine CPU seconds spent outside the broker and the workers' run steps: other
        processes, and kernel work charged to no process (interrupts, some loopback TCP)."""
        return max(self.machine_cpu - (self.broker_cpu or 0.0) - self.client_cpu, 0.0)

    @property
    def busiest_worker(self) -> float:
        """The highest CPU share (of one core) of any worker over its own run step: near 1.0
        that worker, not the broker, may have set the pace."""
        return max(
            (o.cpu / (o.finished - o.started) for o in self.outcomes if o.finished > o.started),
            default=0.0,
        )


def _worker(
    job: Job, endpoint: Endpoint, conn: multiprocessing.connection.Connection, go: Event
) -> None:
    try:
        # A socket silent for STALL_SECONDS raises (TimeoutError): the worker reports it.
        client = RawClient.connect(endpoint, timeout=STALL_SECONDS)
        if isinstance(job, ConsumeEach):
            clients = job.prepare_each(client, endpoint)
            conn.send(("ready", None))
            go.wait()
            outcome = job.run_each(clients)
        else:
            clients = [client]
            job.prepare(client)
            conn.send(("ready", None))
            go.wait()
            outcome = job.run(client)
        conn.send(("done", outcome))
        for each in clients:
            # Until the broker has handled all we sent: RabbitMQ, its publisher's reader held
            # back by flow control, dropped the tail of a run when the socket closed early.
            each.close(timeout=STALL_SECONDS)
    except TimeoutError:
        silent = f"the broker sent nothing for {STALL_SECONDS:g} s (or took nothing)"
        conn.send(("error", f"{silent}:\n{traceback.format_exc()}"))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def run_jobs(
    endpoint: Endpoint, jobs: list[Job], *, broker_pid: int | None, timeout: float = 1800.0
) -> RunResult:
    """Run each job in its own process, released together; see ``RunResult``. Raises
    ``WorkerFailed`` when a worker fails or dies (the others are killed) or when the run
    exceeds ``timeout`` seconds."""
    context = multiprocessing.get_context("spawn")
    go = context.Event()
    workers: list[tuple[BaseProcess, multiprocessing.connection.Connection]]
    workers = []
    try:
        for job in jobs:
            receiver, sender = context.Pipe(duplex=False)
            process: BaseProcess = context.Process(target=_worker, args=(job, endpoint, sender, go))
            process.start()
            sender.close()
            workers.append((process, receiver))
        _collect(workers, "ready", timeout=60.0)
        broker_before, machine_before = cpu_seconds(broker_pid), machine_cpu_seconds()
        go.set()
        outcomes = [_outcome(o) for o in _collect(workers, "done", timeout=timeout)]
        broker_after, machine_after = cpu_seconds(broker_pid), machine_cpu_seconds()
    finally:
        deadline = time.monotonic() + 10.0  # for all of them: a failed run ends in seconds
        for process, receiver in workers:
            process.join(timeout=max(deadline - time.monotonic(), 0.0))
            if process.is_alive():
                process.kill()  # a worker of ours that did not finish
                process.join()
            receiver.close()
    started = min(o.started for o in outcomes)
    finished = max(o.finished for o in outcomes)
    broker_cpu = (
        broker_after - broker_before
        if broker_before is not None and broker_after is not None
        else None
    )
    client_cpu = sum(o.cpu for o in outcomes)
    machine = machine_after - machine_before
    return RunResult(finished - started, client_cpu, broker_cpu, outcomes, machine)


def _collect(
    workers: list[tuple[BaseProcess, multiprocessing.connection.Connection]],
    expected: str,
    *,
    timeout: float,
) -> list[object]:
    """Each worker's next message, which must be ``expected`` (its payload), in job order."""
    deadline = time.monotonic() + timeout
    replies: dict[int, object] = {}
    pending = {id(receiver): i for i, (_p, receiver) in enumerate(workers)}
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WorkerFailed(f"workers did not report {expected!r} within {timeout:g} s")
        receivers = [workers[i][1] for i in pending.values()]
        for receiver in multiprocessing.connection.wait(receivers, timeout=min(left, 1.0)):
            assert isinstance(receiver, multiprocessing.connection.Connection)
            index = pending.pop(id(receiver))
            try:
                kind, payload = receiver.recv()
            except EOFError:
                exit_code = workers[index][0].exitcode
                raise WorkerFailed(f"worker {index} died (exit {exit_code})") from None
            if kind != expected:
                raise WorkerFailed(f"worker {index} failed:\n{payload}")
            replies[index] = payload
    return [replies[i] for i in range(len(workers))]


def _outcome(payload: object) -> Outcome:
    assert isinstance(payload, Outcome)
    return payload
