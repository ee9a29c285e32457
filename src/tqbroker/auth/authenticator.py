"""Logins, for AMQP and HTTP alike: one ``Authenticator`` per broker.

- a small cache of recent successes and failures, keyed by an HMAC of the user name and
  password under a per-process key (never the password), valid while the chain's generation
  is unchanged (a password or permission change empties it in effect); it is asked first, and
  a success it holds is never refused by the allowance below;
- a token bucket of failed logins per (source address, user name): over it, a login the cache
  does not know is refused before any password is hashed or any backend asked (the same reply
  as a wrong password). Guessing one user's password from one address is slowed; a flood of
  wrong logins for other (or unknown) users from the same address (a NAT, a proxy) spends
  their buckets, not a real user's;
- the backends (``AuthChain``), which cost the same for an unknown user as for a wrong password;
  a backend that cannot answer refuses the login without counting it against the address;
- ``loopback_users`` (RabbitMQ's broker setting, default ``["guest"]``) checked against the
  PEER address (``is_loopback``: 127.0.0.0/8, ``::1``, and IPv4-mapped 127.0.0.0/8);
- every refusal answered after ``failure_delay`` seconds (a sleeping task costs no CPU);
- SCRAM (a login that proves a password without sending it: ``scram.py``): ``scram_credential``
  finds the internal user's credential (under the same allowance), the caller checks the
  proof, and ``scram_login`` counts a failure or checks the loopback rule on a success.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import NoReturn

import trio

from .backends import AuthBackendError, AuthChain
from .internal import InternalBackend
from .model import AuthUser, Peer
from .scram import ScramCredential

log = logging.getLogger(__name__)

INVALID_CREDENTIALS = "invalid credentials"
LOOPBACK_ONLY = "can only connect via localhost"
RATE_LIMITED = "too many failed logins for this user from this address"
BACKEND_UNAVAILABLE = "no auth backend could answer"
NO_SCRAM_CREDENTIALS = (
    "no SCRAM credentials (an unknown user, or one whose password was not set through "
    "tqbroker: set it again to log in with SCRAM, or use PLAIN)"
)


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
    """Token buckets of failed logins per source (a key: the authenticator's is a digest of
    address and user name): ``burst`` failures at once, then ``rate`` per second. At most
    ``max_sources`` sources are tracked (oldest forgotten)."""

    def __init__(
        self,
        burst: int,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        max_sources: int = 10_000,
    ) -> None:
        self.burst, self.rate, self._clock, self._max = burst, rate, clock, max_sources
        self._buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()  # tokens, when

    def _tokens(self, source: bytes) -> float:
        tokens, when = self._buckets.get(source, (float(self.burst), self._clock()))
        return min(float(self.burst), tokens + (self._clock() - when) * self.rate)

    def allows(self, source: bytes) -> bool:
        """Whether ``source`` may try a login (has a token left for a failure)."""
        return self._tokens(source) >= 1.0

    def failed(self, source: bytes) -> None:
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
        source = self._source(peer, username)
        token = None if password is None else self._digest(f"{username}\0{password}")
        cached = self._cached(token)
        user = None if cached is None else cached[0]
        if user is None:  # not a recent success: the allowance applies
            await self._within_allowance(username, peer, source)
            if cached is None:  # a failure the cache holds is not asked again
                user = await self._authenticate(username, password, peer, source, token)
        if user is None:
            await self._refuse(username, INVALID_CREDENTIALS, peer, source)
        if username in self.loopback_users and not is_loopback(peer.host):
            await self._refuse(username, LOOPBACK_ONLY, peer, source, count=False)
        return user

    async def scram_credential(
        self, username: str, mechanism: str, peer: Peer
    ) -> tuple[AuthUser, ScramCredential]:
        """The internal user ``username`` and its ``mechanism`` credential, to check a SCRAM
        proof against; LoginRefused (after ``failure_delay``) for a source over its
        allowance, or an unknown user or one without that credential (counted, as a wrong
        password is)."""
        source = self._source(peer, username)
        await self._within_allowance(username, peer, source)
        internal = self.chain.backends.get("internal")
        user = internal.db.get(username) if isinstance(internal, InternalBackend) else None
        credential = None if user is None else user.scram_credential(mechanism)
        if user is None or credential is None:
            await self._refuse(username, NO_SCRAM_CREDENTIALS, peer, source)
        return AuthUser(user.name, user.tags, "internal"), credential

    async def scram_login(self, user: AuthUser, proved: bool, peer: Peer) -> AuthUser:
        """The end of a SCRAM login whose proof the caller checked: ``user``, or LoginRefused
        (after ``failure_delay``; a wrong proof counted against the source)."""
        source = self._source(peer, user.name)
        if not proved:
            await self._refuse(user.name, INVALID_CREDENTIALS, peer, source)
        if user.name in self.loopback_users and not is_loopback(peer.host):
            await self._refuse(user.name, LOOPBACK_ONLY, peer, source, count=False)
        return user

    def _source(self, peer: Peer, username: str) -> bytes:
        """What the failure allowance is kept by: the address and the username, keyed."""
        return self._digest(f"{peer.host}\0{username}")

    async def _within_allowance(self, username: str, peer: Peer, source: bytes) -> None:
        """Refused at once (not counted) when ``source`` has no failures left to spend."""
        if not self.buckets.allows(source):
            await self._refuse(username, RATE_LIMITED, peer, source, count=False)

    def _digest(self, text: str) -> bytes:
        return hmac.digest(self._key, text.encode("utf-8", "surrogatepass"), "sha256")

    def _cached(self, token: bytes | None) -> tuple[AuthUser | None, int, float] | None:
        """The login cache's entry for ``token`` (a success or a failure) if still valid."""
        cached = None if token is None else self._cache.get(token)
        if cached is None or cached[1] != self.chain.generation or cached[2] <= self._clock():
            return None
        return cached

    async def _authenticate(
        self, username: str, password: str | None, peer: Peer, source: bytes, token: bytes | None
    ) -> AuthUser | None:
        """The chain's answer, kept in the cache (not for EXTERNAL: no password)."""
        generation = self.chain.generation
        try:
            user = await self.chain.authenticate(username, password, peer)
        except AuthBackendError:  # not the client's failure: not counted against it
            await self._refuse(username, BACKEND_UNAVAILABLE, peer, source, count=False)
        if token is not None:
            self._cache[token] = (user, generation, self._clock() + self._ttl)
            self._cache.move_to_end(token)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return user

    async def _refuse(
        self, username: str, reason: str, peer: Peer, source: bytes, *, count: bool = True
    ) -> NoReturn:
        if count:
            self.buckets.failed(source)
        await trio.sleep(self.failure_delay)
        raise LoginRefused(username, reason)
