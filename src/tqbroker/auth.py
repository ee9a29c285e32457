"""Users and SASL authentication.

Responsibilities:
- ``UserStore``: users with salted scrypt password hashes (never plain text), constant-time
  comparison, and a small cache of verified credentials so the slow hash runs once per login
  pair rather than once per connection;
- parsing the PLAIN and AMQPLAIN responses of ``connection.start-ok``;
- ``is_loopback``: where ``loopback_only`` users may log in from.

The hash is deliberately slow; callers run ``verify`` in a worker thread.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable

import attrs

from .protocol.codec import U32, read_table
from .protocol.errors import DecodeError

MECHANISMS = ("PLAIN", "AMQPLAIN")


@attrs.frozen
class User:
    name: str
    salt: bytes = attrs.field(repr=False)
    password_hash: bytes = attrs.field(repr=False)
    loopback_only: bool = False
    vhosts: frozenset[str] | None = None  # None: every vhost

    def may_open(self, vhost: str) -> bool:
        return self.vhosts is None or vhost in self.vhosts


def _hash(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=2**14, r=8, p=1, dklen=32)


class UserStore:
    def __init__(self) -> None:
        self._users: dict[str, User] = {}
        self._cache_key = os.urandom(32)
        self._verified: set[bytes] = set()

    def add(
        self,
        name: str,
        password: str,
        *,
        loopback_only: bool = False,
        vhosts: Iterable[str] | None = None,
    ) -> None:
        salt = os.urandom(16)
        allowed = None if vhosts is None else frozenset(vhosts)
        self._users[name] = User(name, salt, _hash(password, salt), loopback_only, allowed)
        self._verified = {v for v in self._verified if not v.startswith(name.encode() + b"\0")}

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def all(self) -> list[User]:
        """Every user, by name."""
        return [self._users[name] for name in sorted(self._users)]

    def verify(self, name: str, password: str) -> User | None:
        """The user if the password is right, else None. Slow (scrypt) on a cache miss."""
        user = self._users.get(name)
        if user is None:
            return None
        token = name.encode() + b"\0" + hmac.digest(self._cache_key, password.encode(), "sha256")
        if token in self._verified:
            return user
        if not hmac.compare_digest(_hash(password, user.salt), user.password_hash):
            return None
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified.add(token)
        return user


def parse_response(mechanism: str, response: bytes) -> tuple[str, str]:
    """``(username, password)`` from a start-ok response, valid Unicode text; ValueError if it
    does not parse."""
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3:
            raise ValueError("PLAIN response is not authzid NUL authcid NUL passwd")
        return parts[1].decode(), parts[2].decode()
    if mechanism == "AMQPLAIN":
        try:
            table, _ = read_table(memoryview(U32.pack(len(response)) + response), 0)
        except DecodeError as exc:
            raise ValueError(f"AMQPLAIN response is not a field table: {exc}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if not isinstance(login, str) or not isinstance(password, str):
            raise ValueError("AMQPLAIN response lacks LOGIN or PASSWORD")
        # Table strings keep bytes that are not UTF-8 (surrogateescape); credentials are text.
        for text in (login, password):
            try:
                text.encode()
            except UnicodeEncodeError:
                raise ValueError("AMQPLAIN LOGIN or PASSWORD is not valid UTF-8") from None
        return login, password
    raise ValueError(f"unknown mechanism {mechanism!r}")


def is_loopback(host: str) -> bool:
    """Whether a peer address is a loopback one (where ``loopback_only`` users may log in):
    127.0.0.0/8, ``::1``, and 127.0.0.0/8 mapped into IPv6 (``::ffff:127.0.0.1``, what a
    dual-stack socket reports for an IPv4 peer), as RabbitMQ's ``loopback_users`` check."""
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
