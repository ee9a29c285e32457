"""A broker's storage environment is its own: two brokers in one ``trio.run``, each on a
recording disk of its own, both confirming publishes; the power is cut to one of them alone.
The other's disk records none of the first one's operations and keeps serving every message
it confirmed; the one cut recovers with every message it confirmed, on each crash state."""

from __future__ import annotations

from pathlib import Path

import pika
import trio

from tqbroker.storage_env import StorageEnv
from tqbroker.testing import running_broker, start_broker

from .broker_workload import PERSISTENT, config
from .crashstates import crash_states, materialize
from .recorder import Op, Recorder
from .workloads import body, ident

MESSAGES = 200


def publish_confirmed(url: str, queue: str, recorder: Recorder) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for n in range(MESSAGES):
        channel.basic_publish("", queue, body(queue, n), PERSISTENT, mandatory=True)
        recorder.mark(confirmed=[(queue, n)])
    connection.close()


def drain(url: str, queue: str) -> list[tuple[str, int] | None]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    got = []
    while True:
        method, _properties, data = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append(ident(data))
    connection.close()
    return got


def recording(directory: Path) -> Recorder:
    directory.mkdir()
    return Recorder(directory)


def test_a_power_cut_to_one_broker_leaves_the_other_alone(tmp_path: Path) -> None:
    cut, kept = recording(tmp_path / "cut"), recording(tmp_path / "kept")
    traces: dict[str, list[Op]] = {}
    kept_got: list[tuple[str, int] | None] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            a = await start_broker(nursery, config(cut.root), env=StorageEnv.default(cut))
            b = await start_broker(nursery, config(kept.root), env=StorageEnv.default(kept))
            async with trio.open_nursery() as clients:
                clients.start_soon(trio.to_thread.run_sync, publish_confirmed, a.url, "qa", cut)
                clients.start_soon(trio.to_thread.run_sync, publish_confirmed, b.url, "qb", kept)
            # The power cut to ``a``: its disk is what its trace made durable, now.
            traces["cut"] = list(cut.ops)
            before = len(kept.ops)
            # ``b`` goes on: everything it confirmed is there (read from its own disk).
            kept_got.extend(await trio.to_thread.run_sync(drain, b.url, "qb"))
            traces["kept"] = list(kept.ops[:before])
            nursery.cancel_scope.cancel()

    trio.run(main)

    assert kept_got == [("qb", n) for n in range(MESSAGES)]
    for name, other in (("cut", "qb"), ("kept", "qa")):  # neither disk saw the other's writes
        writes = b"".join(op[3] for op in traces[name] if op[0] == "write")
        assert f"{other}-".encode() not in writes
    confirmed = {
        tuple(who) for op in traces["cut"] if op[0] == "mark" for who in op[1]["confirmed"]
    }
    assert len(confirmed) == MESSAGES
    ends = [s for s in crash_states(traces["cut"], points=2) if s.point == len(traces["cut"])]
    assert ends
    for n, state in enumerate(ends):
        target = tmp_path / f"crash-{n}"
        target.mkdir()
        materialize(state, target)
        with running_broker(config(target)) as recovered:
            got = drain(recovered.url, "qa")
        assert set(got) >= confirmed, f"{state.variant}: lost {sorted(confirmed - set(got))[:5]}"
