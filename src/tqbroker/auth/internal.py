"""The internal user database (RabbitMQ's ``rabbit_auth_backend_internal``) and its backend.

- ``UserDb``: users, permissions per (user, vhost), topic permissions per (user, vhost,
  exchange); every mutation bumps ``generation`` (permission caches compare it); ``to_json`` and
  ``load_json`` in RabbitMQ's definitions shape (``users``, ``permissions``,
  ``topic_permissions``); ``save`` writes ``users.json`` in the data directory atomically and
  durably (in a worker thread of its own, never the flushers' pool), ``load`` reads it at start.
- ``InternalBackend``: the ``AuthBackend`` over a ``UserDb``; unknown users and users without a
  password cost one dummy hash check, as a wrong password does.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import trio

from ..storage_env import StorageEnv
from .model import AuthUser, Peer, Permission, PermissionKind, ResourceKind, TopicPermission, User
from .passwords import DEFAULT_ALGORITHM, DUMMY_HASH, HashError, check_password, validate_hash
from .scram import credentials_json, parse_credentials

USERS_FILE = "users.json"


class UserDbError(ValueError):
    """A malformed users document (the message names the entry, never a password)."""


def parse_tags(value: object) -> frozenset[str]:
    """Tags as RabbitMQ writes them: a list, or a comma-separated string (older exports)."""
    if isinstance(value, str):
        return frozenset(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, list | tuple) and all(isinstance(t, str) for t in value):
        return frozenset(t.strip() for t in value if t.strip())
    raise UserDbError(f"tags must be a list of strings, not {value!r}")


class UserDb:
    """The internal users, permissions and topic permissions."""

    def __init__(self, env: StorageEnv | None = None) -> None:
        self._env = StorageEnv.default() if env is None else env  # where ``save`` writes
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}  # (user, vhost)
        self.topic_permissions: dict[tuple[str, str, str], TopicPermission] = {}
        # RabbitMQ's user limits (``max-connections``, ``max-channels``) by user; checked by
        # ``broker/limits.py``, exported in each user's ``limits``.
        self.limits: dict[str, dict[str, int]] = {}
        self.generation = 0  # counts the changes (a cluster's catalog follows them)
        self._change = trio.Event()
        self._limiter = trio.CapacityLimiter(1)

    # -- reads -------------------------------------------------------------------------------

    def get(self, name: str) -> User | None:
        return self.users.get(name)

    def all(self) -> list[User]:
        """Every user, by name."""
        return [self.users[n] for n in sorted(self.users)]

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self.permissions.get((user, vhost))

    def permissions_of(
        self, user: str | None = None, vhost: str | None = None
    ) -> list[tuple[str, str, Permission]]:
        """``(user, vhost, permission)`` rows, by user then vhost, filtered by either."""
        return [
            (u, v, p)
            for (u, v), p in sorted(self.permissions.items())
            if (user is None or u == user) and (vhost is None or v == vhost)
        ]

    def topic_permissions_of(
        self, user: str | None = None, vhost: str | None = None
    ) -> list[tuple[str, str, TopicPermission]]:
        return [
            (u, v, p)
            for (u, v, _x), p in sorted(self.topic_permissions.items())
            if (user is None or u == user) and (vhost is None or v == vhost)
        ]

    # -- mutations (each bumps the generation) -----------------------------------------------

    def _changed(self) -> None:
        self.generation += 1
        change, self._change = self._change, trio.Event()
        change.set()

    async def wait_change(self, since: int) -> None:
        """Until ``generation`` has moved past ``since``."""
        while self.generation == since:
            await self._change.wait()

    def put_user(self, user: User) -> None:
        """Create or replace a user (its permissions are kept)."""
        validate_hash(user.password_hash, user.hashing_algorithm)
        self.users[user.name] = user
        self._changed()

    def delete_user(self, name: str) -> bool:
        """Delete a user and its permissions; False if there was none."""
        found = self.users.pop(name, None) is not None
        self.limits.pop(name, None)
        self.permissions = {k: p for k, p in self.permissions.items() if k[0] != name}
        self.topic_permissions = {k: p for k, p in self.topic_permissions.items() if k[0] != name}
        self._changed()
        return found

    def set_permissions(self, user: str, vhost: str, permission: Permission) -> None:
        if user not in self.users:
            raise UserDbError(f"no user '{user}'")
        self.permissions[(user, vhost)] = permission
        self._changed()

    def clear_permissions(self, user: str, vhost: str) -> bool:
        found = self.permissions.pop((user, vhost), None) is not None
        self._changed()
        return found

    def set_topic_permissions(self, user: str, vhost: str, permission: TopicPermission) -> None:
        if user not in self.users:
            raise UserDbError(f"no user '{user}'")
        self.topic_permissions[(user, vhost, permission.exchange)] = permission
        self._changed()

    def clear_topic_permissions(self, user: str, vhost: str, exchange: str | None = None) -> bool:
        """Clear one exchange's topic permissions, or every one of (user, vhost)."""
        before = len(self.topic_permissions)
        self.topic_permissions = {
            k: p
            for k, p in self.topic_permissions.items()
            if not (k[0] == user and k[1] == vhost and (exchange is None or k[2] == exchange))
        }
        self._changed()
        return len(self.topic_permissions) < before

    def delete_vhost(self, vhost: str) -> None:
        """Forget every permission on ``vhost`` (the vhost was deleted)."""
        self.permissions = {k: p for k, p in self.permissions.items() if k[1] != vhost}
        self.topic_permissions = {k: p for k, p in self.topic_permissions.items() if k[1] != vhost}
        self._changed()

    # -- RabbitMQ's definitions shape --------------------------------------------------------

    def to_json(self, vhost: str | None = None) -> dict[str, list[dict[str, Any]]]:
        """``users``, ``permissions`` and ``topic_permissions`` as RabbitMQ exports them (users
        only for a whole-broker export)."""
        return {
            "users": []
            if vhost is not None
            else [
                user_json(u, with_hash=True, with_scram=True, limits=self.limits.get(u.name))
                for u in self.all()
            ],
            "permissions": [
                permission_json(u, v, p) for u, v, p in self.permissions_of(vhost=vhost)
            ],
            "topic_permissions": [
                topic_permission_json(u, v, p) for u, v, p in self.topic_permissions_of(vhost=vhost)
            ],
        }

    def load_json(self, document: Mapping[str, Any]) -> None:
        """Create or overwrite what ``document``'s three sections declare (RabbitMQ's import:
        existing users not named are kept). UserDbError names a malformed entry; nothing is
        applied then."""
        users = [parse_user(u) for u in _entries(document, "users")]
        known = set(self.users) | {u.name for u in users}
        permissions = [parse_permission(p, known) for p in _entries(document, "permissions")]
        topics = [parse_topic_permission(p, known) for p in _entries(document, "topic_permissions")]
        entries = _entries(document, "users")
        limits = {u.name: parse_limits(e) for u, e in zip(users, entries, strict=True)}
        for user in users:
            self.users[user.name] = user
            if limits[user.name]:
                self.limits[user.name] = limits[user.name]
        for name, vhost, permission in permissions:
            self.permissions[(name, vhost)] = permission
        for name, vhost, topic in topics:
            self.topic_permissions[(name, vhost, topic.exchange)] = topic
        self._changed()

    # -- persistence -------------------------------------------------------------------------

    def load(self, data_dir: Path) -> bool:
        """Read ``users.json``; False if there is none yet (a first start)."""
        path = data_dir / USERS_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return False
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise UserDbError(f"{path}: not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise UserDbError(f"{path}: not a JSON object")
        self.load_json(document)
        return True

    async def save(self, data_dir: Path) -> None:
        """Write ``users.json`` atomically and durably (its own worker thread, one at a time)."""
        data = json.dumps(self.to_json(), indent=2, sort_keys=True).encode()
        await trio.to_thread.run_sync(
            lambda: self._env.atomic_write(data_dir / USERS_FILE, data), limiter=self._limiter
        )


def user_json(
    user: User,
    *,
    with_hash: bool,
    with_scram: bool = False,
    limits: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A user as RabbitMQ's definitions and ``/api/users`` show it (the hash only if asked).
    ``with_scram`` (the stored users and definitions exports) adds its SCRAM credentials as
    ``scram_credentials``, a key RabbitMQ's import does not read (it takes the hash)."""
    shown: dict[str, Any] = {"name": user.name}
    if with_hash:
        shown["password_hash"] = user.password_hash
        shown["hashing_algorithm"] = user.hashing_algorithm
    if with_scram and user.scram:
        shown["scram_credentials"] = credentials_json(user.scram)
    shown["tags"] = sorted(user.tags)
    shown["limits"] = dict(limits or {})
    return shown


def parse_limits(entry: Mapping[str, Any]) -> dict[str, int]:
    """A users entry's ``limits`` (``max-connections``, ``max-channels``: integers)."""
    limits = entry.get("limits") or {}
    if not isinstance(limits, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in limits.values()
    ):
        raise UserDbError(f"user '{entry.get('name')}': limits must map names to integers")
    return {str(k): v for k, v in limits.items()}


def permission_json(user: str, vhost: str, p: Permission) -> dict[str, Any]:
    return {
        "user": user,
        "vhost": vhost,
        "configure": p.configure,
        "write": p.write,
        "read": p.read,
    }


def topic_permission_json(user: str, vhost: str, p: TopicPermission) -> dict[str, Any]:
    return {"user": user, "vhost": vhost, "exchange": p.exchange, "write": p.write, "read": p.read}


def _entries(document: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    entries = document.get(section) or []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise UserDbError(f"{section}: must be a list of objects")
    return entries


def _text(entry: Mapping[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise UserDbError(f"{where}: {key} must be a string")
    return value


def parse_user(entry: Mapping[str, Any]) -> User:
    """A users entry: ``password_hash`` (and ``scram_credentials`` from a tqbroker export), or
    a plain-text ``password`` (as RabbitMQ's import takes it), hashed here."""
    name = _text(entry, "name", "users entry")
    where = f"user '{name}'"
    algorithm = _text(entry, "hashing_algorithm", where, DEFAULT_ALGORITHM)
    tags = parse_tags(entry.get("tags", []))
    if "password" in entry and "password_hash" not in entry:
        try:
            return User.with_password(name, _text(entry, "password", where), tags, algorithm)
        except HashError as exc:
            raise UserDbError(f"{where}: {exc}") from None
    password_hash = _text(entry, "password_hash", where, "")
    try:
        validate_hash(password_hash, algorithm)
        scram = parse_credentials(entry.get("scram_credentials", {}))
    except ValueError as exc:
        raise UserDbError(f"{where}: {exc}") from None
    return User(name, password_hash, algorithm, tags, scram)


def parse_permission(
    entry: Mapping[str, Any], users: Iterable[str] = ()
) -> tuple[str, str, Permission]:
    user, vhost = (
        _text(entry, "user", "permissions entry"),
        _text(entry, "vhost", "permissions entry"),
    )
    where = f"permissions of '{user}' on '{vhost}'"
    try:
        return (
            user,
            vhost,
            Permission(*(_text(entry, k, where) for k in ("configure", "write", "read"))),
        )
    except ValueError as exc:
        raise UserDbError(f"{where}: {exc}") from None


def parse_topic_permission(
    entry: Mapping[str, Any], users: Iterable[str] = ()
) -> tuple[str, str, TopicPermission]:
    user, vhost = (
        _text(entry, "user", "topic_permissions entry"),
        _text(entry, "vhost", "topic_permissions entry"),
    )
    where = f"topic permissions of '{user}' on '{vhost}'"
    try:
        fields = (_text(entry, k, where) for k in ("exchange", "write", "read"))
        return user, vhost, TopicPermission(*fields)
    except ValueError as exc:
        raise UserDbError(f"{where}: {exc}") from None


class InternalBackend:
    """The ``AuthBackend`` of the internal database (entry point ``internal``)."""

    def __init__(self, db: UserDb | None = None) -> None:
        self.db = db if db is not None else UserDb()

    @property
    def generation(self) -> int:
        return self.db.generation

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        user = self.db.get(username)
        if password is None:  # EXTERNAL: the certificate vouches; the user must exist
            return None if user is None else AuthUser(user.name, user.tags, "internal")
        if user is None or user.password_hash == "":
            check_password(password, DUMMY_HASH)  # the same cost as a wrong password
            return None
        if not check_password(password, user.password_hash, user.hashing_algorithm):
            return None
        return AuthUser(user.name, user.tags, "internal")

    async def check_vhost(self, user: AuthUser, vhost: str, peer: Peer) -> bool:
        return (user.name, vhost) in self.db.permissions

    async def check_resource(
        self, user: AuthUser, vhost: str, kind: ResourceKind, name: str, permission: PermissionKind
    ) -> bool:
        found = self.db.permission(user.name, vhost)
        return found is not None and found.allows(permission, name)

    async def check_topic(
        self,
        user: AuthUser,
        vhost: str,
        exchange: str,
        routing_key: str,
        permission: PermissionKind,
        variables: Mapping[str, str],
    ) -> bool:
        found = self.db.topic_permissions.get((user.name, vhost, exchange))
        # No topic permission on an exchange: every routing key (RabbitMQ's rule).
        return found is None or found.allows(permission, routing_key, dict(variables))
