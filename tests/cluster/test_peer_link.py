"""The node-to-node link over real TCP on 127.0.0.1: requests and replies multiplexed on one
connection, handler failures as error replies, the handshake refusing a wrong secret (on
either side) or the wrong node, losing the server and reconnecting, timeouts, bad input closing
only its own connection, and a follower's fetch carried as binary frames."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from tests.support.polling import eventually_async
from tqbroker.cluster.fetch import FetchRequest, FetchResponse
from tqbroker.cluster.peer_link import (
    HANDLER_FAILED,
    Connect,
    Handler,
    LinkSettings,
    PeerClient,
    PeerError,
    PeerServer,
    PeerTimeout,
    PeerUnavailable,
    connect_tcp,
    serve_tcp,
)
from tqbroker.cluster.peer_protocol import Kind, PeerConnection, Request, Role, State, encode_frame

SECRET = b"s" * 32
OTHER_SECRET = b"t" * 32
SETTINGS = LinkSettings(reconnect_initial=0.01, reconnect_max=0.05, request_timeout=10)


async def echo(peer_id: str, op: str, body: Any) -> Any:
    if op == "fail":
        raise ValueError(f"boom {body}")
    if op == "refuse":
        raise PeerError("not_leader_or_follower", "ask node c")
    if op == "hang":
        await trio.sleep_forever()
    return [peer_id, op, body]


@asynccontextmanager
async def serving(
    handler: Handler = echo, *, secret: bytes = SECRET, port: int = 0
) -> AsyncIterator[int]:
    """Node ``b``'s link served on 127.0.0.1 while the block runs; yields its port."""
    async with trio.open_nursery() as nursery:
        server = PeerServer("b", secret, handler, SETTINGS)
        yield await nursery.start(serve_tcp, server, "127.0.0.1", port)
        nursery.cancel_scope.cancel()


def counting(connect: Connect, attempts: list[int]) -> Connect:
    async def counted() -> trio.abc.Stream:
        attempts.append(1)
        return await connect()

    return counted


def client(port: int, *, secret: bytes = SECRET, peer_id: str = "b") -> PeerClient:
    return PeerClient(
        "a", secret, connect_tcp("127.0.0.1", port), peer_id=peer_id, settings=SETTINGS
    )


async def test_a_request_gets_its_reply():
    with trio.fail_after(10):
        async with serving() as port, client(port) as peer:
            assert await peer.request("echo", {"n": 1, "b": b"\0\1"}) == [
                "a",
                "echo",
                {"n": 1, "b": b"\0\1"},
            ]


async def test_200_concurrent_requests_share_one_connection_and_are_answered_out_of_order():
    count = 200
    released = [trio.Event() for _ in range(count)]
    arrived: list[int] = []
    answered: list[int] = []

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        arrived.append(body)
        await released[body].wait()
        answered.append(body)
        return body * 2

    async def release_in_reverse() -> None:
        await eventually_async(lambda: len(arrived) == count, what="all requests in flight")
        for event in reversed(released):
            event.set()
            await trio.lowlevel.checkpoint()

    results: dict[int, Any] = {}
    attempts: list[int] = []
    with trio.fail_after(20):
        async with serving(handler) as port:
            peer = PeerClient(
                "a",
                SECRET,
                counting(connect_tcp("127.0.0.1", port), attempts),
                peer_id="b",
                settings=SETTINGS,
            )
            async with peer, trio.open_nursery() as nursery:

                async def ask(n: int) -> None:
                    results[n] = await peer.request("double", n)

                for n in range(count):
                    nursery.start_soon(ask, n)
                nursery.start_soon(release_in_reverse)
    assert results == {n: n * 2 for n in range(count)}
    assert answered == list(reversed(range(count)))
    assert len(attempts) == 1


async def test_a_handler_exception_is_an_error_reply_and_the_connection_carries_on(caplog):
    attempts: list[int] = []
    with trio.fail_after(10):
        async with serving() as port:
            connect = counting(connect_tcp("127.0.0.1", port), attempts)
            async with PeerClient("a", SECRET, connect, peer_id="b", settings=SETTINGS) as peer:
                with pytest.raises(PeerError) as failed:
                    await peer.request("fail", 7)
                assert failed.value.code == HANDLER_FAILED
                assert failed.value.text == "ValueError: boom 7"
                with pytest.raises(PeerError) as refused:
                    await peer.request("refuse", None)
                assert (refused.value.code, refused.value.text) == (
                    "not_leader_or_follower",
                    "ask node c",
                )
                assert await peer.request("echo", 1) == ["a", "echo", 1]
    assert len(attempts) == 1
    assert "'a': fail failed" in caplog.text


async def test_a_client_with_the_wrong_secret_refuses_the_server():
    called: list[str] = []

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        called.append(op)

    with trio.fail_after(10):
        async with serving(handler) as port, client(port, secret=OTHER_SECRET) as peer:
            with pytest.raises(PeerUnavailable, match="'b' does not hold the cluster secret"):
                await peer.request("echo", 1)
            # The failed attempt backs off: the next request fails at once, saying why.
            with pytest.raises(PeerUnavailable, match=r"cluster secret.*next attempt in"):
                await peer.request("echo", 1)
    assert called == []


async def test_a_server_refuses_a_client_without_the_secret(caplog):
    with trio.fail_after(10):
        async with (
            serving() as port,
            await trio.open_tcp_stream("127.0.0.1", port) as stream,
        ):
            impostor = PeerConnection(Role.INITIATOR, "a", OTHER_SECRET)
            await stream.send_all(impostor.data_to_send())
            assert await stream.receive_some()  # the challenge
            await stream.send_all(encode_frame([Kind.PROOF, b"\0" * 32]))
            await stream.send_all(encode_frame([Kind.REQUEST, 1, "echo", None]))
            assert await until_closed(stream) == b""
    assert "refused: protocol error: node 'a' does not hold the cluster secret" in caplog.text


async def until_closed(stream: trio.SocketStream) -> bytes:
    """What the stream sends before it closes (a reset counts as closed)."""
    received = b""
    try:
        while data := await stream.receive_some():
            received += data
    except trio.BrokenResourceError:
        pass
    return received


async def test_a_client_refuses_a_server_that_is_not_the_node_it_dialled():
    with trio.fail_after(10):
        async with serving() as port, client(port, peer_id="c") as peer:
            with pytest.raises(PeerUnavailable, match="the peer is node 'b', not 'c'"):
                await peer.request("echo", 1)


async def test_bad_input_closes_only_its_own_connection(caplog):
    with trio.fail_after(10):
        async with serving() as port, client(port) as peer:
            assert await peer.request("echo", 1) == ["a", "echo", 1]
            async with await trio.open_tcp_stream("127.0.0.1", port) as garbage:
                await garbage.send_all(b"\0\0\0\3\xff\xff\xff")
                assert await until_closed(garbage) == b""
            async with await trio.open_tcp_stream("127.0.0.1", port) as unauthenticated:
                await unauthenticated.send_all(encode_frame([Kind.REQUEST, 1, "echo", None]))
                assert await until_closed(unauthenticated) == b""
            assert await peer.request("echo", 2) == ["a", "echo", 2]
    assert "undecodable frame" in caplog.text
    assert "request before the handshake completed" in caplog.text


async def test_losing_the_server_fails_requests_in_flight_then_the_client_reconnects():
    hanging = trio.Event()

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        hanging.set()
        await trio.sleep_forever()

    server_scope = trio.CancelScope()

    async def first_server(*, task_status: trio.TaskStatus[int]) -> None:
        with server_scope:
            server = PeerServer("b", SECRET, handler, SETTINGS)
            await serve_tcp(server, "127.0.0.1", 0, task_status=task_status)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(first_server)
            async with client(port) as peer, trio.open_nursery() as requests:

                async def in_flight() -> None:
                    with pytest.raises(PeerUnavailable, match="peer closed the connection"):
                        await peer.request("hang", None)

                requests.start_soon(in_flight)
                await hanging.wait()
                server_scope.cancel()
                await eventually_async(lambda: not requests.child_tasks, what="the failure")
                with pytest.raises(PeerUnavailable, match="cannot connect"):
                    await peer.request("echo", 1)
                async with serving(port=port):

                    async def answered() -> Any:
                        try:
                            return await peer.request("echo", 2)
                        except PeerUnavailable:  # backing off from the failed attempt
                            return None

                    reply = await eventually_async(answered, what="the client reconnected")
                    assert reply == ["a", "echo", 2]


async def test_a_request_times_out_and_the_link_still_works():
    with trio.fail_after(10):
        async with serving() as port, client(port) as peer:
            with pytest.raises(PeerTimeout, match=r"'hang' within 0\.2 s"):
                await peer.request("hang", None, timeout=0.2)
            assert await peer.request("echo", 1) == ["a", "echo", 1]


async def test_nothing_listening_is_unavailable():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    await listeners[0].aclose()
    with trio.fail_after(10):
        async with client(port) as peer:
            with pytest.raises(PeerUnavailable, match="cannot connect to node 'b'"):
                await peer.request("echo", 1)


async def test_closing_the_client_fails_its_requests():
    hanging = trio.Event()

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        hanging.set()
        await trio.sleep_forever()

    with trio.fail_after(10):
        async with serving(handler) as port:
            peer = client(port)
            async with trio.open_nursery() as nursery:

                async def in_flight() -> None:
                    with pytest.raises(PeerUnavailable, match="the client was closed"):
                        await peer.request("hang", None)

                nursery.start_soon(in_flight)
                await hanging.wait()
                await peer.aclose()
            with pytest.raises(PeerUnavailable, match="closed"):
                await peer.request("echo", 1)


async def test_a_fetch_travels_the_link_as_binary_frames():
    frames = [(bytes(range(256)), b"\xff" * 70_000), (b"\0", b"")]
    response = FetchResponse(
        epoch=3, high_watermark=10, log_start=2, frames_epoch=3, frames=frames, diverging=None
    )
    seen: list[FetchRequest] = []

    async def leader(peer_id: str, op: str, body: Any) -> Any:
        assert op == "fetch"
        seen.append(FetchRequest.decode(body))
        return response.encode()

    request = FetchRequest(
        partition="/s",
        follower="a",
        replica_id="r1",
        epoch=3,
        fetch_offset=8,
        durable_end=8,
        last_epoch=3,
    )
    with trio.fail_after(10):
        async with serving(leader) as port, client(port) as peer:
            reply = FetchResponse.decode(await peer.request("fetch", request.encode()))
    assert seen == [request]
    assert reply == response


async def test_the_server_runs_at_most_max_in_flight_handlers_of_a_connection():
    running, most = 0, 0

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        nonlocal running, most
        running += 1
        most = max(most, running)
        for _ in range(5):
            await trio.lowlevel.checkpoint()
        running -= 1
        return body

    settings = attrs.evolve(SETTINGS, max_in_flight=4)
    results: list[Any] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = PeerServer("b", SECRET, handler, settings)
            port = await nursery.start(serve_tcp, server, "127.0.0.1", 0)
            async with client(port) as peer, trio.open_nursery() as requests:
                for n in range(40):
                    requests.start_soon(ask, peer, n, results)
            nursery.cancel_scope.cancel()
    assert sorted(results) == list(range(40))
    assert most == 4


async def ask(peer: PeerClient, n: int, results: list[Any]) -> None:
    results.append(await peer.request("echo", n))


async def test_a_reply_over_the_frame_limit_is_an_error_reply():
    async def handler(peer_id: str, op: str, body: Any) -> Any:
        return b"x" * body

    settings = attrs.evolve(SETTINGS, max_frame=10_000)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = PeerServer("b", SECRET, handler, settings)
            port = await nursery.start(serve_tcp, server, "127.0.0.1", 0)
            async with client(port) as peer:
                with pytest.raises(PeerError, match="LocalProtocolError: a frame of"):
                    await peer.request("big", 20_000)
                assert await peer.request("big", 10) == b"x" * 10
            nursery.cancel_scope.cancel()


async def test_a_timeout_keeps_a_connection_that_answers_other_requests():
    hanging = trio.Event()

    async def handler(peer_id: str, op: str, body: Any) -> Any:
        if op == "hang":
            hanging.set()
            await trio.sleep_forever()
        return body

    attempts: list[int] = []
    with trio.fail_after(10):
        async with serving(handler) as port:
            connect = counting(connect_tcp("127.0.0.1", port), attempts)
            async with PeerClient("a", SECRET, connect, peer_id="b", settings=SETTINGS) as peer:
                async with trio.open_nursery() as nursery:

                    async def hang() -> None:
                        with pytest.raises(PeerTimeout):
                            await peer.request("hang", None, timeout=2)

                    nursery.start_soon(hang)
                    await hanging.wait()
                    assert await peer.request("echo", 1) == 1
                assert await peer.request("echo", 2) == 2
    assert len(attempts) == 1


async def test_a_client_that_never_completes_the_handshake_is_dropped(caplog):
    settings = attrs.evolve(SETTINGS, handshake_timeout=0.2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            server = PeerServer("b", SECRET, echo, settings)
            port = await nursery.start(serve_tcp, server, "127.0.0.1", 0)
            async with await trio.open_tcp_stream("127.0.0.1", port) as silent:
                assert await until_closed(silent) == b""
            nursery.cancel_scope.cancel()
    assert "refused: the handshake timed out" in caplog.text


async def test_a_server_that_never_answers_the_hello_is_unavailable():
    async def mute(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    settings = attrs.evolve(SETTINGS, handshake_timeout=0.2)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, host="127.0.0.1"), mute, 0)
            port = listeners[0].socket.getsockname()[1]
            connect = connect_tcp("127.0.0.1", port)
            async with PeerClient("a", SECRET, connect, peer_id="b", settings=settings) as peer:
                with pytest.raises(PeerUnavailable, match=r"no connection to node 'b' within"):
                    await peer.request("echo", 1)
            nursery.cancel_scope.cancel()


async def test_the_link_runs_over_memory_streams_as_in_the_simulation():
    server = PeerServer("b", SECRET, echo, SETTINGS)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:

            async def connect() -> trio.abc.Stream:
                ours, theirs = trio.testing.memory_stream_pair()
                nursery.start_soon(server.serve_stream, theirs)
                return ours

            async with PeerClient("a", SECRET, connect, peer_id="b", settings=SETTINGS) as peer:
                assert await peer.request("echo", b"\0") == ["a", "echo", b"\0"]


async def test_a_peer_gone_before_its_answer_costs_the_server_nothing():
    """The asking node dies while the handler runs (a fetch's long poll, a leader's kill -9 on
    the other side): the answer has nobody to go to and is dropped; the server serves on. (The
    race seen under load, a handler answering after the connection's state went CLOSED but
    before the link's end cancelled it, raised ``LocalProtocolError`` out of the server and took
    the broker down; it is not reproduced here deterministically.)"""
    answer = trio.Event()

    async def slow(peer_id: str, op: str, body: Any) -> Any:
        await answer.wait()
        return body

    with trio.fail_after(10):
        async with serving(slow) as port:
            async with client(port) as gone, trio.open_nursery() as nursery:

                async def ask() -> None:
                    with pytest.raises(PeerUnavailable):
                        await gone.request("fetch", 1)

                nursery.start_soon(ask)
                await trio.testing.wait_all_tasks_blocked()
                await gone.aclose()  # its connection closes with the request in flight
            await trio.sleep(0.05)  # the server sees the connection end
            answer.set()
            async with client(port) as peer:
                assert await peer.request("fetch", 2) == 2


@pytest.mark.parametrize("fails", [False, True])
async def test_an_answer_after_the_link_closed_is_dropped(fails: bool):
    """The race behind the test above, made deterministic: the connection's state goes CLOSED
    while the handler runs (its answer or its failure), before the link's end cancels it. The
    answer is dropped and nothing escapes the handler's task (before the fix it raised
    ``LocalProtocolError: cannot send in state CLOSED`` into the broker's nursery)."""
    connection = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    connection.state = State.OPEN

    async def closing(peer_id: str, op: str, body: Any) -> Any:
        connection.state = State.CLOSED
        if fails:
            raise RuntimeError("the store went away")
        return body

    frames_in, frames_out = trio.open_memory_channel[bytes](10)
    in_flight = trio.Semaphore(1)
    await in_flight.acquire()
    server = PeerServer("b", SECRET, closing, SETTINGS)
    await server._answer(connection, "a", Request(1, "fetch", 1), frames_in, in_flight)
    assert in_flight.value == 1
    with pytest.raises(trio.WouldBlock):
        frames_out.receive_nowait()
