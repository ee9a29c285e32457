"""The API for exchange-type plugins: everything a plugin may import from tqbroker.

An exchange type is registered under the entry-point group ``tqbroker.exchange_types``
(``docs/plugins.md``). Plugins import only the names below; everything else in tqbroker is private
and may change without notice.
"""

from __future__ import annotations

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
    "BasicProperties",
    "Destination",
    "Durability",
    "ExchangeContext",
    "ExchangeType",
    "FieldTable",
    "FieldValue",
    "FlushListener",
    "GroupCommit",
    "HoldingRouter",
    "Message",
    "PropertyRouter",
    "Router",
    "encode_table",
    "now_ms",
    "to_trio",
]
