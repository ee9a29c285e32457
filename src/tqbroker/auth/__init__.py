"""Authentication and authorization (RabbitMQ's model).

- ``passwords``: RabbitMQ-format salted password hashes;
- ``model``: ``User``, ``Permission``, ``TopicPermission``, ``AuthUser``, ``Peer``;
- ``internal``: the internal user database (``UserDb``) and its backend;
- ``backends``: the ``AuthBackend`` protocol, the ``AuthChain``, ``PermissionCache``;
- ``sasl``: PLAIN, AMQPLAIN, EXTERNAL;
- ``authenticator``: logins with rate limit, caches, loopback users and failure delay.
"""

from __future__ import annotations

from .authenticator import Authenticator, LoginRefused, is_loopback
from .backends import (
    AUTH_BACKENDS_GROUP,
    AuthBackend,
    AuthBackendError,
    AuthChain,
    AuthConfigError,
    PermissionCache,
    load_chain,
)
from .internal import InternalBackend, UserDb, UserDbError
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
