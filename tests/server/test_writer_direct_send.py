"""The connection writer's direct send (``server/writer.py``, ``send_or_wake``): a lone delivery
goes out at once from the task that made it, a burst right after it waits for the writer task
(one system call for the rest), over real loopback sockets."""

from __future__ import annotations

import pytest
import trio.testing

from tqbroker.broker.stats import ConnectionStats
from tqbroker.model import Message
from tqbroker.server import writer as writer_module
from tqbroker.server.writer import ConnectionWriter


async def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return client, server


async def _receive(stream: trio.SocketStream, size: int) -> bytes:
    got = b""
    with trio.fail_after(5):
        while len(got) < size:
            got += await stream.receive_some(size - len(got))
    return got


async def test_a_lone_delivery_goes_out_without_the_writer_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writer_module, "DIRECT_SEND_GAP_NS", 10**12)  # no timing in the test
    client, server = await _pair()
    stats = ConnectionStats()
    writer = ConnectionWriter(server, stats, "test", lambda: None)
    writer.out += b"first"
    writer.send_or_wake()  # the writer task is not even running
    assert not writer.out
    assert await _receive(client, 5) == b"first"
    assert (stats.send_oct, stats.send_cnt) == (5, 1)
    # Within the gap (a burst): left to the writer task, which sends the rest at once.
    writer.out += b"second"
    writer.send_or_wake()
    writer.out += b"third"
    assert writer.out == b"secondthird"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        assert await _receive(client, 11) == b"secondthird"
        nursery.cancel_scope.cancel()
    assert (stats.send_oct, stats.send_cnt) == (16, 2)
    await client.aclose()
    await server.aclose()


async def test_no_direct_send_once_the_writer_ended() -> None:
    client, server = await _pair()
    writer = ConnectionWriter(server, ConnectionStats(), "test", lambda: None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        await trio.testing.wait_all_tasks_blocked()
        await writer.finish()
    writer.out += b"late"
    writer.send_or_wake()  # the socket may close and its number be reused: never written
    assert writer.out == b"late"
    await server.aclose()
    with trio.fail_after(5):
        assert await client.receive_some(10) == b""
    await client.aclose()


async def test_a_lone_delivery_of_a_queue_pass_goes_out_at_once_a_batch_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A classic queue delivers through ``deliver_many`` (a pass's batch): a batch of one on
    an idle connection (a queue at a low rate) is sent by the task that made it; a bigger one
    (a prefetch window) goes through the writer task, which gathers the round's passes."""
    monkeypatch.setattr(writer_module, "DIRECT_SEND_GAP_NS", 0)
    client, server = await _pair()
    stats = ConnectionStats()
    writer = ConnectionWriter(server, stats, "test", lambda: None)
    message = Message("", "q", b"\x00\x00", b"body")
    writer.deliver_many(1, b"ctag", 1, [(1, message, False)], 131072)
    assert not writer.out  # sent, without the writer task
    assert stats.send_cnt == 1
    first = await _receive(client, stats.send_oct)
    writer.deliver_many(1, b"ctag", 2, [(2, message, False), (3, message, False)], 131072)
    batch = bytes(writer.out)
    assert batch  # left to the writer task
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        assert await _receive(client, len(batch)) == batch
        nursery.cancel_scope.cancel()
    assert first.endswith(b"body\xce")
    await client.aclose()
    await server.aclose()
