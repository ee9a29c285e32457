"""RabbitMQ's definitions JSON, the schema of both the definitions file and the management
API's export and import (sans-IO: pure functions over dicts and bytes).

The document is RabbitMQ 3.10's: ``rabbit_version``, ``rabbitmq_version``, ``product_name``,
``product_version``, ``users``, ``vhosts``, ``permissions``, ``topic_permissions``,
``parameters``, ``global_parameters``, ``policies``, ``queues``, ``exchanges``, ``bindings``.
What tqbroker keeps that RabbitMQ's schema lacks (the backend a queue lives on, the distribution
of an exchange type, where a holding exchange keeps its messages) is in a ``tqbroker`` object
of the entry, which RabbitMQ's import ignores. Argument values JSON cannot hold (bytes,
decimals, timestamps) are written as ``{"$tqbroker": kind, "value": ...}`` so they read back
exactly (a binding's identity is its arguments).

Responsibilities:
- ``parse_document``: check a document (an import, the definitions file) and return its typed
  entries (``Document``), or ``DefinitionsError`` naming what is wrong;
- ``to_stored`` / ``stored_entry``: the broker's stored form (``definitions.restore`` reads it)
  of a document's durable entries; ``queue_json`` / ``exchange_json`` / ``binding_json``: the
  way back, entry by entry (``from_stored`` for a whole stored topology);
- ``head``: the document's version fields.
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ..protocol.codec import FieldTable, FieldValue, Timestamp, timestamp_value
from .limits import is_vhost_limits

# The RabbitMQ release whose definitions schema this is (its ``rabbit_version``).
RABBITMQ_VERSION: Final = "3.10.8"
PRODUCT_NAME: Final = "tqbroker"
# The sections of the internal user database (``auth.internal`` reads and writes them).
AUTH_SECTIONS: Final = ("users", "permissions", "topic_permissions")
# Sections of RabbitMQ's schema that tqbroker does not model (yet): accepted, reported skipped.
UNMODELLED: Final = (
    "parameters",
    "global_parameters",
    "policies",
)
TAG: Final = "$tqbroker"
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_I64: Final = 2**63


class DefinitionsError(ValueError):
    """A definitions document that cannot be used; the message says where and why."""


@attrs.frozen
class QueueDef:
    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: FieldTable
    extra: Mapping[str, Any]  # the entry's ``tqbroker`` object


@attrs.frozen
class ExchangeDef:
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: FieldTable
    extra: Mapping[str, Any]


@attrs.frozen
class BindingDef:
    vhost: str
    source: str
    destination: str
    destination_type: str
    routing_key: str
    arguments: FieldTable


@attrs.frozen
class Document:
    vhosts: list[str]
    queues: list[QueueDef]
    exchanges: list[ExchangeDef]
    bindings: list[BindingDef]
    unmodelled: dict[str, int]  # section -> entries in it (non-empty sections only)
    # users, permissions, topic_permissions as the document has them (a whole-broker import
    # only), checked and applied by the user database.
    auth: dict[str, list[Any]] = attrs.field(factory=dict)


def head(product_version: str, *, vhost_only: bool = False) -> dict[str, Any]:
    """The version fields a document begins with (a vhost's export has ``rabbit_version`` only,
    as RabbitMQ's)."""
    if vhost_only:
        return {"rabbit_version": RABBITMQ_VERSION}
    return {
        "rabbit_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": PRODUCT_NAME,
        "product_version": product_version,
    }


# -- argument values ------------------------------------------------------------------------


def encode_value(value: FieldValue) -> Any:
    """A field-table value as JSON holds it."""
    if isinstance(value, dict):
        return {key: encode_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [encode_value(item) for item in value]
    if isinstance(value, bytes | bytearray):
        return {TAG: "bytes", "value": base64.b64encode(value).decode()}
    if isinstance(value, decimal.Decimal):
        return {TAG: "decimal", "value": str(value)}
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)
        return {TAG: "timestamp", "value": int((moment - _EPOCH).total_seconds())}
    if isinstance(value, Timestamp):
        return {TAG: "timestamp", "value": value.seconds}
    return value


def decode_value(value: Any, where: str) -> FieldValue:
    """A JSON value as a field-table value (``DefinitionsError`` for one AMQP cannot hold)."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        if not -_I64 <= value < _I64:
            raise DefinitionsError(f"{where}: {value} is out of the signed 64-bit range")
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, list):
        return [decode_value(item, where) for item in value]
    if isinstance(value, dict):
        if set(value) == {TAG, "value"}:
            return _tagged(value[TAG], value["value"], where)
        return decode_table(value, where)
    raise DefinitionsError(f"{where}: {value!r} is not a field value")


def _tagged(kind: object, value: object, where: str) -> FieldValue:
    try:
        if kind == "bytes" and isinstance(value, str):
            return base64.b64decode(value, validate=True)
        if kind == "decimal" and isinstance(value, str):
            return decimal.Decimal(value)
        if kind == "timestamp" and isinstance(value, int) and not isinstance(value, bool):
            return timestamp_value(value)
    except (ValueError, ArithmeticError, OverflowError):
        pass
    raise DefinitionsError(f"{where}: cannot read a {kind!r} value from {value!r}")


def decode_table(value: object, where: str) -> FieldTable:
    if not isinstance(value, dict):
        raise DefinitionsError(f"{where}: 'arguments' must be an object, not {value!r}")
    return {str(key): decode_value(item, where) for key, item in value.items()}


def encode_table(table: Mapping[str, FieldValue]) -> dict[str, Any]:
    return {key: encode_value(value) for key, value in table.items()}


# -- parsing ----------------------------------------------------------------------------------


def _field(entry: Mapping[str, Any], key: str, kind: type, where: str, default: Any = None) -> Any:
    value = entry.get(key, default)
    if value is None or not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        wanted = {str: "a string", bool: "true or false"}.get(kind, kind.__name__)
        raise DefinitionsError(f"{where}: '{key}' must be {wanted}, not {value!r}")
    return value


def _entries(document: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    found = document.get(section)
    if found is None:
        return []
    if not isinstance(found, list) or not all(isinstance(e, dict) for e in found):
        raise DefinitionsError(f"'{section}' must be a list of objects")
    return found


def _extra(entry: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    extra = entry.get("tqbroker", {})
    if not isinstance(extra, dict):
        raise DefinitionsError(f"{where}: 'tqbroker' must be an object")
    return extra


def parse_document(document: object, *, vhost: str | None = None) -> Document:
    """The entries of a definitions document. With ``vhost`` (a vhost's import, as RabbitMQ's
    ``POST /api/definitions/{vhost}``) every entry is that vhost's, whatever it names, and the
    ``vhosts`` section is ignored."""
    if not isinstance(document, dict):
        raise DefinitionsError("a definitions document is a JSON object")

    def vhost_of(entry: Mapping[str, Any], where: str) -> str:
        return vhost if vhost is not None else _field(entry, "vhost", str, where, "/")

    vhosts: list[str] = []
    if vhost is None:
        for n, entry in enumerate(_entries(document, "vhosts")):
            vhosts.append(_field(entry, "name", str, f"vhosts[{n}]"))
    queues: list[QueueDef] = []
    for n, entry in enumerate(_entries(document, "queues")):
        where = f"queues[{n}]"
        queues.append(
            QueueDef(
                vhost_of(entry, where),
                _field(entry, "name", str, where),
                _field(entry, "durable", bool, where, True),
                _field(entry, "auto_delete", bool, where, False),
                decode_table(entry.get("arguments", {}), where),
                _extra(entry, where),
            )
        )
    exchanges: list[ExchangeDef] = []
    for n, entry in enumerate(_entries(document, "exchanges")):
        where = f"exchanges[{n}]"
        exchanges.append(
            ExchangeDef(
                vhost_of(entry, where),
                _field(entry, "name", str, where),
                _field(entry, "type", str, where),
                _field(entry, "durable", bool, where, True),
                _field(entry, "auto_delete", bool, where, False),
                _field(entry, "internal", bool, where, False),
                decode_table(entry.get("arguments", {}), where),
                _extra(entry, where),
            )
        )
    bindings: list[BindingDef] = []
    for n, entry in enumerate(_entries(document, "bindings")):
        where = f"bindings[{n}]"
        kind = _field(entry, "destination_type", str, where, "queue")
        if kind not in ("queue", "exchange"):
            raise DefinitionsError(f"{where}: 'destination_type' must be queue or exchange")
        bindings.append(
            BindingDef(
                vhost_of(entry, where),
                _field(entry, "source", str, where),
                _field(entry, "destination", str, where),
                kind,
                _field(entry, "routing_key", str, where, ""),
                decode_table(entry.get("arguments", {}), where),
            )
        )
    for section in (*UNMODELLED, *AUTH_SECTIONS, "vhosts"):
        found = document.get(section)
        if found is not None and not isinstance(found, list):
            raise DefinitionsError(f"'{section}' must be a list")
    unmodelled = {s: len(document[s]) for s in UNMODELLED if document.get(s)}
    limits = sum(1 for e in document.get("parameters") or [] if is_vhost_limits(e))
    if limits:  # imported (broker/limits.py), not skipped
        unmodelled["parameters"] -= limits
        if not unmodelled["parameters"]:
            del unmodelled["parameters"]
    if vhost is None:
        named = [q.vhost for q in queues] + [x.vhost for x in exchanges]
        named += [b.vhost for b in bindings]
        vhosts += [v for v in dict.fromkeys(named) if v not in vhosts]
    else:
        vhosts = [vhost]
    auth = {s: list(document.get(s) or []) for s in AUTH_SECTIONS} if vhost is None else {}
    return Document(list(dict.fromkeys(vhosts)), queues, exchanges, bindings, unmodelled, auth)


# -- the stored form (what ``definitions.restore`` reads) and back -----------------------------


def to_stored(document: Document) -> dict[str, Any]:
    """The broker's stored topology of a document's durable entries: ``{"vhosts": [...],
    "definitions": {vhost: {"exchanges": [...], "queues": [...], "bindings": [...]}}}``."""
    definitions: dict[str, dict[str, list[dict[str, Any]]]] = {
        v: {"exchanges": [], "queues": [], "bindings": []} for v in document.vhosts
    }
    for q in document.queues:
        if q.durable:
            definitions[q.vhost]["queues"].append(stored_entry(q))
    for x in document.exchanges:
        if x.durable:
            definitions[x.vhost]["exchanges"].append(stored_entry(x))
    for b in document.bindings:
        definitions[b.vhost]["bindings"].append(stored_entry(b))
    return {"vhosts": list(document.vhosts), "definitions": definitions}


def stored_entry(entry: QueueDef | ExchangeDef | BindingDef) -> dict[str, Any]:
    """One entry in the stored form (a queue's ``backend`` is None when the document has none:
    the importer picks it)."""
    if isinstance(entry, QueueDef):
        return {
            "name": entry.name,
            "backend": entry.extra.get("backend"),
            "auto_delete": entry.auto_delete,
            "arguments": entry.arguments,
        }
    if isinstance(entry, ExchangeDef):
        stored = {
            "name": entry.name,
            "type": entry.type,
            "auto_delete": entry.auto_delete,
            "internal": entry.internal,
            "arguments": entry.arguments,
            "type_distribution": entry.extra.get("type_distribution"),
        }
        if entry.extra.get("store_backend") is not None:
            stored["store_backend"] = entry.extra["store_backend"]
        return stored
    return {
        "source": entry.source,
        "destination": entry.destination,
        "destination_type": entry.destination_type,
        "routing_key": entry.routing_key,
        "arguments": entry.arguments,
    }


def queue_json(
    vhost: str | None, stored: Mapping[str, Any], durable: bool = True
) -> dict[str, Any]:
    """A stored queue as a document's entry (``vhost`` None: a vhost's export, without it)."""
    return {
        "name": stored["name"],
        **({"vhost": vhost} if vhost is not None else {}),
        "durable": durable,
        "auto_delete": stored["auto_delete"],
        "arguments": encode_table(stored["arguments"]),
        **({"tqbroker": {"backend": stored["backend"]}} if stored.get("backend") else {}),
    }


def exchange_json(
    vhost: str | None, stored: Mapping[str, Any], durable: bool = True
) -> dict[str, Any]:
    extra = {
        key: stored[key]
        for key in ("type_distribution", "store_backend")
        if stored.get(key) is not None
    }
    return {
        "name": stored["name"],
        **({"vhost": vhost} if vhost is not None else {}),
        "type": stored["type"],
        "durable": durable,
        "auto_delete": stored["auto_delete"],
        "internal": stored["internal"],
        "arguments": encode_table(stored["arguments"]),
        **({"tqbroker": extra} if extra else {}),
    }


def binding_json(vhost: str | None, stored: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "source": stored["source"],
        **({"vhost": vhost} if vhost is not None else {}),
        "destination": stored["destination"],
        "destination_type": stored["destination_type"],
        "routing_key": stored["routing_key"],
        "arguments": encode_table(stored["arguments"]),
    }


def from_stored(stored: Mapping[str, Any], product_version: str) -> dict[str, Any]:
    """A whole stored topology as a document (the definitions file's content)."""
    per_vhost: Mapping[str, Mapping[str, Iterable[Mapping[str, Any]]]] = stored.get(
        "definitions", {}
    )
    names = list(dict.fromkeys([*stored.get("vhosts", []), *per_vhost]))
    return {
        **head(product_version),
        "users": [],
        "vhosts": [{"name": name} for name in names],
        "permissions": [],
        "topic_permissions": [],
        **{section: [] for section in UNMODELLED},
        "queues": [
            queue_json(v, q) for v, defs in per_vhost.items() for q in defs.get("queues", [])
        ],
        "exchanges": [
            exchange_json(v, x) for v, defs in per_vhost.items() for x in defs.get("exchanges", [])
        ],
        "bindings": [
            binding_json(v, b) for v, defs in per_vhost.items() for b in defs.get("bindings", [])
        ],
    }
