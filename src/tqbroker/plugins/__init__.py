"""The API for plugins: everything a plugin may import from tqbroker.

An exchange type is registered under the entry-point group ``tqbroker.exchange_types``
(``docs/plugins.md``); an authentication/authorization backend under ``tqbroker.auth_backends``
(``AuthBackend``, ``AuthUser``, ``Peer``, ``AuthBackendError``; ``docs/security.md``).
Plugins import only the names below; everything else in tqbroker is private
and may change without notice.
"""

from __future__ import annotations

from ..auth.backends import AuthBackend, AuthBackendError
from ..auth.model import AuthUser, Peer, PermissionKind, ResourceKind
from ..backends.base import FLUSH_FIRST, FlushFirst, Popped, QueueStore
from ..clock import now_ms, to_trio
from ..model import Message
from ..protocol.codec import FieldTable, FieldValue, encode_table
from ..protocol.methods import BasicProperties
from .spec import (
    Destination,
    Durability,
    ExchangeContext,
    ExchangeType,
    FlushListener,
    GroupCommit,
    HoldingRouter,
    PropertyRouter,
    Router,
)

__all__ = [
    "FLUSH_FIRST",
    "AuthBackend",
    "AuthBackendError",
    "AuthUser",
    "BasicProperties",
    "Destination",
    "Durability",
    "ExchangeContext",
    "ExchangeType",
    "FieldTable",
    "FieldValue",
    "FlushFirst",
    "FlushListener",
    "GroupCommit",
    "HoldingRouter",
    "Message",
    "Peer",
    "PermissionKind",
    "Popped",
    "PropertyRouter",
    "QueueStore",
    "ResourceKind",
    "Router",
    "encode_table",
    "now_ms",
    "to_trio",
]
