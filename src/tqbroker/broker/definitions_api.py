"""Definitions export and import on a running broker, with RabbitMQ's semantics (the management
API's ``/api/definitions`` and ``load_definitions`` at boot use these).

Responsibilities:
- ``export`` (and ``encode``, its JSON a slice at a time): the live topology as RabbitMQ's
  definitions document, whole or one vhost's, as RabbitMQ exports it: every exchange but the
  default and ``amq.*`` ones, every queue but the exclusive ones, durable or not, and the
  bindings between them; dormant definitions too;
- ``load_definitions``: import a file at boot (``load_definitions``), strictly;
- ``import_document``: create what a ``definitions_json.Document`` declares and is missing
  (vhosts, exchanges, queues, bindings), through the same checks as an AMQP declare. The whole
  document is checked first (exchange types, queue arguments): a bad one changes nothing.
  RabbitMQ's import keeps an existing exchange or queue that differs from the document and
  ignores a binding whose ends do not exist; so does this one (reported), unless ``strict``
  (at boot: ``DefinitionsError`` naming it). Users, permissions and topic permissions (a
  whole-broker document) go to the user database: created or overwritten, as RabbitMQ's import.
  What tqbroker does not model (policies, parameters) and reserved names (``amq.*``, the empty
  queue name) are skipped and reported.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from .._version import __version__
from ..auth.internal import UserDb, UserDbError
from ..protocol.errors import AMQPError, ReplyCode
from .arguments import QueueArguments, check_declaration
from .declaring import check_queue_declare, open_and_declare_queue, open_storage
from .definitions import StartupError, _bindings, _exchanges
from .definitions_json import (
    UNMODELLED,
    BindingDef,
    DefinitionsError,
    Document,
    ExchangeDef,
    QueueDef,
    binding_json,
    exchange_json,
    head,
    parse_document,
    queue_json,
)
from .definitions_snapshot import stored_queue
from .pacing import Pacer
from .queue import Queue
from .vhost import VirtualHost

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

ENCODED_ENTRIES = 200  # entries encoded between two yields of ``encode``
OPEN_AT_ONCE = 32  # new queues' stores an import opens at once (worker threads)


async def export(
    broker: Broker, vhost: str | None = None, *, queues_kept: Callable[[Queue], bool] | None = None
) -> dict[str, Any]:
    """The topology as RabbitMQ's ``GET /api/definitions`` (or ``/api/definitions/{vhost}``)
    answers it (``queues_kept``: only the running queues it keeps, and the bindings to them).
    Built a slice at a time (100k queues would hold the event loop ~1 s)."""
    names = [vhost] if vhost is not None else list(broker.vhosts)
    queues: list[dict[str, Any]] = []
    exchanges: list[dict[str, Any]] = []
    bindings: list[dict[str, Any]] = []
    pacer = Pacer()
    for name in names:
        host = broker.vhosts.get(name)
        if host is None:  # deleted meanwhile
            continue
        field = None if vhost is not None else name
        dormant = host.dormant.definitions()
        kept = [
            queue
            for queue in list(host.queues.values())
            if queue.exclusive_owner is None and (queues_kept is None or queues_kept(queue))
        ]
        for queue in kept:
            queues.append(queue_json(field, stored_queue(queue), queue.durable))
            await pacer.step()
        queues += [queue_json(field, q) for q in dormant["queues"]]
        durability = {x.name: x.durable for x in host.exchanges.values()}
        for x in _exchanges(host, durable=False):
            exchanges.append(exchange_json(field, x, durability[x["name"]]))
        exchanges += [exchange_json(field, x) for x in dormant["exchanges"]]
        for b in _bindings(host, durable=False) + dormant["bindings"]:
            if queues_kept is not None and b["destination_type"] == "queue":
                destination = host.queues.get(b["destination"])
                if destination is not None and not queues_kept(destination):
                    continue
            bindings.append(binding_json(field, b))
            await pacer.step()
    if vhost is not None:
        return {
            **head(__version__, vhost_only=True),
            "parameters": broker.limits.parameters(vhost),
            "policies": [],
            "queues": queues,
            "exchanges": exchanges,
            "bindings": bindings,
        }
    auth = broker.users.to_json()
    return {
        **head(__version__),
        "users": auth["users"],
        "vhosts": [{"name": name} for name in names],
        "permissions": auth["permissions"],
        "topic_permissions": auth["topic_permissions"],
        **{section: [] for section in UNMODELLED},
        "parameters": broker.limits.parameters(),  # the vhost limits, as RabbitMQ exports them
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


async def encode(document: Mapping[str, Any]) -> AsyncIterator[bytes]:
    """``document`` as JSON, a slice of entries at a time (a checkpoint between)."""
    pacer = Pacer()
    pending: list[bytes] = [b"{"]
    for n, (key, value) in enumerate(document.items()):
        pending.append(b"%s%s:" % (b"," if n else b"", json.dumps(key).encode()))
        if not isinstance(value, list) or len(value) < ENCODED_ENTRIES:
            pending.append(json.dumps(value).encode())
            continue
        pending.append(b"[")
        for i, entry in enumerate(value):
            pending.append(b"%s%s" % (b"," if i else b"", json.dumps(entry).encode()))
            if len(pending) >= ENCODED_ENTRIES:
                yield b"".join(pending)
                pending.clear()
            await pacer.step()
        pending.append(b"]")
    pending.append(b"}")
    yield b"".join(pending)


def _queue_where(q: QueueDef | ExchangeDef) -> str:
    kind = "queue" if isinstance(q, QueueDef) else "exchange"
    return f"{kind} '{q.name}' in vhost '{q.vhost}'"


def _binding_where(b: BindingDef) -> str:
    return (
        f"binding of {b.destination_type} '{b.destination}' to exchange '{b.source}' "
        f"(routing key '{b.routing_key}') in vhost '{b.vhost}'"
    )


def check(broker: Broker, document: Document) -> list[str]:
    """Refuse (``DefinitionsError``) a document whose exchange types are not installed or whose
    queue declarations are invalid; what importing it will skip. Reads only."""
    skipped = [
        f"{section} ({count}): not modelled by tqbroker"
        for section, count in document.unmodelled.items()
    ]
    try:
        UserDb().load_json(document.auth)  # checked on a scratch database: a bad entry, no change
    except UserDbError as exc:
        raise DefinitionsError(str(exc)) from None
    for x in document.exchanges:
        if x.name == "" or x.name.startswith("amq."):
            skipped.append(f"{_queue_where(x)}: a reserved name")
        elif x.type not in broker.exchange_types:
            raise DefinitionsError(
                f"{_queue_where(x)}: unknown exchange type '{x.type}' (installed: "
                f"{', '.join(sorted(broker.exchange_types))})"
            )
    for q in document.queues:
        if q.name == "" or q.name.startswith("amq."):
            skipped.append(f"{_queue_where(q)}: a reserved name")
            continue
        try:
            check_declaration(
                q.name,
                q.vhost,
                durable=q.durable,
                exclusive=False,
                auto_delete=q.auto_delete,
                arguments=q.arguments,
            )
        except AMQPError as exc:
            raise DefinitionsError(exc.reply_text) from None
    return skipped


async def import_document(broker: Broker, document: Document, *, strict: bool) -> list[str]:
    """Create what ``document`` declares and is missing; what was skipped, one line each."""
    skipped = check(broker, document)
    vhosts = {name: broker.add_vhost(name) for name in document.vhosts}

    def conflict(where: str, exc: AMQPError) -> None:
        if strict:
            raise DefinitionsError(f"{where}: {exc.reply_text}")
        skipped.append(f"{where}: kept as it is ({exc.reply_text})")

    for x in document.exchanges:
        if x.name == "" or x.name.startswith("amq."):
            continue
        vhost = vhosts[x.vhost]
        existed = x.name in vhost.exchanges or x.name in vhost.dormant.exchanges
        try:
            vhost.declare_exchange(
                x.name,
                x.type,
                passive=False,
                durable=x.durable,
                auto_delete=x.auto_delete,
                internal=x.internal,
                arguments=dict(x.arguments),
            )
        except AMQPError as exc:
            if not existed:
                raise DefinitionsError(f"{_queue_where(x)}: {exc.reply_text}") from None
            conflict(_queue_where(x), exc)

    def queue_refused(q: QueueDef, existed: bool, exc: AMQPError) -> None:
        if not existed:
            raise DefinitionsError(f"{_queue_where(q)}: {exc.reply_text}") from None
        conflict(_queue_where(q), exc)

    await _declare_queues(vhosts, document.queues, queue_refused)
    for b in document.bindings:
        _bind(vhosts[b.vhost], b, skipped, strict=strict)
    if any(document.auth.values()):
        broker.users.load_json(document.auth)
        await broker.users.save(broker.config.data_dir)
    for line in skipped:
        log.info("definitions import: skipped %s", line)
    return skipped


_Opening = tuple[QueueDef, tuple[str, str, QueueArguments], bool]  # what, found, existed


async def _declare_queues(
    vhosts: Mapping[str, VirtualHost],
    queues: Iterable[QueueDef],
    refused: Callable[[QueueDef, bool, AMQPError], None],
) -> None:
    """Declare ``queues`` in their order (``refused`` says what a refusal does). The stores of
    new ones open ``OPEN_AT_ONCE`` at a time in worker threads: an open may block (a backend's
    recovery of what a queue of that name left; the log backend creates nothing for a new
    queue), and one after another 10,000 durable queues took minutes."""
    batch: list[_Opening] = []
    for q in queues:
        if q.name == "" or q.name.startswith("amq."):
            continue
        vhost = vhosts[q.vhost]
        if any((q.vhost, q.name) == (b.vhost, b.name) for b, *_ in batch):
            await _open_and_declare(vhosts, batch, refused)  # a name twice: the first first
        existed = q.name in vhost.queues or q.name in vhost.dormant.queues
        try:
            if q.name in vhost.opening:  # a client's declare is opening it: as a client's
                await _open_and_declare(vhosts, batch, refused)
                await open_and_declare_queue(
                    vhost,
                    q.name,
                    passive=False,
                    durable=q.durable,
                    exclusive=False,
                    auto_delete=q.auto_delete,
                    arguments=dict(q.arguments),
                    owner=None,
                )
                continue
            found = check_queue_declare(
                vhost, q.name, False, q.durable, False, q.auto_delete, dict(q.arguments), None
            )
        except AMQPError as exc:
            await _open_and_declare(vhosts, batch, refused)  # the ones before it first
            refused(q, existed, exc)
            continue
        if not isinstance(found, Queue):
            batch.append((q, found, existed))
        if len(batch) >= OPEN_AT_ONCE:
            await _open_and_declare(vhosts, batch, refused)
    await _open_and_declare(vhosts, batch, refused)


async def _open_and_declare(
    vhosts: Mapping[str, VirtualHost],
    batch: list[_Opening],
    refused: Callable[[QueueDef, bool, AMQPError], None],
) -> None:
    """Open the stores of ``batch`` at once, then declare its queues in order (every one
    that opened, before the first refusal that raises is raised); empties ``batch``."""
    failed: dict[int, AMQPError] = {}

    async def open_one(index: int, q: QueueDef, found: tuple[str, str, QueueArguments]) -> None:
        try:
            await open_storage(vhosts[q.vhost], found, durable=q.durable)
        except AMQPError as exc:
            failed[index] = exc

    async with trio.open_nursery() as nursery:
        for index, (q, found, _existed) in enumerate(batch):
            nursery.start_soon(open_one, index, q, found)
    first: DefinitionsError | None = None
    for index, (q, found, existed) in enumerate(batch):
        try:
            if index in failed:
                raise failed[index]
            vhosts[q.vhost].declare_queue(
                found[0],
                passive=False,
                durable=q.durable,
                exclusive=False,
                auto_delete=q.auto_delete,
                arguments=dict(q.arguments),
                owner=None,
                prepared=True,
            )
        except AMQPError as exc:
            try:
                refused(q, existed, exc)
            except DefinitionsError as error:
                first = first or error
    batch.clear()
    if first is not None:
        raise first


def _bind(vhost: VirtualHost, b: BindingDef, skipped: list[str], *, strict: bool) -> None:
    ends: Mapping[str, object] = vhost.queues if b.destination_type == "queue" else vhost.exchanges
    missing = [
        f"{kind} '{name}'"
        for kind, name, table in (
            ("exchange", b.source, vhost.exchanges),
            (b.destination_type, b.destination, ends),
        )
        if name not in table
    ]
    if missing or b.source == "":
        why = f"{' and '.join(missing)} not found" if missing else "the default exchange"
        if strict:
            raise DefinitionsError(f"{_binding_where(b)}: {why}")
        skipped.append(f"{_binding_where(b)}: {why}")
        return
    try:
        if b.destination_type == "queue":
            vhost.bind_queue(b.destination, b.source, b.routing_key, dict(b.arguments), None)
        else:
            vhost.bind_exchange(b.destination, b.source, b.routing_key, dict(b.arguments))
    except AMQPError as exc:
        if strict or exc.code != ReplyCode.RESOURCE_LOCKED:
            raise DefinitionsError(f"{_binding_where(b)}: {exc.reply_text}") from None
        skipped.append(f"{_binding_where(b)}: {exc.reply_text}")  # an exclusive queue


async def load_definitions(broker: Broker, path: Path) -> None:
    """Import the definitions file ``path`` at boot (strictly: a document that contradicts
    what exists is a ``StartupError``, as is a file that cannot be read)."""
    try:
        raw = await trio.to_thread.run_sync(path.read_bytes)
        loaded = json.loads(raw)
        document = parse_document(loaded)
        skipped = await import_document(broker, document, strict=True)
        if broker.limits.load_parameters(loaded.get("parameters"), broker.vhosts):
            broker.definitions.changed()
    except OSError as exc:
        raise StartupError(f"load_definitions: cannot read {path}: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, DefinitionsError
        raise StartupError(f"load_definitions: {path}: {exc}") from None
    log.info(
        "imported %s: %d users, %d exchanges, %d queues, %d bindings (existing ones kept; "
        "%d skipped)",
        path,
        len(document.auth.get("users", [])),
        len(document.exchanges),
        len(document.queues),
        len(document.bindings),
        len(skipped),
    )
