"""The broker: configuration, plugins, users and virtual hosts, storage, and the nursery of queue
actors and flushers.

Responsibilities:
- load exchange types and storage backends through their entry points; take the data
  directory's lock (``dirlock.py``: one broker per directory), then open the backends in it
  and run one flusher (group commit) per durable backend;
- durable definitions: vhosts' durable exchanges, queues and bindings are written by group
  commit (``broker/definitions_file.py``, a flusher of their own) before the declaring client
  gets its ``*-ok``, and restored at startup (``broker/definitions.py``), refusing to start when
  that would lose messages; the stored queues are recovered in a worker thread first;
- the resource alarms (``alarms.py``): the memory and disk monitors run in its nursery; the
  read budget (``read_budget.py``), which every vhost's stream reads share;
- own the nursery in which every queue actor and flusher runs (``run`` follows the Trio start
  protocol); close the backends cleanly when it ends.
"""

from __future__ import annotations

import functools
import inspect
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import trio

from ..backends.base import Backend
from ..backends.memory import MemoryBackend
from ..config import BrokerConfig
from ..dirlock import DataDirLock
from ..plugins.loader import load_backends, load_exchange_types
from ..protocol.connection import BodyBudget
from ..resources import parse_limit
from ..storage_env import StorageEnv
from . import garbage
from .alarms import DiskMonitor, MemoryMonitor, ResourceAlarms
from .definitions import (
    StartupError,
    Unrestorable,
    assign_backends,
    backends_in_use,
    missing_backend,
    open_stored,
    refusal,
    restore,
    unrestorable,
)
from .definitions_api import load_definitions
from .definitions_file import DefinitionsCommit, DefinitionsFile
from .definitions_json import DefinitionsError
from .definitions_snapshot import encode_snapshot
from .flusher import Flusher
from .limits import Limits
from .pacing import Pacer
from .read_budget import ReadBudget, budget_for
from .stats import MessageStats, StatsSampler, StatsTotal
from .streams.groups import GroupCoordination
from .streams.partition import StreamReplication
from .supervisor import FailureHandler, Supervisor
from .users import build_authenticator, grant_default_user, open_user_db
from .vhost import VirtualHost

log = logging.getLogger(__name__)

# Ready messages an in-memory queue keeps in memory under memory pressure before paging out.
PRESSURE_PAGE_WINDOW = 1000


class Broker:
    def __init__(self, config: BrokerConfig, env: StorageEnv | None = None) -> None:
        self.config = config
        # The file system and file-handle cache its storage works through (a test's may record
        # every operation, for a power cut of this broker alone): passed to the backends.
        self.env = StorageEnv.default() if env is None else env
        self.exchange_types = load_exchange_types()
        self.backends = load_backends(config.backend_options)
        for required in ("memory", config.durable_backend, *config.backend_options):
            if required not in self.backends:
                raise StartupError(
                    f"the {required!r} storage backend could not be loaded (loaded: "
                    f"{', '.join(sorted(self.backends))}; the log says why)"
                )
        self.flushers = {
            name: Flusher(backend) for name, backend in self.backends.items() if backend.durable
        }
        # The internal user database and the logins through the auth backend chain (users.py).
        self.users, self._first_user_start = open_user_db(config, self.env)
        self.authenticator = build_authenticator(config, self.users)
        self.vhosts: dict[str, VirtualHost] = {}
        # The vhost and user limits and the connections they count (limits.py); each vhost's
        # description and tags (set over the management API), persisted with the definitions.
        self.limits = Limits(self.users.limits)
        self.vhost_metadata: dict[str, dict[str, Any]] = {}
        self.supervisor = Supervisor()
        self.definitions_file = DefinitionsFile(
            config.data_dir,
            lambda: encode_snapshot(self.vhosts, self.vhost_metadata, self.limits.parameters()),
            self.env,
        )
        self.definitions_flusher = Flusher(self.definitions_file)
        self.definitions = DefinitionsCommit(
            self.definitions_file, self.definitions_flusher, self._spawn
        )
        self._restored = False
        # A cluster's replica roles (``tqbroker.cluster``), set before ``run``: every stream
        # partition is gated by them (None: one node, partitions are their own).
        self.replication: StreamReplication | None = None
        # A cluster's assignment of consumer groups across its nodes, set before ``run``
        # (None: each vhost assigns its groups' partitions among its own members).
        self.group_coordination: GroupCoordination | None = None
        # This node's name, as RabbitMQ's health checks and management API give it.
        self.node_name = f"tqbroker@{socket.gethostname()}"
        self.alarms = ResourceAlarms()
        # The node's message counters and rates, and the sampler of every object's rates.
        # The broker's counters are its vhosts' (``StatsTotal``); the sampler walks the vhosts,
        # queues and exchanges (``_all_stats``), and connections and channels register.
        self.stats_sampler = StatsSampler()
        self.stats = StatsTotal()
        self.stats_sampler.add_source(self._all_stats)
        # Seconds the start took to open the stores and restore the definitions (metrics).
        self.recovery_seconds: float | None = None
        self.memory_monitor = MemoryMonitor(
            self.alarms,
            parse_limit(config.memory_high_watermark, "memory_high_watermark"),
            on_pressure=self._memory_pressure,
        )
        # Message bodies begun and not finished, across connections: at most a tenth of the
        # memory high watermark (but room for one message of the largest size).
        self.incomplete_bodies = BodyBudget(
            max(self.memory_monitor.limit // 10, config.max_message_size), "the broker"
        )
        # Bytes held by read responses (HTTP record and frame reads; the Kafka Fetch): a tenth
        # of the memory high watermark, so that reads never set the alarm that blocks
        # publishers; new reads wait while it is set (``read_budget.py``).
        self.read_budget = ReadBudget(budget_for(self.memory_monitor.limit), self.alarms)
        self.disk_monitor = DiskMonitor(
            self.alarms, config.data_dir, parse_limit(config.disk_free_limit, "disk_free_limit")
        )

    def _new_vhost(self, name: str) -> VirtualHost:
        vhost = VirtualHost(
            name,
            exchange_types=self.exchange_types,
            backends=self.backends,
            flushers=self.flushers,
            durable_backend=self.config.durable_backend,
            spawn=self._spawn,
            definitions=self.definitions,
            read_budget=self.read_budget,
        )
        vhost.queue_limit = functools.partial(self.limits.max_queues, name)
        vhost.replication = self.replication
        vhost.consumer_groups.coordination = self.group_coordination
        self.stats.add(vhost.stats)
        return vhost

    def _all_stats(self) -> Iterator[MessageStats]:
        """The node's, every vhost's, queue's and exchange's counters (for the sampler)."""
        yield self.stats
        for vhost in list(self.vhosts.values()):
            yield vhost.stats
            for queue in list(vhost.queues.values()):
                yield queue.stats
            for exchange in list(vhost.exchanges.values()):
                yield exchange.stats

    def add_vhost(self, name: str) -> VirtualHost:
        """The vhost ``name``, created (durably: it is in the definitions) if missing."""
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = self._new_vhost(name)
            self.definitions.changed()
        return vhost

    async def delete_vhost(self, name: str) -> bool:
        """Delete the vhost ``name`` (False if there is none): its queues and their stored
        messages, its exchanges and bindings, its limits and every permission on it. Its
        connections are the caller's to close. Returns once the deletion is durable."""
        vhost = self.vhosts.pop(name, None)
        if vhost is None:
            return False
        since = self.definitions.mark()
        # Its connections are closing: a declare meanwhile is refused (a limit of 0 queues).
        vhost.queue_limit = lambda: 0
        pacer = Pacer()
        for queue in list(vhost.queues.values()):  # with their stored messages
            vhost.queue_unused(queue)
            await pacer.step()
        for entry in vhost.dormant.definitions()["queues"]:
            vhost.delete_queue(entry["name"], if_unused=False, if_empty=False, owner=None)
        self.stats.remove(vhost.stats)
        self.vhost_metadata.pop(name, None)
        self.limits.clear_vhost(name)
        self.definitions.changed()
        self.users.delete_vhost(name)
        await self.users.save(self.config.data_dir)
        await self.definitions.wait(since)
        log.info("deleted vhost '%s'", name)
        return True

    def _spawn(
        self, fn: Callable[[], Awaitable[object]], *, on_failure: FailureHandler | None = None
    ) -> None:
        self.supervisor.spawn(_task_name(fn), fn, on_failure=on_failure)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the data directory's lock (``DataDirInUse``: another broker has it), open
        storage, restore definitions, host the queue actors and flushers until cancelled; then
        close the backends cleanly and release the lock."""
        await trio.to_thread.run_sync(self.env.make_dirs, self.config.data_dir)  # fsyncs: not here
        # Before any store opens or anything is written (the constructor only read the users
        # file): a refused start changes nothing there.
        lock = DataDirLock(self.config.data_dir)
        try:
            await self._run(task_status)
        finally:
            lock.release()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        data_dir = self.config.data_dir
        # A full disk sets the alarm (publishers blocked) rather than stopping the start.
        await self.disk_monitor.check()
        # Checked before any backend opens: a refused start leaves the data directory as it is.
        try:
            stored = self.definitions_file.load()
        except DefinitionsError as exc:
            raise StartupError(str(exc)) from None
        assign_backends(stored, self.backends, self.config.durable_backend)
        dormant = self._check_definitions(stored)
        await trio.to_thread.run_sync(self._open_backends, stored)  # they create and fsync
        try:
            async with trio.open_nursery() as nursery:
                for flusher in [*self.flushers.values(), self.definitions_flusher]:
                    await nursery.start(flusher.run)
                await nursery.start(self.supervisor.run)
                self._spawn(self.memory_monitor.run)
                self._spawn(self.disk_monitor.run)
                if garbage.taken_over():  # the process is ours (``python -m tqbroker``)
                    full = garbage.FullCollections(lambda: self.memory_monitor.pressed)
                    self._spawn(full.run)
                self._spawn(self.stats_sampler.run)
                recovery_started = time.monotonic()
                # Recovery (scanning segments, cutting a torn tail) in a worker thread: the
                # restore below then finds every store open.
                await trio.to_thread.run_sync(
                    open_stored, stored, dormant, self.backends, self.config.durable_backend
                )
                self._restore(stored, dormant)
                self._restored = True
                if self._first_user_start:
                    grant_default_user(self.users, self.config, list(self.vhosts))
                try:
                    await self.users.save(data_dir)  # the configured users, stored
                except OSError as exc:  # a full disk: they are applied again at every start
                    log.error("cannot store the users at startup: %s", exc)
                self.recovery_seconds = time.monotonic() - recovery_started
                if self.config.load_definitions is not None:
                    await load_definitions(self, self.config.load_definitions)
                try:
                    await trio.to_thread.run_sync(self.definitions_file.write_work())
                except OSError as exc:  # e.g. a full disk: what is stored stays as it was
                    log.error("cannot rewrite the definitions at startup: %s", exc)
                task_status.started()
                await trio.sleep_forever()
        finally:
            # At shutdown, in worker threads: close the backends (their deletes durable),
            # then write the definitions (unless the start failed before they were restored).
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close_backends)
                if self._restored:
                    try:
                        await trio.to_thread.run_sync(self.definitions_file.write_work())
                    except OSError as exc:
                        log.error("writing the definitions at shutdown failed: %s", exc)

    def _memory_pressure(self, pressed: bool) -> None:
        """Memory is short (or no longer): in-memory queues keep fewer ready messages in memory
        before paging out (RabbitMQ pages out under memory pressure too)."""
        backend = self.backends.get("memory")
        if isinstance(backend, MemoryBackend):
            backend.set_window(PRESSURE_PAGE_WINDOW if pressed else backend.page_window)
            log.info(
                "memory %s: queues keep %d messages in memory before paging out",
                "pressure" if pressed else "pressure over",
                backend.paging.window,
            )

    def _open_backends(self, stored: dict[str, Any]) -> None:
        """Open every loaded backend in the data directory. One that cannot open (a full disk, a
        broken installation) and that nothing needs is left out, logged: the broker starts
        without it. One that the durable queues or the configuration need stops the start."""
        needed = {"memory", self.config.durable_backend, *backends_in_use(stored)}
        for name, backend in list(self.backends.items()):
            try:
                _open_backend(backend, self.config.data_dir, self.env)
            except Exception as exc:
                if name in needed:
                    raise StartupError(f"the {name!r} storage backend cannot open: {exc}") from exc
                log.error(
                    "the %r storage backend cannot open, so it is left out until a restart "
                    "(no stored queue uses it): %s",
                    name,
                    exc,
                    exc_info=not isinstance(exc, OSError),
                )
                del self.backends[name]
                self.flushers.pop(name, None)
                continue
            log.debug("opened backend %s", name)

    def _close_backends(self) -> None:
        for name, backend in self.backends.items():
            try:
                backend.close()
            except OSError as exc:
                log.error("closing backend %s failed: %s", name, exc)

    # -- definitions -------------------------------------------------------------------------

    def _check_definitions(self, stored: dict[str, Any]) -> list[Unrestorable]:
        """What of the stored definitions must stay dormant; ``StartupError`` when restoring
        them would lose messages or topology (unless ``keep_unloadable_definitions``)."""
        problem = missing_backend(stored, self.backends)
        if problem is not None:
            raise StartupError(problem)
        found = unrestorable(stored, self.exchange_types)
        for item in found:
            log.error("%s", item)
        if found and not self.config.keep_unloadable_definitions:
            raise StartupError(refusal(found[0], len(found) - 1))
        return found

    def _restore(self, stored: dict[str, Any], dormant: list[Unrestorable]) -> None:
        names = list(self.config.vhosts) + [
            v for v in stored.get("vhosts", []) if v not in self.config.vhosts
        ]
        self.definitions.restoring = True
        self.vhost_metadata.update(stored.get("vhost_metadata", {}))
        self.limits.load_parameters(stored.get("parameters", []), names)
        try:
            for name in names:
                vhost = self.vhosts[name] = self._new_vhost(name)
                restore(
                    vhost,
                    stored.get("definitions", {}).get(name, {}),
                    dormant=[d for d in dormant if d.vhost == name],
                    keep_unloadable=self.config.keep_unloadable_definitions,
                )
        finally:
            self.definitions.restoring = False


def _task_name(fn: Callable[[], Awaitable[object]]) -> str:
    """What a task is, for the log: its owner (a queue, an exchange's router) and method."""
    owner = getattr(fn, "__self__", None)
    described = getattr(owner, "name", None)
    method = getattr(fn, "__qualname__", repr(fn))
    return f"{method} of {described!r}" if described is not None else method


def _open_backend(backend: Backend, data_dir: Path, env: StorageEnv) -> None:
    """Open ``backend`` in the broker's environment; one whose ``open`` takes no ``env`` (as
    ``Backend.open`` allows) on the real file system."""
    open_backend: Callable[..., None] = backend.open
    if "env" in inspect.signature(open_backend).parameters:
        open_backend(data_dir, env=env)
    else:
        open_backend(data_dir)
