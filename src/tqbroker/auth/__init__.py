"""Authentication and authorization (RabbitMQ's model).

- ``passwords``: RabbitMQ-format salted password hashes;
- ``model``: ``User``, ``Permission``, ``TopicPermission``, ``AuthUser``, ``Peer``;
- ``internal``: the internal user database (``UserDb``) and its backend;
- ``backends``: the ``AuthBackend`` protocol, the ``AuthChain``, ``PermissionCache``;
- ``sasl``: PLAIN, AMQPLAIN, EXTERNAL;
- ``authenticator``: logins with rate limit, caches, loopback users and failure delay.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .backends import (
    AUTH_BACKENDS_GROUP,
    AuthBackend,
    AuthBackendError,
    AuthChain,
    AuthConfigError,
    PermissionCache,
    load_chain,
)
from .model import (
    AuthUser,
    Peer,
    Permission,
    PermissionKind,
    ResourceKind,
    TopicPermission,
    User,
    refusal_text,
    topic_refusal_text,
)
from .passwords import DEFAULT_ALGORITHM, check_password, hash_password

if TYPE_CHECKING:
    from .authenticator import Authenticator as Authenticator
    from .authenticator import LoginRefused as LoginRefused
    from .authenticator import is_loopback as is_loopback
    from .internal import InternalBackend as InternalBackend
    from .internal import UserDb as UserDb
    from .internal import UserDbError as UserDbError

# The modules that use trio load on first use: ``tqbroker.config`` imports this package's
# password and SASL parts, and ``import tqbroker.protocol`` must stay free of trio (sans-IO).
_LAZY = {
    "Authenticator": "authenticator",
    "LoginRefused": "authenticator",
    "is_loopback": "authenticator",
    "InternalBackend": "internal",
    "UserDb": "internal",
    "UserDbError": "internal",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tqbroker.auth' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "AUTH_BACKENDS_GROUP",
    "DEFAULT_ALGORITHM",
    "AuthBackend",
    "AuthBackendError",
    "AuthChain",
    "AuthConfigError",
    "AuthUser",
    "Authenticator",
    "InternalBackend",
    "LoginRefused",
    "Peer",
    "Permission",
    "PermissionCache",
    "PermissionKind",
    "ResourceKind",
    "TopicPermission",
    "User",
    "UserDb",
    "UserDbError",
    "check_password",
    "hash_password",
    "is_loopback",
    "load_chain",
    "refusal_text",
    "topic_refusal_text",
]
