"""``definitions.json``: the durable topology (vhosts, durable exchanges, queues, bindings) as
RabbitMQ's definitions JSON (``broker/definitions_json.py``), written by group commit, and what a
client's ``*-ok`` waits for.

Responsibilities:
- ``DefinitionsFile``: a change marks the file dirty; the flusher that drives it
  (``broker/flusher.py``, as for a storage backend) writes one snapshot of the whole topology in
  a worker thread (temporary file, fsync, rename, directory fsync), covering every change made
  meanwhile; ``load`` reads it (or the ``definitions.cbor`` of earlier releases, which the first
  write then replaces: removed once the JSON is durable);
- ``DefinitionsCommit``: what the vhosts call on a durable change (``changed``), or once a
  backend's flush has made a store's delete durable (``changed_after``: the definitions never
  lose a queue before its directory is gone for good); ``wait``: the client that declared, bound
  or deleted gets its ``*-ok`` once a write that began after its change has completed (541 if
  it failed).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import cbor2
import trio

from ..protocol.errors import AMQPError, ReplyCode
from ..storage_env import StorageEnv
from .definitions_json import DefinitionsError, parse_document, to_stored
from .flusher import Flusher
from .limits import vhost_settings
from .supervisor import Spawn

log = logging.getLogger(__name__)

DEFINITIONS_FILE = "definitions.json"
LEGACY_FILE = "definitions.cbor"  # what 0.1.0 wrote (CBOR): migrated at the first start


class DefinitionsFile:
    """The definitions file, as a ``Flushable`` (``snapshot`` encodes the topology now)."""

    name = "definitions"

    def __init__(
        self, data_dir: Path, snapshot: Callable[[], bytes], env: StorageEnv | None = None
    ) -> None:
        self.env = StorageEnv.default() if env is None else env  # where it writes
        self.path = data_dir / DEFINITIONS_FILE
        self.legacy_path = data_dir / LEGACY_FILE
        self._snapshot = snapshot
        self._dirty = False
        self._healthy = True

    def load(self) -> dict[str, Any]:
        """What the file holds, in the stored form ``definitions.restore`` reads (empty when
        there is none yet). Reads only; ``DefinitionsError`` for a file that cannot be read."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._load_legacy()
        try:
            document = json.loads(raw)
            return {**to_stored(parse_document(document)), **vhost_settings(document)}
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, DefinitionsError
            raise DefinitionsError(f"the definitions file {self.path}: {exc}") from None

    def _load_legacy(self) -> dict[str, Any]:
        try:
            loaded = cbor2.loads(self.legacy_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (ValueError, cbor2.CBORDecodeError) as exc:
            raise DefinitionsError(
                f"the definitions file {self.legacy_path} cannot be read: {exc}"
            ) from None
        log.info("migrating %s to %s", self.legacy_path, self.path)
        return loaded if isinstance(loaded, dict) else {}

    def changed(self) -> None:
        """The topology changed: the next flush writes it."""
        self._dirty = True

    @property
    def needs_flush(self) -> bool:
        return self._dirty

    @property
    def healthy(self) -> bool:
        return self._healthy

    def begin_flush(self) -> Callable[[], None] | None:
        if not self._dirty:
            return None
        data = self._snapshot()
        self._dirty = False

        def work() -> None:
            try:
                self._write(data)
            except OSError:
                self._healthy = False
                self._dirty = True  # the next flush tries again, with the latest snapshot
                raise
            self._healthy = True

        return work

    def write_work(self) -> Callable[[], None]:
        """The work of writing the topology as it is now, whatever is dirty (start-up and
        shutdown): run it in a worker thread."""
        data = self._snapshot()
        self._dirty = False
        return functools.partial(self._write, data)

    def _write(self, data: bytes) -> None:
        self.env.atomic_write(self.path, data)
        # The JSON is durable: an earlier release's CBOR file can go.
        if self.legacy_path.exists():
            self.env.fs.unlink(self.legacy_path, missing_ok=True)
            self.env.fsync_dir(self.legacy_path.parent)
            log.info("migrated the definitions to %s; %s removed", self.path, self.legacy_path)


class TopologyChanges(Protocol):
    """What a vhost tells about changes to durable topology, and what its clients wait for
    (``DefinitionsCommit``)."""

    def changed(self) -> None: ...

    def changed_after(self, flusher: Flusher | None, *, definitions: bool) -> None: ...

    def mark(self) -> int: ...

    async def wait(self, since: int) -> None: ...


class Unwritten:
    """``TopologyChanges`` that writes nothing (a vhost without a data directory, in tests)."""

    def changed(self) -> None:
        pass

    def changed_after(self, flusher: Flusher | None, *, definitions: bool) -> None:
        pass

    def mark(self) -> int:
        return 0

    async def wait(self, since: int) -> None:
        pass


@attrs.define
class _Deferred:
    """A change waiting for a backend's flush."""

    done: trio.Event = attrs.field(factory=trio.Event)
    ok: bool = True


def not_stored() -> AMQPError:
    return AMQPError(
        ReplyCode.INTERNAL_ERROR,
        "the definitions could not be stored (the broker's log says why)",
        hard=False,
    )


class DefinitionsCommit:
    """The broker's ``TopologyChanges``, and what clients wait on (``mark`` then ``wait``)."""

    def __init__(self, file: DefinitionsFile, flusher: Flusher, spawn: Spawn) -> None:
        self.file = file
        self.flusher = flusher
        self._spawn = spawn
        self._next = 0
        self._deferred: dict[int, _Deferred] = {}
        self.restoring = False  # while definitions are restored at startup: nothing to write
        self.generation = 0  # counts the changes (a cluster's catalog follows them)
        self._changes = trio.Event()

    def changed(self) -> None:
        if self.restoring:
            return
        self.file.changed()
        self.flusher.request()  # a write in flight does not cover this change
        self.generation += 1
        self._changes.set()
        self._changes = trio.Event()

    async def wait_change(self, since: int) -> None:
        """Until ``generation`` has moved past ``since``."""
        while self.generation == since:
            await self._changes.wait()

    def changed_after(self, flusher: Flusher | None, *, definitions: bool) -> None:
        """A store was deleted on a backend: once the backend's next flush has made that
        durable, the definitions change too (with ``definitions``). A client that ``wait``s
        waits for both."""
        if flusher is None:  # a backend that keeps nothing
            if definitions:
                self.changed()
            return
        key, self._next = self._next, self._next + 1
        deferred = self._deferred[key] = _Deferred()
        ticket = flusher.request()
        try:
            self._spawn(
                functools.partial(self._after_flush, key, deferred, flusher, ticket, definitions)
            )
        except RuntimeError:  # shutting down: closing the backends makes the delete durable
            del self._deferred[key]
            if definitions:
                self.changed()

    async def _after_flush(
        self, key: int, deferred: _Deferred, flusher: Flusher, ticket: int, definitions: bool
    ) -> None:
        try:
            while not await flusher.wait(ticket):
                # The waiting client hears of it now; the change waits for a flush that works.
                deferred.ok = False
                deferred.done.set()
                ticket = flusher.request()
            if definitions:
                self.changed()
        finally:
            del self._deferred[key]
            deferred.done.set()

    def mark(self) -> int:
        """Where the changes of an operation about to run begin (for ``wait``)."""
        return self._next

    async def wait(self, since: int) -> None:
        """Return once every durable change made since ``since`` is written: each deferred
        change's backend flush, then a definitions write that began afterwards (at once when
        nothing is dirty or being written). Raises 541 if a write failed."""
        for key, deferred in list(self._deferred.items()):
            if key >= since:
                await deferred.done.wait()
                if not deferred.ok:
                    raise not_stored()
        flusher = self.flusher
        pending = self.file.needs_flush or flusher.requested > flusher.completed
        if pending and not await flusher.wait(flusher.request()):
            raise not_stored()
