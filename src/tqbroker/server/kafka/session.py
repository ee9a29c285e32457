"""One Kafka connection's session: who it is (the user its login gave), where it is (a vhost,
its peer and local addresses) and the stream service it reaches topics through.

A connection logs in with SASL (``sasl.py``: PLAIN against the broker's users and
authentication backends, as an AMQP PLAIN login; SCRAM against the internal users' SCRAM
credentials), or by its TLS client certificate (a verified one that names a user, as AMQP's
EXTERNAL; Kafka's SSL listener takes the certificate's principal). One that does not authenticate
(Kafka's PLAINTEXT listener, no SASL) acts as the ``guest`` user when its peer is on
loopback, as RabbitMQ lets ``guest`` in only from loopback; from elsewhere it is refused."""

from __future__ import annotations

from collections.abc import Iterable

from ...auth import AuthUser, Peer
from ...auth.authenticator import LoginRefused
from ...auth.scram import ScramServer
from ...broker.broker import Broker
from ...broker.streams.service import StreamService
from ...broker.vhost import VirtualHost
from ..topic_needs import Need
from .groups import GroupCoordinator
from .nodes import KafkaNodes

ANONYMOUS_USER = "guest"
DEFAULT_VHOST = "/"

Address = tuple[str, int]


class KafkaSession:
    def __init__(
        self,
        broker: Broker,
        groups: GroupCoordinator,
        peer: Address,
        local_address: Address,
        certificate_username: str | None = None,
        nodes: KafkaNodes | None = None,
    ) -> None:
        self.broker = broker
        self.groups = groups
        self.nodes = nodes if nodes is not None else KafkaNodes(None)
        self.peer = peer
        self.local_address = local_address
        advertised = broker.config.kafka_advertised_address
        if advertised is not None:  # "host:port" (validated), an IPv6 host in brackets
            host, _, port = advertised.rpartition(":")
            self.advertised_address: Address = (host.strip("[]"), int(port))
        else:
            self.advertised_address = local_address
        self.user: AuthUser | None = None
        self.client_id = ""  # the current request's
        self.mechanism: str | None = None  # the SASL mechanism of a handshake, until its login
        self.unframed_tokens = False  # a version 0 handshake: its tokens come as bare frames
        self.scram: ScramServer | None = None  # a SCRAM login under way
        self.scram_user: AuthUser | None = None  # whose credential it checks the proof against
        self.certificate_username = certificate_username  # a verified TLS client certificate's
        vhost = broker.vhosts[DEFAULT_VHOST]
        self.vhost: VirtualHost = vhost
        self.service = StreamService(vhost)

    async def log_in_without_sasl(self) -> str | None:
        """Act as the user a verified TLS client certificate names, else as ``guest`` (a
        loopback peer only); None, or why it was refused."""
        if self.certificate_username is not None:
            return await self.log_in(self.certificate_username, None)
        return await self.log_in(ANONYMOUS_USER, None)

    async def log_in(self, username: str, password: str | None) -> str | None:
        """A login (SASL PLAIN; ``password`` None: the certificate's user, or guest); None, or
        why it was refused (RabbitMQ's words)."""
        try:
            user = await self.broker.authenticator.login(
                username, password, Peer(self.peer[0], self.peer[1])
            )
        except LoginRefused as exc:
            return str(exc)
        return await self.admit(user)

    async def admit(self, user: AuthUser) -> str | None:
        """Make an authenticated ``user`` the session's if it may use the vhost; None, or why
        not."""
        chain = self.broker.authenticator.chain
        if not await chain.check_vhost(user, self.vhost.name, Peer(self.peer[0])):
            return f"user '{user.name}' has no access to vhost '{self.vhost.name}'"
        self.user = user
        return None

    async def allowed(self, needs: Iterable[Need]) -> bool:
        """Whether the session's user has every permission of ``needs`` on its vhost."""
        user = self.user
        if user is None:
            return False
        chain = self.broker.authenticator.chain
        for kind, name, permission in needs:
            if not await chain.check_resource(user, self.vhost.name, kind, name, permission):
                return False
        return True
