"""The broker's supervisor: every long-lived task of the broker runs under it.

A task that raises an unexpected exception is logged with its traceback and its owner is told
(``on_failure``: a queue marks itself failed, an exchange refuses publishes); its siblings keep
running, as RabbitMQ's supervisors restart or stop one queue process without touching the rest.
Cancellation (the broker stopping) passes through untouched.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

import trio

log = logging.getLogger(__name__)

FailureHandler = Callable[[BaseException], None]


class Spawn(Protocol):
    """Starts a supervised task: ``spawn(fn, on_failure=...)``."""

    def __call__(
        self, fn: Callable[[], Awaitable[object]], *, on_failure: FailureHandler | None = None
    ) -> None: ...


class Supervisor:
    """A nursery whose children fail alone (``run`` follows the Trio start protocol)."""

    def __init__(self) -> None:
        self._nursery: trio.Nursery | None = None
        self.failures = 0  # tasks that ended with an unexpected exception

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def spawn(
        self,
        name: str,
        fn: Callable[[], Awaitable[object]],
        *,
        on_failure: FailureHandler | None = None,
    ) -> None:
        """Start ``fn`` as a supervised task; ``name`` says what it is in the log."""
        if self._nursery is None:
            raise RuntimeError("the broker is not running")
        self._nursery.start_soon(self._supervise, name, fn, on_failure, name=name)

    async def _supervise(
        self, name: str, fn: Callable[[], Awaitable[object]], on_failure: FailureHandler | None
    ) -> None:
        try:
            await fn()
        except* Exception as group:
            self.failures += 1
            error = group.exceptions[0] if len(group.exceptions) == 1 else group
            log.error(
                "%s failed; it is stopped, the rest of the broker goes on",
                name,
                exc_info=(type(error), error, error.__traceback__),
            )
            if on_failure is not None:
                try:
                    on_failure(error)
                except Exception:
                    log.exception("%s: handling its failure failed too", name)
