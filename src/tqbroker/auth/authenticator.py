"""Logins, for AMQP and HTTP alike: one ``Authenticator`` per broker.

- a per-source-address token bucket of failed logins: over it, a login is refused before any
  password is hashed or any backend asked (the same reply as a wrong password);
- a small cache of recent successes and failures, keyed by an HMAC of the user name and
  password under a per-process key (never the password), valid while the chain's generation
  is unchanged (a password or permission change empties it in effect);
- the backends (``AuthChain``), which cost the same for an unknown user as for a wrong password;
  a backend that cannot answer refuses the login without counting it against the address;
- ``loopback_users`` (RabbitMQ's broker setting, default ``["guest"]``) checked against the
  PEER address (``is_loopback``: 127.0.0.0/8, ``::1``, and IPv4-mapped 127.0.0.0/8);
- every refusal answered after ``failure_delay`` seconds (a sleeping task costs no CPU).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

import trio

from .backends import AuthBackendError, AuthChain
from .model import AuthUser, Peer

log = logging.getLogger(__name__)

INVALID_CREDENTIALS = "invalid credentials"
LOOPBACK_ONLY = "can only connect via localhost"
RATE_LIMITED = "too many failed logins from this address"
BACKEND_UNAVAILABLE = "no auth backend could answer"


class LoginRefused(Exception):
    """A refused login. ``reason`` is for the log (one of the constants above; never the
    password); ``loopback`` tells the caller to answer with RabbitMQ's loopback text, else the
    reply is the same for every reason (a rate-limited source learns nothing)."""

    def __init__(self, username: str, reason: str) -> None:
        super().__init__(f"login refused: user '{username}' - {reason}")
        self.username, self.reason = username, reason

    @property
    def loopback(self) -> bool:
        return self.reason == LOOPBACK_ONLY


def is_loopback(host: str) -> bool:
    """Whether a peer address is a loopback one: 127.0.0.0/8, ``::1``, and 127.0.0.0/8 mapped
    into IPv6 (``::ffff:127.0.0.1``, what a dual-stack socket reports for an IPv4 peer)."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


class FailureBuckets:
    """Token buckets of failed logins per source address: ``burst`` failures at once, then
    ``rate`` per second. At most ``max_sources`` addresses are tracked (oldest forgotten)."""

    def __init__(
        self,
        burst: int,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = 10_000,
    ) -> None:
        self.burst, self.rate, self._clock, self._max = burst, rate, clock, max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, when

    def _tokens(self, source: str) -> float:
        tokens, when = self._buckets.get(source, (float(self.burst), self._clock()))
        return min(float(self.burst), tokens + (self._clock() - when) * self.rate)

    def allows(self, source: str) -> bool:
        """Whether ``source`` may try a login (has a token left for a failure)."""
        return self._tokens(source) >= 1.0

    def failed(self, source: str) -> None:
        tokens = self._tokens(source) - 1.0
        self._buckets[source] = (max(tokens, 0.0), self._clock())
        self._buckets.move_to_end(source)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)


class Authenticator:
    """Every login of the broker goes through ``login``."""

    def __init__(
        self,
        chain: AuthChain,
        *,
        loopback_users: Iterable[str] = ("guest",),
        failure_delay: float = 1.0,
        failure_burst: int = 10,
        failure_rate: float = 1.0,
        cache_seconds: float = 60.0,
        cache_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.chain = chain
        self.loopback_users = frozenset(loopback_users)
        self.failure_delay = failure_delay
        self.buckets = FailureBuckets(failure_burst, failure_rate, clock)
        self._clock, self._ttl, self._size = clock, cache_seconds, cache_size
        self._key = os.urandom(32)
        # token -> (user or None for a failure, chain generation, expiry)
        self._cache: OrderedDict[bytes, tuple[AuthUser | None, int, float]] = OrderedDict()

    async def login(self, username: str, password: str | None, peer: Peer) -> AuthUser:
        """The authenticated user; ``password`` None is EXTERNAL (``username`` from the
        certificate). LoginRefused after ``failure_delay`` otherwise."""
        if not self.buckets.allows(peer.host):
            await self._refuse(username, RATE_LIMITED, peer, count=False)
        try:
            user = await self._authenticate(username, password, peer)
        except AuthBackendError:  # not the client's failure: not counted against its address
            await self._refuse(username, BACKEND_UNAVAILABLE, peer, count=False)
        if user is None:
            await self._refuse(username, INVALID_CREDENTIALS, peer)
        elif username in self.loopback_users and not is_loopback(peer.host):
            await self._refuse(username, LOOPBACK_ONLY, peer, count=False)
        assert user is not None
        return user

    async def _authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        if password is None:
            return await self.chain.authenticate(username, None, peer)
        token = hmac.digest(
            self._key, f"{username}\0{password}".encode("utf-8", "surrogatepass"), "sha256"
        )
        generation, now = self.chain.generation, self._clock()
        cached = self._cache.get(token)
        if cached is not None and cached[1] == generation and cached[2] > now:
            return cached[0]
        user = await self.chain.authenticate(username, password, peer)
        self._cache[token] = (user, generation, now + self._ttl)
        self._cache.move_to_end(token)
        while len(self._cache) > self._size:
            self._cache.popitem(last=False)
        return user

    async def _refuse(self, username: str, reason: str, peer: Peer, *, count: bool = True) -> None:
        if count:
            self.buckets.failed(peer.host)
        await trio.sleep(self.failure_delay)
        raise LoginRefused(username, reason)
