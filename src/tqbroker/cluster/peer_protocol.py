"""The node-to-node link's wire protocol, sans-IO (in the style of h11): frames, messages, the
handshake on the cluster secret, and one connection's state machine. ``peer_link.py`` drives it
over Trio streams; nothing here does I/O.

Responsibilities:
- frames: a 4-byte big-endian length, then that many bytes of one CBOR value (an array whose
  first item is the message kind); a frame over the connection's ``max_frame`` is refused, and
  before the handshake completes only small frames (``HANDSHAKE_MAX_FRAME``) are accepted;
- messages: ``hello`` (the initiator's version, node id and nonce), ``challenge`` (the
  acceptor's version, node id, nonce and proof), ``proof`` (the initiator's proof), then
  ``request`` (id, op, body) from the initiator and ``reply`` (id, body) or ``error`` (id, code,
  text) from the acceptor;
- the handshake: each side sends a random nonce and proves it holds the cluster secret with an
  HMAC-SHA256 over its role, both node ids and both nonces (compared with
  ``hmac.compare_digest``); the acceptor proves first, so an initiator with the wrong secret
  stops before it sends anything that depends on the secret. It authenticates the peer; it does
  not encrypt or sign the frames that follow (the link belongs on a private network, or in TLS);
- ``PeerConnection``: ``receive_data(bytes)`` returns the events the bytes complete,
  ``send_request``/``send_reply``/``send_error`` return the bytes to write, ``data_to_send()``
  the handshake's own output. Bad input raises ``PeerProtocolError`` (``PeerAuthError`` for a
  failed handshake): the caller closes that connection, and the state machine refuses more.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import io
import secrets
import struct
from typing import Any, Final

import attrs
import cbor2

VERSION: Final = 1
NONCE_BYTES: Final = 32
DEFAULT_MAX_FRAME: Final = 16 << 20
HANDSHAKE_MAX_FRAME: Final = 1024  # what a peer may send before it is authenticated
MAX_REQUEST_ID: Final = (1 << 63) - 1

_LENGTH = struct.Struct(">I")
_MAC_LABEL: Final = "tqbroker peer link v1"


class PeerProtocolError(Exception):
    """The peer sent something this protocol does not allow: close the connection."""


class PeerAuthError(PeerProtocolError):
    """The handshake failed: the peer does not hold the cluster secret, or is not the node this
    side expected."""


class LocalProtocolError(Exception):
    """This side tried to send something its state forbids (a bug in the caller)."""


class Role(enum.Enum):
    INITIATOR = "initiator"  # the side that connected: it sends requests
    ACCEPTOR = "acceptor"  # the side that accepted: it replies


class Kind(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    PROOF = 3
    REQUEST = 4
    REPLY = 5
    ERROR = 6


class State(enum.Enum):
    AWAIT_HELLO = enum.auto()  # acceptor, before the initiator's hello
    AWAIT_CHALLENGE = enum.auto()  # initiator, hello sent
    AWAIT_PROOF = enum.auto()  # acceptor, challenge sent
    OPEN = enum.auto()
    CLOSED = enum.auto()  # the peer closed, or a protocol error


@attrs.frozen
class HandshakeComplete:
    """The peer proved it holds the cluster secret: requests may flow."""

    peer_id: str


@attrs.frozen
class Request:
    id: int
    op: str
    body: Any


@attrs.frozen
class Reply:
    id: int
    body: Any


@attrs.frozen
class ErrorReply:
    id: int
    code: str
    text: str


@attrs.frozen
class EndOfStream:
    """The peer closed its side cleanly (between frames)."""


Event = HandshakeComplete | Request | Reply | ErrorReply | EndOfStream


def encode_frame(message: list[Any]) -> bytes:
    """One frame: the length prefix and the CBOR encoding of ``message``."""
    body = cbor2.dumps(message)
    return _LENGTH.pack(len(body)) + body


class FrameBuffer:
    """Reassembles frames from bytes received in pieces of any size."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._start = 0  # where the next frame begins (consumed bytes are cut in ``feed``)

    def __len__(self) -> int:
        return len(self._buffer) - self._start

    def feed(self, data: bytes | bytearray) -> None:
        del self._buffer[: self._start]
        self._start = 0
        self._buffer += data

    def next_frame(self, max_frame: int) -> bytes | None:
        """The next complete frame's body, None if it is still incomplete; raises on a frame
        over ``max_frame`` as soon as its length is known."""
        buffer, start = self._buffer, self._start
        if len(buffer) - start < _LENGTH.size:
            return None
        (length,) = _LENGTH.unpack_from(buffer, start)
        if length > max_frame:
            raise PeerProtocolError(f"frame of {length} bytes (at most {max_frame})")
        end = start + _LENGTH.size + length
        if end > len(buffer):
            return None
        self._start = end
        with memoryview(buffer) as view, view[start + _LENGTH.size : end] as body:
            return bytes(body)  # one copy (a bytearray's slice would be a second)


def decode_message(body: bytes) -> tuple[Kind, list[Any]]:
    """A frame body's kind and fields; raises ``PeerProtocolError`` on anything else."""
    stream = io.BytesIO(body)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except Exception as exc:  # cbor2 raises more than CBORDecodeError on some garbage
        raise PeerProtocolError(f"undecodable frame: {exc}") from exc
    if stream.tell() != len(body):
        raise PeerProtocolError("bytes after the frame's value")
    if not isinstance(value, list) or not value or type(value[0]) is not int:
        raise PeerProtocolError("a frame is an array that starts with its kind")
    try:
        kind = Kind(value[0])
    except ValueError:
        raise PeerProtocolError(f"unknown message kind {value[0]}") from None
    return kind, value[1:]


def handshake_mac(
    secret: bytes,
    role: Role,
    initiator_id: str,
    acceptor_id: str,
    initiator_nonce: bytes,
    acceptor_nonce: bytes,
) -> bytes:
    """What the side in ``role`` sends to prove it holds ``secret`` (the fields as one CBOR
    array: no concatenation of two fields can pass for another)."""
    message = cbor2.dumps(
        [_MAC_LABEL, role.value, initiator_id, acceptor_id, initiator_nonce, acceptor_nonce]
    )
    return hmac.new(secret, message, hashlib.sha256).digest()


class PeerConnection:
    """One end of a link (see the module doc). ``expected_peer``: the node id the peer must
    claim (the initiator knows whom it dialled); None accepts any node holding the secret."""

    def __init__(
        self,
        role: Role,
        node_id: str,
        secret: bytes,
        *,
        expected_peer: str | None = None,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        if not secret:
            raise ValueError("the cluster secret is empty")
        self.role = role
        self.node_id = node_id
        self.expected_peer = expected_peer
        self.max_frame = max_frame
        self.peer_id: str | None = None
        self._secret = secret
        self._nonce = secrets.token_bytes(NONCE_BYTES)
        self._peer_nonce = b""
        self._frames = FrameBuffer()
        self._outgoing = bytearray()
        if role is Role.INITIATOR:
            self.state = State.AWAIT_CHALLENGE
            self._outgoing += encode_frame([Kind.HELLO, VERSION, node_id, self._nonce])
        else:
            self.state = State.AWAIT_HELLO

    def data_to_send(self) -> bytes:
        """The handshake's bytes this side has yet to write (the initiator's hello from the
        start; the acceptor's challenge after the hello)."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    def receive_data(self, data: bytes | bytearray) -> list[Event]:
        """The events ``data`` completes; ``b""`` is the end of the peer's stream."""
        if self.state is State.CLOSED:
            raise PeerProtocolError("the connection is closed")
        try:
            if not data:
                if len(self._frames):
                    raise PeerProtocolError("the stream ended inside a frame")
                self.state = State.CLOSED
                return [EndOfStream()]
            self._frames.feed(data)
            events: list[Event] = []
            while True:
                # The limit rises once the peer is authenticated (for frames in the same read).
                limit = self.max_frame if self.state is State.OPEN else HANDSHAKE_MAX_FRAME
                body = self._frames.next_frame(limit)
                if body is None:
                    return events
                event = self._handle(*decode_message(body))
                if event is not None:
                    events.append(event)
        except PeerProtocolError:
            self.state = State.CLOSED
            raise

    def send_request(self, request_id: int, op: str, body: Any) -> bytes:
        self._require(Role.INITIATOR)
        return self._frame([Kind.REQUEST, request_id, op, body])

    def send_reply(self, request_id: int, body: Any) -> bytes:
        self._require(Role.ACCEPTOR)
        return self._frame([Kind.REPLY, request_id, body])

    def send_error(self, request_id: int, code: str, text: str) -> bytes:
        self._require(Role.ACCEPTOR)
        return self._frame([Kind.ERROR, request_id, code, text])

    def _require(self, role: Role) -> None:
        if self.state is not State.OPEN:
            raise LocalProtocolError(f"cannot send in state {self.state.name}")
        if self.role is not role:
            raise LocalProtocolError(f"the {self.role.value} cannot send that")

    def _frame(self, message: list[Any]) -> bytes:
        frame = encode_frame(message)
        if len(frame) - _LENGTH.size > self.max_frame:
            raise LocalProtocolError(f"a frame of {len(frame)} bytes (at most {self.max_frame})")
        return frame

    def _handle(self, kind: Kind, fields: list[Any]) -> Event | None:
        if self.state is State.OPEN:
            return self._open_message(kind, fields)
        if self.state is State.AWAIT_HELLO and kind is Kind.HELLO:
            self._hello(fields)  # the challenge goes out; nothing to report yet
            return None
        if self.state is State.AWAIT_CHALLENGE and kind is Kind.CHALLENGE:
            return self._challenge(fields)
        if self.state is State.AWAIT_PROOF and kind is Kind.PROOF:
            return self._proof(fields)
        raise PeerProtocolError(f"{kind.name.lower()} before the handshake completed")

    def _hello(self, fields: list[Any]) -> None:
        version, peer_id, peer_nonce = _fields(fields, int, str, bytes, what="hello")
        self._check_peer(version, peer_id, peer_nonce)
        mac = self._mac(Role.ACCEPTOR)
        self._outgoing += encode_frame([Kind.CHALLENGE, VERSION, self.node_id, self._nonce, mac])
        self.state = State.AWAIT_PROOF

    def _challenge(self, fields: list[Any]) -> Event:
        version, peer_id, peer_nonce, mac = _fields(
            fields, int, str, bytes, bytes, what="challenge"
        )
        self._check_peer(version, peer_id, peer_nonce)
        if not hmac.compare_digest(mac, self._mac(Role.ACCEPTOR)):
            raise PeerAuthError(f"node {peer_id!r} does not hold the cluster secret")
        self._outgoing += encode_frame([Kind.PROOF, self._mac(Role.INITIATOR)])
        self.state = State.OPEN
        return HandshakeComplete(peer_id)

    def _proof(self, fields: list[Any]) -> Event:
        (mac,) = _fields(fields, bytes, what="proof")
        if not hmac.compare_digest(mac, self._mac(Role.INITIATOR)):
            raise PeerAuthError(f"node {self.peer_id!r} does not hold the cluster secret")
        self.state = State.OPEN
        assert self.peer_id is not None
        return HandshakeComplete(self.peer_id)

    def _check_peer(self, version: int, peer_id: str, peer_nonce: bytes) -> None:
        if version != VERSION:
            raise PeerProtocolError(f"peer link version {version} (this node speaks {VERSION})")
        if len(peer_nonce) != NONCE_BYTES:
            raise PeerProtocolError(f"a nonce of {len(peer_nonce)} bytes")
        if self.expected_peer is not None and peer_id != self.expected_peer:
            raise PeerAuthError(f"the peer is node {peer_id!r}, not {self.expected_peer!r}")
        self.peer_id = peer_id
        self._peer_nonce = peer_nonce

    def _mac(self, role: Role) -> bytes:
        assert self.peer_id is not None
        if self.role is Role.INITIATOR:
            ids, nonces = (self.node_id, self.peer_id), (self._nonce, self._peer_nonce)
        else:
            ids, nonces = (self.peer_id, self.node_id), (self._peer_nonce, self._nonce)
        return handshake_mac(self._secret, role, *ids, *nonces)

    def _open_message(self, kind: Kind, fields: list[Any]) -> Event:
        if kind is Kind.REQUEST and self.role is Role.ACCEPTOR:
            request_id, op, body = _fields(fields, int, str, object, what="request")
            return Request(_request_id(request_id), op, body)
        if kind is Kind.REPLY and self.role is Role.INITIATOR:
            request_id, body = _fields(fields, int, object, what="reply")
            return Reply(_request_id(request_id), body)
        if kind is Kind.ERROR and self.role is Role.INITIATOR:
            request_id, code, text = _fields(fields, int, str, str, what="error")
            return ErrorReply(_request_id(request_id), code, text)
        raise PeerProtocolError(f"unexpected {kind.name.lower()} to the {self.role.value}")


def _fields(fields: list[Any], *types: type, what: str) -> list[Any]:
    if len(fields) != len(types) or not all(
        isinstance(value, kind) and (kind is not int or type(value) is int)
        for value, kind in zip(fields, types, strict=True)
    ):
        raise PeerProtocolError(f"a malformed {what}")
    return fields


def _request_id(value: int) -> int:
    if not 0 <= value <= MAX_REQUEST_ID:
        raise PeerProtocolError(f"request id {value} out of range")
    return value
