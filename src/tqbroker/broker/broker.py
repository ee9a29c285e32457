"""The broker: configuration, plugins, users and virtual hosts, storage, and the nursery of queue
actors and flushers.

Responsibilities:
- load exchange types and storage backends through their entry points; open the backends in the
  data directory and run one flusher (group commit) per durable backend;
- durable definitions: vhosts' durable exchanges, queues and bindings are written
  (``broker/definitions.py``) before the declaring client gets its ``*-ok``, and restored at
  startup, refusing to start when that would lose messages;
- own the nursery in which every queue actor and flusher runs (``run`` follows the Trio start
  protocol); close the backends cleanly when it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..auth import UserStore
from ..config import BrokerConfig
from ..plugins.loader import load_backends, load_exchange_types
from .definitions import (
    StartupError,
    Unrestorable,
    load_definitions,
    missing_backend,
    refusal,
    restore,
    save_definitions,
    unrestorable,
)
from .flusher import Flusher
from .supervisor import FailureHandler, Supervisor
from .vhost import VirtualHost

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
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
        self.users = UserStore()
        for user in config.users:
            self.users.add(
                user.name, user.password, loopback_only=user.loopback_only, vhosts=user.vhosts
            )
        self.vhosts: dict[str, VirtualHost] = {}
        self.supervisor = Supervisor()
        self._restoring = False

    def _new_vhost(self, name: str) -> VirtualHost:
        return VirtualHost(
            name,
            exchange_types=self.exchange_types,
            backends=self.backends,
            flushers=self.flushers,
            durable_backend=self.config.durable_backend,
            spawn=self._spawn,
            on_change=self.save_definitions,
        )

    def _spawn(
        self, fn: Callable[[], Awaitable[object]], *, on_failure: FailureHandler | None = None
    ) -> None:
        self.supervisor.spawn(_task_name(fn), fn, on_failure=on_failure)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open storage, restore definitions, host the queue actors and flushers until
        cancelled; then close the backends cleanly."""
        data_dir = self.config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        # Checked before any backend opens: a refused start leaves the data directory as it is.
        stored = load_definitions(data_dir)
        dormant = self._check_definitions(stored)
        for name, backend in self.backends.items():
            backend.open(data_dir)
            log.debug("opened backend %s", name)
        try:
            async with trio.open_nursery() as nursery:
                for flusher in self.flushers.values():
                    await nursery.start(flusher.run)
                await nursery.start(self.supervisor.run)
                self._restore(stored, dormant)
                task_status.started()
                await trio.sleep_forever()
        finally:
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
        self._restoring = True
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
            self._restoring = False
        self.save_definitions()

    def save_definitions(self) -> None:
        """Write the durable definitions of every vhost (not while restoring them)."""
        if self._restoring:
            return
        save_definitions(self.config.data_dir, self.vhosts)


def _task_name(fn: Callable[[], Awaitable[object]]) -> str:
    """What a task is, for the log: its owner (a queue, an exchange's router) and method."""
    owner = getattr(fn, "__self__", None)
    described = getattr(owner, "name", None)
    method = getattr(fn, "__qualname__", repr(fn))
    return f"{method} of {described!r}" if described is not None else method
