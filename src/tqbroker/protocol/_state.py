"""The connection and channel state machines, as data, and a channel's content assembly.

Responsibilities:
- ``State`` and ``ChannelState``, and one table per direction for each: (state, method type)
  -> next state. A received method the connection table lacks is the peer's error (504, raised
  by ``ServerConnection``); a sent method a table lacks is ours (``LocalProtocolError``);
- ``Channel``: one open channel's state and the content (publish + header + bodies) it is
  assembling, with the message size (and the room for it under the connection's and the
  broker's caps on incomplete bodies, ``BodyBudget``) checked from the content header before any
  body byte is buffered.

A channel absent from ``ServerConnection.channels`` is ``ChannelState.CLOSED``. Only
channel-class methods move a channel; the other classes leave it as it is (on a closing channel
the peer's are discarded; ours are not refused, since deliveries and confirms may race a close).
"""

from __future__ import annotations

import enum
import logging
from typing import Final

from ._events import ContentReceived
from .codec import U64
from .errors import AMQPError, ReplyCode
from .methods import (
    BASIC_CLASS_ID,
    BasicPublish,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlowOk,
    ChannelOpen,
    ChannelOpenOk,
    ConnectionBlocked,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ConnectionUnblocked,
    ConnectionUpdateSecret,
    ConnectionUpdateSecretOk,
    Method,
)

log = logging.getLogger(__name__)


class State(enum.Enum):
    """Where the connection is (channel 0)."""

    AWAIT_HEADER = enum.auto()  # nothing received yet
    HEADER_RECEIVED = enum.auto()  # server must send connection.start
    AWAIT_START_OK = enum.auto()
    AUTHENTICATING = enum.auto()  # server checks credentials, then sends tune (or closes)
    AWAIT_TUNE_OK = enum.auto()
    AWAIT_OPEN = enum.auto()
    OPENING = enum.auto()  # server checks the vhost, then sends open-ok (or closes)
    OPEN = enum.auto()
    CLOSE_RECEIVED = enum.auto()  # peer sent connection.close; server sends close-ok
    CLOSING = enum.auto()  # server sent connection.close; waiting for close-ok
    CLOSED = enum.auto()


# rabbit_reader's names for where a connection is, in its 504 texts.
RABBIT_STATE_NAMES: Final = {
    State.AWAIT_HEADER: "starting",
    State.HEADER_RECEIVED: "starting",
    State.AWAIT_START_OK: "starting",
    State.AUTHENTICATING: "starting",
    State.AWAIT_TUNE_OK: "tuning",
    State.AWAIT_OPEN: "opening",
    State.OPENING: "opening",
    State.OPEN: "running",
    State.CLOSE_RECEIVED: "closing",
    State.CLOSING: "closing",
    State.CLOSED: "closed",
}


class ChannelState(enum.Enum):
    """Where a channel is; ``CLOSED``: not in the connection's channel table."""

    OPEN = enum.auto()
    CLOSING = enum.auto()  # server sent channel.close; waiting for close-ok
    CLOSED = enum.auto()


Transitions = dict[tuple[State, type[Method]], State]
ChannelTransitions = dict[tuple[ChannelState, type[Method]], ChannelState]

# (state, method received) -> next state.
RECEIVE_TRANSITIONS: Final[Transitions] = {
    (State.AWAIT_START_OK, ConnectionStartOk): State.AUTHENTICATING,
    (State.AWAIT_TUNE_OK, ConnectionTuneOk): State.AWAIT_OPEN,
    (State.AWAIT_OPEN, ConnectionOpen): State.OPENING,
    (State.OPEN, ConnectionUpdateSecret): State.OPEN,
    (State.CLOSING, ConnectionCloseOk): State.CLOSED,
    (State.CLOSING, ConnectionClose): State.CLOSING,
} | {
    (state, ConnectionClose): State.CLOSE_RECEIVED
    for state in (
        State.AWAIT_START_OK,
        State.AUTHENTICATING,
        State.AWAIT_TUNE_OK,
        State.AWAIT_OPEN,
        State.OPENING,
        State.OPEN,
    )
}
# (state, method sent) -> next state; connection.close may be sent in any state.
SEND_TRANSITIONS: Final[Transitions] = {
    (State.HEADER_RECEIVED, ConnectionStart): State.AWAIT_START_OK,
    (State.AUTHENTICATING, ConnectionTune): State.AWAIT_TUNE_OK,
    (State.OPENING, ConnectionOpenOk): State.OPEN,
    (State.OPEN, ConnectionUpdateSecretOk): State.OPEN,
    (State.OPEN, ConnectionBlocked): State.OPEN,
    (State.OPEN, ConnectionUnblocked): State.OPEN,
    (State.CLOSE_RECEIVED, ConnectionCloseOk): State.CLOSED,
    (State.CLOSING, ConnectionCloseOk): State.CLOSING,
} | {(state, ConnectionClose): State.CLOSING for state in State}

# (channel state, channel-class method received) -> next state; any other leaves it as it is.
CHANNEL_RECEIVE_TRANSITIONS: Final[ChannelTransitions] = {
    (ChannelState.CLOSED, ChannelOpen): ChannelState.OPEN,
    (ChannelState.OPEN, ChannelCloseOk): ChannelState.CLOSED,
    (ChannelState.CLOSING, ChannelCloseOk): ChannelState.CLOSED,
}
# (channel state, channel-class method sent) -> next state; a channel-class method missing here
# is a LocalProtocolError.
CHANNEL_SEND_TRANSITIONS: Final[ChannelTransitions] = {
    (ChannelState.OPEN, ChannelOpenOk): ChannelState.OPEN,
    (ChannelState.OPEN, ChannelFlowOk): ChannelState.OPEN,
    (ChannelState.OPEN, ChannelClose): ChannelState.CLOSING,
    (ChannelState.CLOSING, ChannelClose): ChannelState.CLOSING,
    # Closed before our error was sent (a flusher or timer failing it late): nothing to close.
    (ChannelState.CLOSED, ChannelClose): ChannelState.CLOSED,
    (ChannelState.OPEN, ChannelCloseOk): ChannelState.CLOSED,
    # Both sides sent channel.close: ours still waits for the peer's close-ok.
    (ChannelState.CLOSING, ChannelCloseOk): ChannelState.CLOSING,
}

# The largest body size a content header may announce at all (RabbitMQ's ?MAX_MSG_SIZE, 512 MiB):
# beyond it the connection fails with 501, whatever max_message_size allows.
MAX_BODY_SIZE: Final = 512 * 1024 * 1024
# A content header payload: class id, weight, body size, then at least the property flags.
CONTENT_HEADER_FIXED: Final = 2 + 2 + U64.size
CONTENT_HEADER_MIN: Final = CONTENT_HEADER_FIXED + 2


class BodyBudget:
    """Bytes of message bodies that content headers announced and that have not all arrived
    yet: a connection's (``limit``: its cap), drawing on one that all connections share (the
    broker's) when ``shared`` is given. A header that would pass a cap is refused before any
    byte of its body is buffered."""

    __slots__ = ("limit", "name", "reserved", "shared")

    def __init__(self, limit: int, name: str, shared: BodyBudget | None = None) -> None:
        self.limit = limit
        self.name = name  # for errors: "this connection", "the broker"
        self.reserved = 0
        self.shared = shared

    def reserve(self, size: int) -> BodyBudget | None:
        """Take ``size`` bytes; None if done, else the budget that has no room (nothing taken)."""
        if self.reserved + size > self.limit:
            return self
        shared = self.shared
        if shared is not None:
            if shared.reserved + size > shared.limit:
                return shared
            shared.reserved += size
        self.reserved += size
        return None

    def release(self, size: int) -> None:
        self.reserved -= size
        if self.shared is not None:
            self.shared.reserved -= size


class Channel:
    """One channel: its state, and the content being assembled."""

    __slots__ = ("body", "body_size", "budget", "method", "properties", "received", "state")

    def __init__(self, budget: BodyBudget) -> None:
        self.state = ChannelState.OPEN
        self.method: BasicPublish | None = None  # a publish waiting for its content
        self.properties: bytes | None = None  # set once the content header arrived
        self.body_size = 0
        self.received = 0
        self.body: list[bytes] = []
        self.budget = budget  # the connection's: charged body_size while the body arrives

    def reset_content(self) -> None:
        """Drop the content being assembled."""
        if self.properties is not None and self.body_size:
            self.budget.release(self.body_size)
        self.method = self.properties = None
        self.body = []

    def content_header(
        self, channel: int, payload: memoryview, max_message_size: int
    ) -> ContentReceived | None:
        """Take a content header frame; the complete content if the body is empty."""
        method = self.method
        if method is None:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if self.properties is not None:
            raise content_owed(method, True, "content header")
        if len(payload) < CONTENT_HEADER_MIN:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                f"content header shorter than {CONTENT_HEADER_MIN} bytes",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        class_id = payload[0] << 8 | payload[1]
        weight = payload[2] << 8 | payload[3]
        if class_id != method.CLASS_ID or weight != 0:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME,
                f"expected content header for class {method.CLASS_ID}, got one for class "
                f"{class_id} (weight {weight}) instead",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        (body_size,) = U64.unpack_from(payload, 4)
        if body_size > MAX_BODY_SIZE:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                f"content body size {body_size} exceeds maximum allowed size {MAX_BODY_SIZE}",
                class_id=method.CLASS_ID,
                method_id=method.METHOD_ID,
            )
        if body_size > max_message_size:
            self.method = None
            raise AMQPError(
                ReplyCode.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size {max_message_size}",
                channel=channel,
                class_id=BASIC_CLASS_ID,
                method_id=BasicPublish.METHOD_ID,
            )
        if body_size == 0:
            self.properties = bytes(payload[CONTENT_HEADER_FIXED:])
            self.body_size = self.received = 0
            return self._content_done(channel, b"")
        full = self.budget.reserve(body_size)
        if full is not None:
            self.method = None
            raise _no_room(full, body_size, channel)
        self.properties = bytes(payload[CONTENT_HEADER_FIXED:])
        self.body_size = body_size
        self.received = 0
        return None

    def content_body(self, channel: int, payload: memoryview) -> ContentReceived | None:
        """Take a content body frame; the complete content once the last one came."""
        if self.method is None:
            raise AMQPError(
                ReplyCode.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        if self.properties is None:
            raise content_owed(self.method, False, "content body")
        received = self.received + len(payload)
        if received > self.body_size:
            raise AMQPError(
                ReplyCode.FRAME_ERROR,
                "content body frame exceeds remaining content size",
                class_id=self.method.CLASS_ID,
                method_id=self.method.METHOD_ID,
            )
        if received == self.body_size and not self.body:
            return self._content_done(channel, bytes(payload))
        self.body.append(bytes(payload))
        self.received = received
        if received == self.body_size:
            body = b"".join(self.body)
            self.body = []
            return self._content_done(channel, body)
        return None

    def _content_done(self, channel: int, body: bytes) -> ContentReceived:
        assert self.method is not None
        assert self.properties is not None
        event = ContentReceived(channel, self.method, [self.properties], [body])
        self.method = self.properties = None
        if self.body_size:
            self.budget.release(self.body_size)
        return event


def _no_room(budget: BodyBudget, size: int, channel: int) -> AMQPError:
    """406 for a content header whose body would pass a cap on incomplete bodies."""
    return AMQPError(
        ReplyCode.PRECONDITION_FAILED,
        f"message size {size} does not fit: incomplete message bodies on {budget.name} take "
        f"{budget.reserved} of its {budget.limit} bytes; finish sending the messages begun first",
        channel=channel,
        class_id=BASIC_CLASS_ID,
        method_id=BasicPublish.METHOD_ID,
    )


def content_owed(method: Method, header_received: bool, got: str) -> AMQPError:
    """505 for a frame that is not the content ``method`` still waits for; like RabbitMQ's
    command assembler, it names the content's method, not the intruder."""
    kind = "content body" if header_received else "content header"
    expected = kind if header_received else f"{kind} for class {method.CLASS_ID}"
    return AMQPError(
        ReplyCode.UNEXPECTED_FRAME,
        f"expected {expected}, got non {kind} frame instead",  # RabbitMQ's words
        class_id=method.CLASS_ID,
        method_id=method.METHOD_ID,
    )
