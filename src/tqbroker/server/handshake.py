"""The opening of an AMQP connection, up to its vhost.

Responsibilities:
- ``connection.start``: the server properties and capabilities, the SASL mechanisms;
- ``connection.start-ok``: the client's properties and capabilities, SASL PLAIN/AMQPLAIN (or
  EXTERNAL: the user named by the verified client certificate, ``peer_username``) through the
  broker's ``Authenticator`` (rate limit, auth backends, loopback users, the pause before a
  refusal); a refusal as ``connection.close`` 403 to clients that understand it and a hang-up
  for the others; then ``connection.tune``;
- ``connection.open``: the vhost, if it exists and the auth backend lets the user open it;
- the log lines of a connection's life, worded as RabbitMQ 3.10 words them ("accepting AMQP
  connection", "user 'guest' authenticated and granted access to vhost '/'", "PLAIN login
  refused: user 'bob' - invalid credentials" -- never the password, "closing AMQP
  connection"), with the peer, user, vhost, client properties and duration also as structured
  fields (``extra=``: keys of ``--log-format json``).

The connection enforces the deadline and starts heartbeats after tune-ok.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, NoReturn

from .._version import __version__
from ..auth import AuthUser, LoginRefused, Peer
from ..auth.sasl import offered_mechanisms, parse_response
from ..broker.vhost import VirtualHost
from ..protocol.codec import FieldTable
from ..protocol.errors import AMQPError, ReplyCode
from ..protocol.methods import (
    ConnectionOpen,
    ConnectionOpenOk,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    Method,
)

if TYPE_CHECKING:
    from ..broker.broker import Broker

log = logging.getLogger(__name__)

CAPABILITIES: FieldTable = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "connection.blocked": True,
    "consumer_priorities": True,  # basic.consume's x-priority
    "direct_reply_to": True,  # amq.rabbitmq.reply-to
}


def server_properties(cluster_name: str) -> FieldTable:
    return {
        "product": "tqbroker",
        "version": __version__,
        "platform": f"Python {platform.python_version()} / Trio",
        "copyright": "tqbroker contributors",
        "information": "An AMQP 0-9-1 broker on Trio",
        "cluster_name": cluster_name,
        "capabilities": CAPABILITIES,
    }


class HangUp(Exception):
    """Close the socket without another word."""


class Handshake:
    """One connection's handshake and what it learnt: the client's properties and
    capabilities, and the user. ``send`` sends a method on channel 0."""

    def __init__(
        self,
        broker: Broker,
        peer: str,
        peer_host: str,
        send: Callable[[Method], None],
        local: str = "",
        *,
        peer_username: str | None = None,
    ):
        """``peer_username``: the user named by the connection's verified TLS client
        certificate (EXTERNAL is offered only then)."""
        self._broker = broker
        self._peer = peer
        self._peer_host = peer_host
        self._send = send
        self.capabilities: FieldTable = {}
        self.client_properties: FieldTable = {}
        self.mechanism = ""  # the SASL mechanism the client chose
        self.user: AuthUser | None = None
        self.peer_username = peer_username
        self.mechanisms = offered_mechanisms(
            broker.config.auth_mechanisms, peer_username is not None
        )
        self.local = local
        self.vhost_name: str | None = None
        self.channels: Sized = ()  # the connection's channel table (user channel limits)
        self._accepted_at = time.monotonic()

    # -- log lines ---------------------------------------------------------------------------

    def label(self) -> str:
        """``127.0.0.1:47714 -> 127.0.0.1:5672 - probe-conn`` (RabbitMQ's connection name)."""
        name = _printable(self.client_properties.get("connection_name"))
        return f"{self._peer} -> {self.local}" + (f" - {name}" if name else "")

    def log_fields(self, **more: object) -> dict[str, object]:
        """The structured fields of this connection's log lines."""
        properties = self.client_properties
        return {
            "peer": self._peer,
            "local": self.local,
            "user": self.user.name if self.user is not None else None,
            "vhost": self.vhost_name,
            "connection_name": _printable(properties.get("connection_name")),
            "client_product": _printable(properties.get("product")),
            "client_version": _printable(properties.get("version")),
            **more,
        }

    def log_accepted(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        log.info("accepting AMQP connection %s", self.label(), extra=self.log_fields())

    def log_closed(self) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        duration = round(time.monotonic() - self._accepted_at, 3)
        known = (
            f", vhost: '{self.vhost_name}', user: '{self.user.name}'"
            if self.user is not None and self.vhost_name is not None
            else ""
        )
        log.info(
            "closing AMQP connection %s%s, duration: %.3f s",
            self.label(),
            known,
            duration,
            extra=self.log_fields(duration_s=duration),
        )

    def start(self) -> None:
        """The client sent the protocol header: ``connection.start``."""
        properties = server_properties(self._broker.config.host)
        self._send(ConnectionStart(0, 9, properties, " ".join(self.mechanisms), "en_US"))

    async def start_ok(self, start_ok: ConnectionStartOk) -> None:
        """Authenticate, then ``connection.tune``."""
        self.client_properties = start_ok.client_properties
        self.mechanism = start_ok.mechanism[:64]
        capabilities = start_ok.client_properties.get("capabilities")
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        if start_ok.mechanism not in self.mechanisms:
            log.warning(
                "closing connection %s: unknown authentication mechanism %r",
                self._peer,
                start_ok.mechanism[:64],
            )
            raise HangUp  # the spec: close without sending anything further
        password: str | None
        if start_ok.mechanism == "EXTERNAL":
            assert self.peer_username is not None  # offered only with a certificate's user
            username, password = self.peer_username, None
        else:
            try:
                username, password = parse_response(
                    start_ok.mechanism, start_ok.response.encode("utf-8", "surrogateescape")
                )
            except (ValueError, UnicodeDecodeError) as exc:
                raise AMQPError(ReplyCode.ACCESS_REFUSED, str(exc), hard=True) from None
        peer = Peer(self._peer_host, None, self.peer_username)
        try:
            self.user = await self._broker.authenticator.login(username, password, peer)
        except LoginRefused as refused:
            self._log_refused(start_ok.mechanism, username, refused.reason)
            self._refuse_login(
                f"user '{username}' can only connect via localhost"
                if refused.loopback
                else f"Login was refused using authentication mechanism {start_ok.mechanism}. "
                "For details see the broker logfile."
            )
        config = self._broker.config
        self._send(ConnectionTune(config.channel_max, config.frame_max, config.heartbeat))

    def _log_refused(self, mechanism: str, username: str, reason: str) -> None:
        """RabbitMQ's line for a refused login: the user and why, never the password."""
        user = _printable(username) or ""
        log.warning(
            "connection %s: %s login refused: user '%s' - %s",
            self.label(),
            mechanism,
            user,
            reason,
            extra=self.log_fields(user=user, reason=reason),
        )

    def _refuse_login(self, text: str) -> NoReturn:
        """Tell clients that understand it (``authentication_failure_close``) with
        connection.close 403; hang up on the others, as the spec says. (The authenticator
        paused before refusing.)"""
        if self.capabilities.get("authentication_failure_close") is not True:
            raise HangUp
        raise AMQPError(ReplyCode.ACCESS_REFUSED, text, hard=True)

    async def open(self, method: ConnectionOpen) -> VirtualHost:
        """``connection.open``: the vhost, if the user may open it (``connection.open-ok``)."""
        name = method.virtual_host
        vhost = self._broker.vhosts.get(name)
        if vhost is None:
            raise AMQPError(ReplyCode.NOT_ALLOWED, f"vhost {name} not found")
        assert self.user is not None  # authenticated before open is allowed
        peer = Peer(self._peer_host, None, self.peer_username)
        if not await self._broker.authenticator.chain.check_vhost(self.user, name, peer):
            raise AMQPError(
                ReplyCode.NOT_ALLOWED,
                f"access to vhost '{name}' refused for user '{self.user.name}'",
            )
        if self._broker.vhosts.get(name) is not vhost:  # deleted while the check ran
            raise AMQPError(ReplyCode.NOT_ALLOWED, f"vhost {name} not found")
        # The vhost's and the user's connection limits (530 over either); released at close.
        self._broker.limits.admit(self, self.user.name, name, self.channels)
        self._send(ConnectionOpenOk())
        self.vhost_name = name
        product = " ".join(
            part
            for part in (self.log_fields()[k] for k in ("client_product", "client_version"))
            if isinstance(part, str)
        )
        log.info(
            "connection %s: user '%s' authenticated and granted access to vhost '%s'%s",
            self.label(),
            self.user.name,
            name,
            f" (client: {product})" if product else "",
            extra=self.log_fields(),
        )
        return vhost


def _printable(value: object, limit: int = 200) -> str | None:
    """A client-supplied string fit for one log line: control characters escaped, cut at
    ``limit`` characters; None for what is not text."""
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", "replace")
    if not isinstance(value, str):
        return None
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value[:limit])
