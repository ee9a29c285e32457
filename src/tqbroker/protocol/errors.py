"""AMQP reply codes and the errors that carry them.

Responsibilities:
- ``ReplyCode``: every reply code of AMQP 0-9-1, and whether it is soft (closes a channel) or hard
  (closes the connection).
- ``AMQPError``: raised anywhere in the broker with the reply code, text and offending method; the
  I/O layer turns it into ``channel.close`` or ``connection.close``.
- ``DecodeError``: raised by the codec on bytes that do not parse; the frame layer turns it into a
  501 FRAME_ERROR.
- ``BadProtocolHeader``: the peer does not speak AMQP 0-9-1;
- ``LocalProtocolError``: our own side tried to send something its state forbids (a bug here,
  never the peer's doing).
"""

from __future__ import annotations

import enum


class ReplyCode(enum.IntEnum):
    SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541

    @property
    def is_soft(self) -> bool:
        """Soft errors close the channel; every other error closes the connection."""
        return self in _SOFT


_SOFT = frozenset(
    {
        ReplyCode.CONTENT_TOO_LARGE,
        ReplyCode.NO_ROUTE,
        ReplyCode.NO_CONSUMERS,
        ReplyCode.ACCESS_REFUSED,
        ReplyCode.NOT_FOUND,
        ReplyCode.RESOURCE_LOCKED,
        ReplyCode.PRECONDITION_FAILED,
    }
)


class DecodeError(ValueError):
    """Bytes inside a complete frame that do not decode (a 501 once it reaches the frame layer)."""


class UnknownMethodError(DecodeError):
    """A method frame whose class and method ids name no method (a 503 COMMAND_INVALID)."""


class BadProtocolHeader(Exception):
    """The first bytes were not ``AMQP 0-9-1``: send ``PROTOCOL_HEADER`` and close the socket."""


class LocalProtocolError(Exception):
    """The server tried to send a method that the connection or channel state does not allow
    (h11's name for the same thing): a bug in the caller, not an error to report to the peer."""


class AMQPError(Exception):
    """An error with the AMQP reply to send.

    ``hard`` says whether the connection (rather than just the channel) must close; it defaults to
    what the reply code's class says. ``class_id``/``method_id`` name the method that failed.
    """

    def __init__(
        self,
        code: ReplyCode,
        text: str,
        *,
        channel: int = 0,
        class_id: int = 0,
        method_id: int = 0,
        hard: bool | None = None,
    ) -> None:
        super().__init__(f"{code.name} - {text}")
        self.code = code
        self.text = text
        self.channel = channel
        self.class_id = class_id
        self.method_id = method_id
        self.hard = (not code.is_soft) if hard is None else hard

    @property
    def reply_text(self) -> str:
        """The reply text as RabbitMQ words it (``NOT_FOUND - no queue 'q' in vhost '/'``),
        cut to fit a shortstr."""
        return f"{self.code.name} - {self.text}".encode()[:255].decode(errors="ignore")

    def on_method(self, channel: int, class_id: int, method_id: int) -> AMQPError:
        """Fill in where the error happened, unless it already says."""
        if not self.channel:
            self.channel = channel
        if not self.class_id:
            self.class_id, self.method_id = class_id, method_id
        return self
