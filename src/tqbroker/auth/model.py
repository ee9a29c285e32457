"""The data of authentication and authorization: users, permissions, topic permissions, the
authenticated user a backend answers with, and what a permission check asks about.

RabbitMQ's model: a user has a password hash (or none: only EXTERNAL logs it in) and tags; per
vhost a ``Permission`` of three regular expressions (configure, write, read) matched, as
RabbitMQ's ``re:run``, as an unanchored search against a resource name (``""`` means ``^$``:
nothing); per vhost and exchange a ``TopicPermission`` on routing keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

import attrs

from .passwords import DEFAULT_ALGORITHM, hash_password
from .scram import ScramCredential, credentials_for

ResourceKind = Literal["queue", "exchange", "topic"]
PermissionKind = Literal["configure", "write", "read"]
RESOURCE_KINDS: tuple[ResourceKind, ...] = ("queue", "exchange", "topic")
PERMISSION_KINDS: tuple[PermissionKind, ...] = ("configure", "write", "read")
# The tags that mean something to the management API (others are kept and shown).
ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT = (
    "administrator",
    "monitoring",
    "policymaker",
    "management",
)
MANAGEMENT_TAGS = frozenset({ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT})


class PatternError(ValueError):
    """A permission pattern that is not a regular expression."""


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """A permission pattern compiled; ``""`` is ``^$`` as in RabbitMQ."""
    try:
        return re.compile(pattern or "^$")
    except re.error as exc:
        raise PatternError(f"invalid permission pattern {pattern!r}: {exc}") from None


def _tags(value: Iterable[str]) -> frozenset[str]:
    return frozenset(value)


def _credentials(value: Iterable[ScramCredential]) -> tuple[ScramCredential, ...]:
    return tuple(value)


def _pattern(value: str) -> str:
    compile_pattern(value)
    return value


@attrs.frozen
class User:
    """A user of the internal database. ``password_hash`` is RabbitMQ's format (passwords.py);
    ``""`` means no password (only EXTERNAL, a client certificate, logs the user in). ``scram``:
    its SCRAM credentials (scram.py), made when its password was set through tqbroker (a user
    imported with a RabbitMQ hash alone has none: no SCRAM login)."""

    name: str
    password_hash: str = attrs.field(default="", repr=False)
    hashing_algorithm: str = DEFAULT_ALGORITHM
    tags: frozenset[str] = attrs.field(default=frozenset(), converter=_tags)
    scram: tuple[ScramCredential, ...] = attrs.field(default=(), repr=False, converter=_credentials)

    @classmethod
    def with_password(
        cls,
        name: str,
        password: str,
        tags: Iterable[str] = (),
        algorithm: str = DEFAULT_ALGORITHM,
    ) -> User:
        """A user whose plain-text ``password`` is set: its hash and SCRAM credentials."""
        return cls(
            name, hash_password(password, algorithm), algorithm, tags, credentials_for(password)
        )

    def scram_credential(self, mechanism: str) -> ScramCredential | None:
        return next((c for c in self.scram if c.mechanism == mechanism), None)


@attrs.frozen
class Permission:
    """Configure, write and read patterns of one user on one vhost."""

    configure: str = attrs.field(default=".*", converter=_pattern)
    write: str = attrs.field(default=".*", converter=_pattern)
    read: str = attrs.field(default=".*", converter=_pattern)
    _compiled: dict[str, re.Pattern[str]] = attrs.field(
        init=False, repr=False, eq=False, factory=dict
    )

    def allows(self, permission: PermissionKind, name: str) -> bool:
        """Whether ``name`` matches the ``permission`` pattern (unanchored, as RabbitMQ)."""
        compiled = self._compiled.get(permission)
        if compiled is None:
            compiled = self._compiled[permission] = compile_pattern(getattr(self, permission))
        return compiled.search(name) is not None


@attrs.frozen
class TopicPermission:
    """Write and read patterns on routing keys of one topic exchange, for one user and vhost.
    Patterns may name ``{username}``, ``{vhost}`` and ``{client_id}`` (expanded per check)."""

    exchange: str
    write: str = attrs.field(default=".*", converter=_pattern)
    read: str = attrs.field(default=".*", converter=_pattern)

    def allows(
        self, permission: PermissionKind, routing_key: str, variables: dict[str, str]
    ) -> bool:
        pattern = self.write if permission == "write" else self.read
        if permission == "configure":
            return False
        for key, value in variables.items():
            pattern = pattern.replace("{" + key + "}", re.escape(value))
        try:
            return compile_pattern(pattern).search(routing_key) is not None
        except PatternError:
            return False


@attrs.frozen
class AuthUser:
    """A user as a backend authenticated it: what the broker knows of a connection's or a
    request's user. ``backend`` names the backend that answers its authorization checks;
    ``impl`` is that backend's own data (opaque to the broker)."""

    name: str
    tags: frozenset[str] = attrs.field(default=frozenset(), converter=_tags)
    backend: str = "internal"
    impl: object = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_administrator(self) -> bool:
        return ADMINISTRATOR in self.tags


@attrs.frozen
class Peer:
    """Where a login comes from: the peer address (not the bind address), its port, and the
    user name its verified TLS client certificate gives (None without one)."""

    host: str
    port: int | None = None
    certificate_username: str | None = None


def refusal_text(kind: ResourceKind, name: str, vhost: str, user: str) -> str:
    """RabbitMQ 3.10's ACCESS_REFUSED text for a refused resource check (the same for
    configure, write and read), e.g. ``access to queue 'q' in vhost '/' refused for user
    'bob'`` (checked against RabbitMQ)."""
    return f"access to {kind} '{name}' in vhost '{vhost}' refused for user '{user}'"


def topic_refusal_text(routing_key: str, exchange: str, vhost: str, user: str) -> str:
    """RabbitMQ 3.10's text for a refused topic check: ``access to topic 'rk' in exchange
    'amq.topic' in vhost '/' refused for user 'bob'``."""
    return (
        f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}' "
        f"refused for user '{user}'"
    )
