"""One Kafka client connection: size-prefixed requests in, responses out, in order (Kafka
answers a connection's requests in the order they came).

A request that does not decode, or names an API or version not served, closes the connection,
as Kafka's ``SocketServer`` does; ApiVersions at a version not served is answered with
``UNSUPPORTED_VERSION`` and the served ranges in a version 0 body (``RequestContext``), which
is how clients learn what to speak. A size prefix that is negative or over
``kafka_max_request_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB) closes the
connection too, as Kafka's ``NetworkReceive`` refuses it (``InvalidReceiveException``). A
handler's bug costs this connection only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import trio

from ...broker.broker import Broker
from ...protocol.kafka import errors
from ...protocol.kafka.requests import (
    API_VERSIONS,
    UnknownApi,
    decode_request,
    encode_response,
)
from ..addresses import local_address, peer_address, socket_of, text
from . import admin, fetch, group_listing, group_offsets, handlers, produce, sasl
from .groups import GroupCoordinator, join_error, sync_answer
from .nodes import KafkaNodes
from .session import KafkaSession

log = logging.getLogger(__name__)

RECEIVE_BYTES: Final = 256 * 1024
# Answered before a login: what a client asks first (its versions), and SASL later.
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
BEFORE_LOGIN: Final = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})

Body = Mapping[str, Any]
Handler = Callable[[KafkaSession, Body, int], Awaitable[dict[str, Any] | None]]


async def _api_versions(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    return handlers.api_versions()


# The group APIs are answered by the group's coordinator only (``KafkaNodes.coordinator``: in
# a cluster, one node per group); elsewhere NOT_COORDINATOR, and the client finds it again.


def _coordinates(session: KafkaSession, body: Body) -> bool:
    return session.nodes.coordinates(body["group_id"], session.advertised_address)


async def _join_group(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    if not _coordinates(session, body):
        return join_error(errors.NOT_COORDINATOR, body["member_id"])
    return await session.groups.join(body, version, session.client_id, session.peer[0])


async def _sync_group(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    if not _coordinates(session, body):
        return sync_answer(errors.NOT_COORDINATOR)
    return await session.groups.sync(body)


async def _heartbeat(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    if not _coordinates(session, body):
        return {"throttle_time_ms": 0, "error_code": errors.NOT_COORDINATOR}
    return {"throttle_time_ms": 0, "error_code": session.groups.heartbeat(body)}


async def _leave_group(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    if not _coordinates(session, body):
        return {"throttle_time_ms": 0, "error_code": errors.NOT_COORDINATOR, "members": []}
    code = session.groups.leave(body["group_id"], [body["member_id"]])
    return {"throttle_time_ms": 0, "error_code": code, "members": []}


HANDLERS: Mapping[int, Handler] = {
    0: produce.produce,
    1: fetch.fetch,
    2: handlers.list_offsets,
    3: handlers.metadata,
    8: group_offsets.offset_commit,
    9: group_offsets.offset_fetch,
    10: group_offsets.find_coordinator,
    11: _join_group,
    12: _heartbeat,
    13: _leave_group,
    14: _sync_group,
    15: group_listing.describe_groups,
    16: group_listing.list_groups,
    17: sasl.sasl_handshake,
    18: _api_versions,
    19: admin.create_topics,
    20: admin.delete_topics,
    22: handlers.init_producer_id,
    32: admin.describe_configs,
    36: sasl.sasl_authenticate,
    37: admin.create_partitions,
    44: admin.incremental_alter_configs,
}


class KafkaConnection:
    def __init__(
        self,
        broker: Broker,
        groups: GroupCoordinator,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        certificate_username: str | None = None,
        nodes: KafkaNodes | None = None,
    ) -> None:
        self.stream = stream
        sock = socket_of(stream)
        peer = peer_address(sock)
        self.peer = text(peer)
        self.max_request_bytes = broker.config.kafka_max_request_bytes
        self.session = KafkaSession(
            broker, groups, peer, local_address(sock), certificate_username, nodes
        )

    async def run(self) -> None:
        buffer = bytearray()
        try:
            while True:
                size = await self._receive_size(buffer)
                if size is None:
                    return
                while len(buffer) < 4 + size:
                    data = await self.stream.receive_some(RECEIVE_BYTES)
                    if not data:
                        return
                    buffer += data
                frame = bytes(buffer[4 : 4 + size])
                del buffer[: 4 + size]
                response = await self._answer(frame)
                if response is not None:
                    await self.stream.send_all(response)
        except _Close as close:
            if close.args:  # the answer first
                with contextlib.suppress(
                    trio.BrokenResourceError, trio.ClosedResourceError, OSError
                ):
                    await self.stream.send_all(close.args[0])
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        finally:
            await trio.aclose_forcefully(self.stream)

    async def _receive_size(self, buffer: bytearray) -> int | None:
        """The next request's size prefix (an INT32), received into ``buffer`` if need be;
        None when the client closed, or sent a size that is negative or over the limit (closed
        before its body is read, as Kafka's ``NetworkReceive`` refuses it)."""
        while len(buffer) < 4:
            data = await self.stream.receive_some(RECEIVE_BYTES)
            if not data:
                return None
            buffer += data
        size = int.from_bytes(buffer[:4], "big", signed=True)
        if not 0 <= size <= self.max_request_bytes:
            log.info(
                "kafka %s: a request size of %d (not 0..%d): closing",
                self.peer,
                size,
                self.max_request_bytes,
            )
            return None
        return size

    async def _answer(self, frame: bytes) -> bytes | None:
        if self.session.unframed_tokens:  # a SASL token after a version 0 handshake
            reply = await sasl.unframed_token(self.session, frame)
            if reply is None:
                log.info("kafka %s: a SASL login refused: closing", self.peer)
                raise _Close
            return reply
        try:
            header, body = decode_request(frame)
        except UnknownApi as exc:
            if exc.header.api_key == API_VERSIONS:  # answered in a version 0 body
                error = handlers.api_versions(errors.UNSUPPORTED_VERSION)
                return encode_response(exc.header._replace(api_version=0), error)
            log.info("kafka %s: %s: closing the connection", self.peer, exc)
            raise _Close from None
        except ValueError as exc:
            log.info("kafka %s: a request that does not decode (%s): closing", self.peer, exc)
            raise _Close from None
        handler = HANDLERS.get(header.api_key)
        served = handlers.SERVED.get(header.api_key)
        if handler is None or served is None or not served[0] <= header.api_version <= served[1]:
            if header.api_key == API_VERSIONS:
                error = handlers.api_versions(errors.UNSUPPORTED_VERSION)
                return encode_response(header._replace(api_version=0), error)
            log.info("kafka %s: %r is not served: closing the connection", self.peer, header)
            raise _Close
        session = self.session
        if session.user is None and header.api_key not in BEFORE_LOGIN:
            if session.mechanism is not None:  # a SASL handshake, and no login after it
                log.info("kafka %s: %r before its SASL login: closing", self.peer, header)
                raise _Close
            refused = await session.log_in_without_sasl()
            if refused is not None:
                log.info("kafka %s: a connection without SASL refused: %s", self.peer, refused)
                raise _Close
        self.session.client_id = header.client_id or ""
        answer = await handler(self.session, body, header.api_version)
        if answer is None:  # a Produce with acks=0
            return None
        response = encode_response(header, answer)
        if header.api_key == SASL_AUTHENTICATE and answer["error_code"] != errors.NONE:
            raise _Close(response)  # Kafka closes the connection after a failed login
        return response


class _Close(Exception):
    """Close the connection (Kafka's answer to a request it cannot take)."""
