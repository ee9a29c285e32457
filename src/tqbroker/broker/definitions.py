"""Durable definitions: the vhosts' durable exchanges, queues and bindings, and their file.

Responsibilities:
- what of the vhosts survives a restart (durable exchanges but the predeclared ones, durable
  non-exclusive queues with the backend they live on, bindings between durable ends), in the
  stored form (``broker/definitions_snapshot.py`` encodes it as the definitions file holds it,
  ``broker/definitions_json.py`` reads it back); ``assign_backends`` for entries naming none;
- ``restore``: recreate a vhost's definitions at startup; what ``unrestorable`` found is kept
  dormant (``broker/dormant.py``), never dropped;
- ``missing_backend``: why stored definitions cannot be restored without losing messages (a
  queue or a holding exchange on a backend that is not loaded);
- ``unrestorable``: stored exchanges whose type does not load and queues whose arguments no
  longer validate (the broker refuses to start, or keeps them dormant when told to);
- ``open_stored``: recover the stored queues' stores before ``restore`` (in a worker thread).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..backends.base import Backend
from ..plugins.loader import EXCHANGE_TYPES_GROUP, distributions
from ..plugins.spec import ExchangeType
from ..protocol.errors import AMQPError
from .arguments import STREAM, QueueArguments, check_declaration
from .exchange import Exchange
from .exchange_types import new_exchange
from .holding import STORE_PREFIX, HoldingExchange
from .queue import Queue
from .storage import QueueStorage
from .vhost import VirtualHost

log = logging.getLogger(__name__)


def _exchanges(vhost: VirtualHost, *, durable: bool = True) -> list[dict[str, Any]]:
    """The vhost's durable exchanges (all of them but the default and the ``amq.`` ones unless
    ``durable``), in the stored form."""
    return [
        {
            "name": x.name,
            "type": x.type_name,
            "auto_delete": x.auto_delete,
            "internal": x.internal,
            "arguments": x.arguments,
            # What installs the type (a plugin): named if the type is ever missing at a start.
            "type_distribution": _plugin(distributions(EXCHANGE_TYPES_GROUP).get(x.type_name)),
            # Where a holding exchange's store is (it reopens there after a restart).
            **(
                {"store_backend": x.context.backend_name}
                if isinstance(x, HoldingExchange) and x.context is not None
                else {}
            ),
        }
        for x in vhost.exchanges.values()
        if (x.durable or not durable) and x.name and not x.name.startswith("amq.")
    ]


def _plugin(distribution: str | None) -> str | None:
    """The distribution that installs an exchange type, unless it is tqbroker's own."""
    own = distribution is None or distribution.partition(" ")[0] == "tqbroker"
    return None if own else distribution


def _bindings(vhost: VirtualHost, *, durable: bool = True) -> list[dict[str, Any]]:
    """The vhost's bindings between durable exchanges and durable queues or exchanges (between
    any, unless ``durable``; never to an exclusive queue), in the stored form."""
    return [
        {
            "source": source.name,
            "destination": dest.name,
            "destination_type": "queue" if isinstance(dest, Queue) else "exchange",
            "routing_key": key,
            "arguments": arguments,
        }
        for source in vhost.exchanges.values()
        if source.name and (source.durable or not durable)
        for (dest, key, _args_id), arguments in source.bindings.items()
        if isinstance(dest, Queue | Exchange)
        and (dest.durable or not durable)
        and not (isinstance(dest, Queue) and dest.exclusive_owner is not None)
    ]


class StartupError(RuntimeError):
    """The broker cannot start as configured; the message says why."""


def refusal(problem: Unrestorable, more: int = 0) -> str:
    """The one line a refused start prints."""
    others = f" (and {more} more: see the log)" if more else ""
    return (
        f"{problem}{others}; refusing to start rather than lose it: install or fix what it "
        "needs, or start with --keep-unloadable-definitions to keep it dormant"
    )


@attrs.frozen
class Unrestorable:
    """A stored exchange or queue the broker cannot run as it is."""

    vhost: str
    kind: str  # "exchange" or "queue"
    definition: dict[str, Any]
    why: str

    def __str__(self) -> str:
        return (
            f"durable {self.kind} '{self.definition['name']}' in vhost '{self.vhost}': {self.why}"
        )


def unrestorable(
    stored: Mapping[str, Any], exchange_types: Mapping[str, ExchangeType]
) -> list[Unrestorable]:
    """The stored exchanges whose type is not loaded and the stored queues whose arguments no
    longer validate (reads only)."""
    found: list[Unrestorable] = []
    installed = distributions(EXCHANGE_TYPES_GROUP)
    for vhost, defs in stored.get("definitions", {}).items():
        for x in defs.get("exchanges", []):
            type_name = x["type"]
            if type_name in exchange_types:
                continue
            if type_name in installed:
                why = (
                    f"its exchange type '{type_name}' (from {installed[type_name]}) failed to "
                    "load (the log says why)"
                )
            else:
                source = x.get("type_distribution") or "an unknown distribution"
                why = f"its exchange type '{type_name}' (from {source}) is not installed"
            found.append(Unrestorable(vhost, "exchange", x, why))
        for q in defs.get("queues", []):
            try:
                check_declaration(
                    q["name"],
                    vhost,
                    durable=True,
                    exclusive=False,
                    auto_delete=q["auto_delete"],
                    arguments=q["arguments"],
                )
            except AMQPError as exc:
                found.append(Unrestorable(vhost, "queue", q, f"its arguments: {exc.reply_text}"))
    return found


def restore(
    vhost: VirtualHost,
    definitions: Mapping[str, list[dict[str, Any]]],
    *,
    dormant: Sequence[Unrestorable] = (),
    keep_unloadable: bool = False,
) -> None:
    """Recreate durable definitions saved by ``definitions`` (at startup); keep ``dormant``
    ones (and the bindings naming them) as they are. An exchange whose type refuses to recreate
    it stops the start (``StartupError``), or with ``keep_unloadable`` is kept dormant too."""
    for item in dormant:
        vhost.dormant.keep(item.kind, item.definition, item.why)
    vhost.routing.changed()
    for x in definitions.get("exchanges", []):
        if x["name"] in vhost.dormant.exchanges:
            continue
        try:
            vhost.exchanges[x["name"]] = new_exchange(
                vhost,
                x["name"],
                x["type"],
                durable=True,
                auto_delete=x["auto_delete"],
                internal=x["internal"],
                arguments=x["arguments"],
                store_backend=x.get("store_backend"),
                restoring=True,
            )
        except AMQPError as exc:  # e.g. what an exchange type needs is no longer installed
            problem = Unrestorable(vhost.name, "exchange", x, exc.reply_text)
            if not keep_unloadable:
                raise StartupError(refusal(problem)) from None
            log.error("%s; kept dormant", problem)
            vhost.dormant.keep("exchange", x, exc.reply_text)
    for q in definitions.get("queues", []):
        if q["name"] in vhost.dormant.queues:
            continue
        vhost.create_queue(
            q["name"],
            q["backend"],
            durable=True,
            exclusive_owner=None,
            auto_delete=q["auto_delete"],
            arguments=QueueArguments.parse(q["arguments"]),
        )
    for b in definitions.get("bindings", []):
        if vhost.dormant.involves(b):
            vhost.dormant.bindings.append(b)
            continue
        source = vhost.exchanges.get(b["source"])
        dest: Queue | Exchange | None = (
            vhost.queues.get(b["destination"])
            if b["destination_type"] == "queue"
            else vhost.exchanges.get(b["destination"])
        )
        if source is not None and dest is not None:
            ref = source.bind(dest, b["routing_key"], b["arguments"])
            if ref is not None:
                dest.bound_by.add(ref)
    vhost.routing.changed()


def assign_backends(
    stored: Mapping[str, Any], backends: Mapping[str, Backend], durable_backend: str
) -> None:
    """Give a backend to each stored queue whose entry names none (a definitions file written
    by RabbitMQ or by hand): the one a declare would choose."""
    for vhost, defs in stored.get("definitions", {}).items():
        storage = QueueStorage(vhost, backends, durable_backend)
        for q in defs.get("queues", []):
            if q.get("backend") is None:
                try:
                    arguments = QueueArguments.parse(q["arguments"])
                    q["backend"] = storage.backend_for(
                        q["name"], durable=True, exclusive=False, arguments=arguments
                    )
                except (AMQPError, ValueError, TypeError):  # reported by ``unrestorable``
                    q["backend"] = durable_backend


def backends_in_use(stored: Mapping[str, Any]) -> set[str]:
    """The backends that stored durable queues and message-holding exchanges live on."""
    used: set[str] = set()
    for defs in stored.get("definitions", {}).values():
        used.update(queue["backend"] for queue in defs.get("queues", []))
        used.update(e["store_backend"] for e in defs.get("exchanges", []) if e.get("store_backend"))
    return used


def missing_backend(stored: Mapping[str, Any], backends: Mapping[str, object]) -> str | None:
    """Why the stored definitions cannot be restored with ``backends`` without losing messages
    (None: they can)."""
    for vhost, defs in stored.get("definitions", {}).items():
        for queue in defs.get("queues", []):
            if queue["backend"] not in backends:
                # Recreating it elsewhere would orphan its messages for good.
                return (
                    f"durable queue {queue['name']!r} in vhost {vhost!r} is stored on the "
                    f"{queue['backend']!r} backend, which is not loaded; install or fix it "
                    "(refusing to start rather than lose its messages)"
                )
        for exchange in defs.get("exchanges", []):
            # An exchange type that holds messages keeps them in a store of its own.
            backend = exchange.get("store_backend")
            if backend is not None and backend not in backends:
                return (
                    f"durable exchange {exchange['name']!r} in vhost {vhost!r} holds its "
                    f"messages on the {backend!r} backend, which is not loaded; install or "
                    "fix it (refusing to start rather than lose its messages)"
                )
    return None


def open_stored(
    stored: Mapping[str, Any],
    dormant: Sequence[Unrestorable],
    backends: Mapping[str, Backend],
    durable_backend: str,
) -> None:
    """Open (recover) the stores of the stored queues and holding exchanges, so that
    ``restore`` finds them open (a backend returns an open store again). Blocking: run in a
    worker thread before ``restore``. A store that fails to open here is left to ``restore``,
    which reports it."""
    kept = {(d.vhost, d.kind, d.definition["name"]) for d in dormant}
    for vhost, defs in stored.get("definitions", {}).items():
        storage = QueueStorage(vhost, backends, durable_backend)
        for q in defs.get("queues", []):
            if (vhost, "queue", q["name"]) in kept:
                continue
            try:
                arguments = QueueArguments.parse(q["arguments"])
                if arguments.kind == STREAM:
                    storage.open_stream(q["backend"], q["name"], arguments)
                else:
                    storage.open_store(q["backend"], q["name"], arguments)
            except Exception as exc:
                log.debug("queue %r in vhost %r: not opened ahead: %r", q["name"], vhost, exc)
        for x in defs.get("exchanges", []):
            backend = backends.get(x.get("store_backend") or "")
            if backend is None or (vhost, "exchange", x["name"]) in kept:
                continue
            try:
                backend.open_queue(vhost, STORE_PREFIX + x["name"])
            except Exception as exc:
                log.debug("exchange %r in vhost %r: not opened ahead: %r", x["name"], vhost, exc)
