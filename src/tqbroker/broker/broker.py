"""The broker: configuration, plugins, users and virtual hosts, storage, and the nursery of queue
actors and flushers.

Responsibilities:
- load exchange types and storage backends through their entry points; open the backends in the
  data directory and run one flusher (group commit) per durable backend;
- durable definitions: vhosts' durable exchanges, queues and bindings are written to
  ``<data_dir>/definitions.cbor`` atomically (temp file, fsync, rename, directory fsync) before the
  declaring client gets its ``*-ok``, and restored at startup;
- own the nursery in which every queue actor and flusher runs (``run`` follows the Trio start
  protocol); close the backends cleanly when it ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import cbor2
import trio

from ..auth import UserStore
from ..config import BrokerConfig
from ..fsutil import atomic_write
from ..plugins.loader import load_backends, load_exchange_types
from .flusher import Flusher
from .supervisor import Supervisor
from .vhost import VirtualHost

log = logging.getLogger(__name__)

DEFINITIONS_FILE = "definitions.cbor"


class StartupError(RuntimeError):
    """The broker cannot start as configured; the message says why."""


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

    def _spawn(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self.supervisor.spawn(_task_name(fn), fn)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Open storage, restore definitions, host the queue actors and flushers until
        cancelled; then close the backends cleanly."""
        data_dir = self.config.data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        for name, backend in self.backends.items():
            backend.open(data_dir)
            log.debug("opened backend %s", name)
        try:
            async with trio.open_nursery() as nursery:
                for flusher in self.flushers.values():
                    await nursery.start(flusher.run)
                await nursery.start(self.supervisor.run)
                self._restore()
                task_status.started()
                await trio.sleep_forever()
        finally:
            for name, backend in self.backends.items():
                try:
                    backend.close()
                except OSError as exc:
                    log.error("closing backend %s failed: %s", name, exc)

    # -- definitions -------------------------------------------------------------------------

    def _restore(self) -> None:
        stored = self._load_definitions()
        for vhost, definitions in stored.get("definitions", {}).items():
            for queue in definitions.get("queues", []):
                if queue["backend"] not in self.backends:
                    # Recreating it elsewhere would orphan its messages for good.
                    raise StartupError(
                        f"durable queue {queue['name']!r} in vhost {vhost!r} is stored on the "
                        f"{queue['backend']!r} backend, which is not loaded; install or fix it "
                        "(refusing to start rather than lose its messages)"
                    )
            for exchange in definitions.get("exchanges", []):
                # An exchange type that holds messages keeps them in a store of its own.
                backend = exchange.get("store_backend")
                if backend is not None and backend not in self.backends:
                    raise StartupError(
                        f"durable exchange {exchange['name']!r} in vhost {vhost!r} holds its "
                        f"messages on the {backend!r} backend, which is not loaded; install or "
                        "fix it (refusing to start rather than lose its messages)"
                    )
        names = list(self.config.vhosts) + [
            v for v in stored.get("vhosts", []) if v not in self.config.vhosts
        ]
        self._restoring = True
        try:
            for name in names:
                vhost = self.vhosts[name] = self._new_vhost(name)
                vhost.restore(stored.get("definitions", {}).get(name, {}))
        finally:
            self._restoring = False
        self.save_definitions()

    def _load_definitions(self) -> dict[str, Any]:
        path = self.config.data_dir / DEFINITIONS_FILE
        try:
            loaded = cbor2.loads(path.read_bytes())
        except FileNotFoundError:
            return {}
        return loaded if isinstance(loaded, dict) else {}

    def save_definitions(self) -> None:
        """Write the durable definitions of every vhost, atomically and durably."""
        if self._restoring:
            return
        data = cbor2.dumps(
            {
                "vhosts": list(self.vhosts),
                "definitions": {name: v.definitions() for name, v in self.vhosts.items()},
            }
        )
        atomic_write(self.config.data_dir / DEFINITIONS_FILE, data)


def _task_name(fn: Callable[[], Awaitable[Any]]) -> str:
    """What a task is, for the log: its owner (a queue, an exchange's router) and method."""
    owner = getattr(fn, "__self__", None)
    described = getattr(owner, "name", None)
    method = getattr(fn, "__qualname__", repr(fn))
    return f"{method} of {described!r}" if described is not None else method
