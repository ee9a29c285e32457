"""A node's ISR writes: its leaders' in-sync replica changes, committed to etcd before any of
them is used (``leader.IsrWriter``), batched into one transaction per round (``cluster.md``
A13: one flapping follower must not cost a write per partition, nor many partitions many
writes).

Each change is a compare-and-swap on the partition key's mod revision as the node's view has
it, and is taken only while the record still names this node, in its current incarnation, as
the leader at the leader's epoch: a leader the controller replaced (a new epoch, or this node
registered again) is fenced, and steps down. A refused transaction is decided again once the
view has caught up with the store (a write by the controller came between).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Final

import attrs
import trio

from .leader import LeaderReplica
from .metadata import Compare, MetadataError, MetadataStore, Put
from .records import parse_partition_path, partition_key
from .view import ClusterView

log = logging.getLogger(__name__)

BATCH: Final = 100
RETRY_SECONDS: Final = 0.5


@attrs.define(eq=False)
class _Request:
    leader: LeaderReplica
    isr: dict[str, str]
    done: trio.Event = attrs.field(factory=trio.Event)
    result: bool = False


class IsrWrites:
    """The ``IsrWriter`` of one node's leaders (see the module doc); ``run`` writes."""

    def __init__(
        self, store: MetadataStore, view: ClusterView, incarnation: Callable[[], int]
    ) -> None:
        self.store = store
        self.view = view
        self._incarnation = incarnation
        self._pending: list[_Request] = []
        self._wakeup = trio.Event()
        self.transactions = 0  # for tests and metrics

    async def write_isr(self, leader: LeaderReplica, isr: Mapping[str, str]) -> bool:
        request = _Request(leader, dict(isr))
        self._pending.append(request)
        self._wakeup.set()
        await request.done.wait()
        return request.result

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            await trio.lowlevel.checkpoint()  # let the other leaders of this round ask too
            while self._pending:
                batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
                try:
                    retry = await self._write(batch)
                except MetadataError as exc:
                    log.warning("ISR write: %s; again in %.1f s", exc, RETRY_SECONDS)
                    retry = batch
                    await trio.sleep(RETRY_SECONDS)
                self._pending[:0] = retry

    async def _write(self, batch: list[_Request]) -> list[_Request]:
        """Write what the view still allows; answer those it does not; the ones to retry."""
        incarnation = self._incarnation()
        compares: list[Compare] = []
        puts: list[Put] = []
        taken: list[_Request] = []
        for request in batch:
            leader = request.leader
            vhost, queue = parse_partition_path(leader.key)
            found = self.view.partitions.get((vhost, queue))
            record = found[0] if found is not None else None
            if (
                found is None
                or record is None
                or record.leader != leader.node_id
                or record.epoch != leader.epoch
                or record.leader_incarnation != incarnation
                or leader.resigned is not None
            ):
                self._answer(request, False)
                continue
            key = partition_key(self.view.prefix, vhost, queue)
            compares.append(Compare.mod_revision(key, found[1]))
            puts.append(Put(key, attrs.evolve(record, isr=request.isr).encode()))
            taken.append(request)
        if not taken:
            return []
        result = await self.store.txn(compares, puts)
        self.transactions += 1
        await self.view.wait_for(result.revision)
        if not result.succeeded:
            return taken  # the view now has what came between: decide again
        for request in taken:
            self._answer(request, True)
        return []

    @staticmethod
    def _answer(request: _Request, result: bool) -> None:
        request.result = result
        request.done.set()
