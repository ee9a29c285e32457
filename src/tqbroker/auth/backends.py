"""Authentication and authorization backends, after RabbitMQ's ``auth_backends`` chain.

- ``AuthBackend``: the protocol a backend implements (all async: a remote backend does I/O).
  Plugins register a class under the entry-point group ``tqbroker.auth_backends``; it is
  instantiated with the options of ``[auth_backend_options.<name>]`` as keyword arguments.
- ``AuthChain``: the configured backends in order (config ``auth_backends``, default
  ``["internal"]``). Authentication asks each in turn; the backend that authenticated the user
  answers its authorization checks. The default exchange is checked as ``amq.default``, as
  RabbitMQ does, before any backend sees it.
- ``PermissionCache``: a per-channel cache of resource checks, keyed (kind, name, permission),
  emptied when the chain's ``generation`` changes (a permission was changed).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from .model import AuthUser, Peer, PermissionKind, ResourceKind

log = logging.getLogger(__name__)

AUTH_BACKENDS_GROUP = "tqbroker.auth_backends"
DEFAULT_EXCHANGE_RESOURCE = "amq.default"


class AuthBackendError(Exception):
    """A backend could not answer (a remote service down, a malformed reply): the login or the
    check is refused, and the message (never a password) is logged."""


class AuthConfigError(Exception):
    """An auth backend that cannot be loaded or configured: a clear startup error."""


@runtime_checkable
class AuthBackend(Protocol):
    """What an authentication/authorization backend implements (RabbitMQ's contract).

    ``generation`` changes whenever an answer of the backend may have changed (a permission
    set, a user deleted): caches of its answers compare it. A backend whose answers change
    out of the broker's sight (a remote service) moves it at least as often as its answers
    may be cached (its TTL), so that the broker's caches hold them no longer.
    """

    @property
    def generation(self) -> int: ...

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        """The user if ``password`` is theirs; ``password`` None is EXTERNAL (the client
        certificate vouches for ``username``: the user must exist). None refuses; a backend
        that cannot answer raises ``AuthBackendError``."""
        ...

    async def check_vhost(self, user: AuthUser, vhost: str, peer: Peer) -> bool:
        """Whether ``user`` may open ``vhost``."""
        ...

    async def check_resource(
        self,
        user: AuthUser,
        vhost: str,
        kind: ResourceKind,
        name: str,
        permission: PermissionKind,
    ) -> bool:
        """Whether ``user`` has ``permission`` on the queue or exchange ``name`` of ``vhost``
        (the default exchange comes as ``amq.default``)."""
        ...

    async def check_topic(
        self,
        user: AuthUser,
        vhost: str,
        exchange: str,
        routing_key: str,
        permission: PermissionKind,
        variables: Mapping[str, str],
    ) -> bool:
        """Whether ``user`` may ``permission`` (write: publish, read: bind/consume) with
        ``routing_key`` on the topic exchange ``exchange``; ``variables`` are ``username``,
        ``vhost`` and ``client_id`` for patterns that name them."""
        ...


class AuthChain:
    """The configured backends, in order."""

    def __init__(self, backends: Sequence[tuple[str, AuthBackend]]) -> None:
        if not backends:
            raise AuthConfigError("auth_backends: at least one backend is needed")
        self.backends: dict[str, AuthBackend] = dict(backends)
        self._only = next(iter(self.backends.values())) if len(self.backends) == 1 else None

    @property
    def generation(self) -> int:
        """Changes when any backend's answers may have (see ``AuthBackend.generation``)."""
        if self._only is not None:  # the usual single backend: no generator per check
            return self._only.generation
        return sum(b.generation for b in self.backends.values())

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        """The first backend's user that accepts; None when every backend refuses.
        ``AuthBackendError`` when none accepts and one or more could not answer (the login is
        refused, but it is not the client's failure)."""
        unanswered: list[str] = []
        for name, backend in self.backends.items():
            try:
                user = await backend.authenticate(username, password, peer)
            except AuthBackendError as exc:
                log.warning("auth backend %r could not authenticate %r: %s", name, username, exc)
                unanswered.append(name)
                continue
            if user is not None:
                return user if user.backend == name else _with_backend(user, name)
        if unanswered:
            raise AuthBackendError(f"no answer from auth backend(s) {', '.join(unanswered)}")
        return None

    def _backend(self, user: AuthUser) -> AuthBackend | None:
        return self.backends.get(user.backend)

    async def check_vhost(self, user: AuthUser, vhost: str, peer: Peer) -> bool:
        backend = self._backend(user)
        return backend is not None and await _ask(backend.check_vhost(user, vhost, peer))

    async def check_resource(
        self,
        user: AuthUser,
        vhost: str,
        kind: ResourceKind,
        name: str,
        permission: PermissionKind,
    ) -> bool:
        backend = self._backend(user)
        if kind == "exchange" and name == "":
            name = DEFAULT_EXCHANGE_RESOURCE
        return backend is not None and await _ask(
            backend.check_resource(user, vhost, kind, name, permission)
        )

    async def check_topic(
        self,
        user: AuthUser,
        vhost: str,
        exchange: str,
        routing_key: str,
        permission: PermissionKind,
        variables: Mapping[str, str] | None = None,
    ) -> bool:
        backend = self._backend(user)
        values = {"username": user.name, "vhost": vhost, **(variables or {})}
        return backend is not None and await _ask(
            backend.check_topic(user, vhost, exchange, routing_key, permission, values)
        )


async def _ask(answer: Any) -> bool:
    try:
        return bool(await answer)
    except AuthBackendError as exc:
        log.warning("auth backend could not answer a permission check: %s", exc)
        return False


def _with_backend(user: AuthUser, name: str) -> AuthUser:
    return AuthUser(user.name, user.tags, name, user.impl)


class PermissionCache:
    """One channel's cache of resource and topic checks (RabbitMQ caches them per channel),
    emptied when the chain's generation changes; at most ``size`` entries of each.
    ``cached``/``cached_topic`` are the synchronous fast path (None: not known, ask
    ``check``/``check_topic``)."""

    __slots__ = (
        "_answers",
        "_chain",
        "_generation",
        "_size",
        "_topics",
        "_user",
        "_variables",
        "_vhost",
    )

    def __init__(
        self,
        chain: AuthChain,
        user: AuthUser,
        vhost: str,
        size: int = 64,
        variables: Mapping[str, str] | None = None,
    ) -> None:
        self._chain, self._user, self._vhost, self._size = chain, user, vhost, size
        self._variables = dict(variables or {})
        self._generation = chain.generation
        self._answers: dict[tuple[str, str, str], bool] = {}
        self._topics: dict[tuple[str, str, str], bool] = {}

    def _fresh(self) -> None:
        generation = self._chain.generation
        if generation != self._generation:
            self._answers.clear()
            self._topics.clear()
            self._generation = generation

    def cached(self, kind: ResourceKind, name: str, permission: PermissionKind) -> bool | None:
        """The cached answer of a resource check, None if not known (a dict lookup)."""
        if self._chain.generation != self._generation:
            self._fresh()
            return None
        return self._answers.get((kind, name, permission))

    def cached_topic(
        self, exchange: str, routing_key: str, permission: PermissionKind
    ) -> bool | None:
        if self._chain.generation != self._generation:
            self._fresh()
            return None
        return self._topics.get((exchange, routing_key, permission))

    async def check(self, kind: ResourceKind, name: str, permission: PermissionKind) -> bool:
        self._fresh()
        key = (kind, name, permission)
        answer = self._answers.get(key)
        if answer is None:
            answer = await self._chain.check_resource(
                self._user, self._vhost, kind, name, permission
            )
            _remember(self._answers, key, answer, self._size)
        return answer

    async def check_topic(
        self, exchange: str, routing_key: str, permission: PermissionKind
    ) -> bool:
        """A topic permission check (the variables given at construction, e.g. client_id)."""
        self._fresh()
        key = (exchange, routing_key, permission)
        answer = self._topics.get(key)
        if answer is None:
            answer = await self._chain.check_topic(
                self._user, self._vhost, exchange, routing_key, permission, self._variables
            )
            _remember(self._topics, key, answer, self._size)
        return answer


def _remember(
    answers: dict[tuple[str, str, str], bool], key: tuple[str, str, str], answer: bool, size: int
) -> None:
    if len(answers) >= size:
        answers.pop(next(iter(answers)))
    answers[key] = answer


def load_chain(
    names: Sequence[str],
    options: Mapping[str, Mapping[str, Any]] | None = None,
    builtin: Mapping[str, AuthBackend] | None = None,
) -> AuthChain:
    """The chain of ``names``, each found under ``tqbroker.auth_backends`` (or in ``builtin``,
    instances the broker made itself, such as its internal database) and instantiated with
    ``options[name]``. AuthConfigError names an unknown or failing backend."""
    found = {ep.name: ep for ep in entry_points(group=AUTH_BACKENDS_GROUP)}
    chain: list[tuple[str, AuthBackend]] = []
    for name in names:
        if builtin is not None and name in builtin:
            chain.append((name, builtin[name]))
            continue
        ep = found.get(name)
        if ep is None:
            known = sorted(set(found) | set(builtin or {}))
            raise AuthConfigError(
                f"auth_backends: unknown backend {name!r} (installed: {', '.join(known)})"
            )
        try:
            obj = ep.load()
            backend = obj(**dict((options or {}).get(name, {}))) if isinstance(obj, type) else obj
        except Exception as exc:
            raise AuthConfigError(
                f"auth backend {name!r} ({ep.value}) failed to load: {exc}"
            ) from exc
        if not isinstance(backend, AuthBackend):
            raise AuthConfigError(
                f"auth backend {name!r} ({ep.value}) does not implement AuthBackend"
            )
        chain.append((name, backend))
    return AuthChain(chain)
