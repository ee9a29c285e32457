"""The API for exchange-type plugins: everything a plugin may import from tqbroker.

An exchange type is registered under the entry-point group ``tqbroker.exchange_types``
(``docs/plugins.md``). Plugins import only the names below; everything else in tqbroker is private
and may change without notice.
"""

from __future__ import annotations

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
    "Popped",
    "PropertyRouter",
    "QueueStore",
    "Router",
    "encode_table",
    "now_ms",
    "to_trio",
]
