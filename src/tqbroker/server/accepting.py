"""The accept loop of every listener (AMQP, amqps, HTTP, metrics): ``serve_listeners``.

Trio's own loop, with what an exhausted process says told once in a while: when accept(2)
fails for want of descriptors or memory (``EMFILE``, ``ENFILE``, ``ENOMEM``, ``ENOBUFS``), the
listener retries every ``RETRY_S`` and logs one warning line (no traceback: the condition is
expected, the stack says nothing) every ``WARN_EVERY_S`` per listener, with how many failures
it left out. Any other error ends the loop, as in Trio.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NoReturn

import trio

log = logging.getLogger(__name__)

CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
RETRY_S: Final = 0.1
WARN_EVERY_S: Final = 10.0

Handler = Callable[[Any], Awaitable[object]]


class AcceptFailures:
    """One listener's failed accepts: ``failed`` logs the first, then one line per
    ``WARN_EVERY_S`` that counts the ones in between."""

    def __init__(self, where: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.where, self._clock = where, clock
        self._warned_at = -math.inf
        self.left_out = 0  # failures since the last line

    def failed(self, code: int) -> None:
        now = self._clock()
        if now - self._warned_at < WARN_EVERY_S:
            self.left_out += 1
            return
        self._warned_at = now
        log.warning(
            "cannot accept connections on %s: %s (%s); retrying every %g s, %d more such "
            "failures since the last line",
            self.where,
            errno.errorcode.get(code, str(code)),
            os.strerror(code),
            RETRY_S,
            self.left_out,
        )
        self.left_out = 0


async def serve_listeners(
    handler: Handler,
    listeners: Sequence[trio.abc.Listener[Any]],
    *,
    handler_nursery: trio.Nursery,
    name: str,
) -> NoReturn:
    """Accept on every listener until cancelled; each stream is ``handler(stream)`` in
    ``handler_nursery``, closed when it returns. ``name`` is the listeners' kind in the log."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_serve_one, handler, listener, handler_nursery, name)
    raise AssertionError("unreachable: the accept loops never return")


async def _serve_one(
    handler: Handler, listener: trio.abc.Listener[Any], handler_nursery: trio.Nursery, name: str
) -> None:
    failures = AcceptFailures(f"{name} {_where(listener)}")
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in CAPACITY_ERRNOS:
                    raise
                failures.failed(exc.errno)
                await trio.sleep(RETRY_S)
            else:
                handler_nursery.start_soon(_run_handler, handler, stream)


async def _run_handler(handler: Handler, stream: trio.abc.AsyncResource) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


def _where(listener: trio.abc.Listener[Any]) -> str:
    while isinstance(listener, trio.SSLListener):
        listener = listener.transport_listener
    if isinstance(listener, trio.SocketListener):
        sockname = listener.socket.getsockname()
        return f"{sockname[0]}:{sockname[1]}"
    return repr(listener)
