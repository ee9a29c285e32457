"""The broker: configuration, plugins, users and virtual hosts, and the nursery of queue actors.

Responsibilities:
- load exchange types and storage backends through their entry points;
- hold the users and the virtual hosts;
- own the nursery in which every queue actor runs (``run`` follows the Trio start protocol).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..auth import UserStore
from ..config import BrokerConfig
from ..plugins.loader import load_backends, load_exchange_types
from .vhost import VirtualHost


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.exchange_types = load_exchange_types()
        self.backends = load_backends()
        if "memory" not in self.backends:
            raise RuntimeError("the 'memory' backend is not installed: is tqbroker installed?")
        self.users = UserStore()
        for user in config.users:
            self.users.add(
                user.name, user.password, loopback_only=user.loopback_only, vhosts=user.vhosts
            )
        self.vhosts = {
            name: VirtualHost(
                name,
                exchange_types=self.exchange_types,
                backend=self.backends["memory"],
                spawn=self._spawn,
            )
            for name in config.vhosts
        }
        self._nursery: trio.Nursery | None = None

    def _spawn(self, fn: Callable[[], Awaitable[Any]]) -> None:
        if self._nursery is None:
            raise RuntimeError("the broker is not running")
        self._nursery.start_soon(fn)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the queue actors until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()
