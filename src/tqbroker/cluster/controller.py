"""The cluster's controller: one node, elected through a lease-bound key, that places new
streams' replicas and moves leadership off nodes that are gone (§4.3 of
``shared/reference/scaleout.md``; the decisions are ``placement.py``'s).

Responsibilities:
- the campaign: every registered node tries to create ``controller`` bound to its lease (a
  transaction that succeeds only if the key is absent); the winner's key's **create
  revision** is its fencing token: every write it makes compares it, so a controller that lost
  its lease (and another won) cannot write any more, whatever it believes;
- it is stateless: it decides from the cluster view (``view.py``) alone, after every change it
  sees (debounced): a stream queue's definition without a partition record gets one (placed,
  led by its first replica at epoch 1, the leader its only in-sync member until its followers
  catch up); a partition whose queue definition is gone is deleted; a partition whose leader is
  gone gets a clean election (epoch + 1) or goes offline;
- every ``leader_rebalance_interval`` (300 s, Kafka's ``leader.imbalance.check.interval``), it
  gives leadership back to each partition's preferred replica where that one is eligible again
  (Kafka's automatic preferred leader election): a node back from a restart leads its share;
  and at once when a node asks for it (``requests/preferred-election``, which it deletes);
- it assigns consumer groups' partitions among their members on every node
  (``groups.assignment_changes``);
- its writes are compare-and-swaps on each partition key's mod revision, batched into
  transactions of at most ``BATCH`` partitions (etcd refuses more than 128 operations); a
  refused batch is decided again from the view once it has caught up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

import attrs
import trio

from .groups import assignment_changes
from .membership import Membership
from .metadata import (
    Compare,
    Delete,
    Get,
    MetadataError,
    MetadataStore,
    Operation,
    Put,
    RangeResult,
)
from .placement import SPREAD, Policy, elect, place, prefer_leader
from .records import (
    ControllerRecord,
    PartitionRecord,
    controller_key,
    partition_key,
    preferred_election_key,
)
from .view import ClusterView

log = logging.getLogger(__name__)

BATCH: Final = 100  # partitions per transaction (each a compare and an operation)
DEBOUNCE_SECONDS: Final = 0.05
RETRY_SECONDS: Final = 0.5


@attrs.frozen
class Change:
    """One partition write: the compare on its key and the operation."""

    compare: Compare
    operation: Operation


class Controller:
    """The controller's campaign and its work while elected (see the module doc)."""

    def __init__(
        self,
        store: MetadataStore,
        view: ClusterView,
        membership: Membership,
        *,
        policy: Policy = SPREAD,
        leader_rebalance_interval: float = 300.0,
    ) -> None:
        self.store = store
        self.view = view
        self.membership = membership
        self.policy: Policy = policy
        self.leader_rebalance_interval = leader_rebalance_interval  # 0: never
        self.token = 0  # the controller key's create revision while this node controls
        self.writes = 0  # partition records written (for tests and metrics)

    @property
    def prefix(self) -> str:
        return self.view.prefix

    @property
    def active(self) -> bool:
        return self.token != 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            incarnation = self.membership.incarnation
            if not incarnation:
                await self.membership.registered.wait()
                await trio.sleep(RETRY_SECONDS / 5)
                continue
            try:
                token = await self._campaign(incarnation)
            except MetadataError as exc:
                log.warning("controller campaign: %s", exc)
                await trio.sleep(RETRY_SECONDS)
                continue
            if not token:
                await self._wait_for_vacancy(incarnation)
                continue
            self.token = token
            log.info("node %s is the controller (token %d)", self.membership.node_id, token)
            try:
                await self._serve(incarnation, token)
            finally:
                self.token = 0
                log.info("node %s is no longer the controller", self.membership.node_id)

    async def _campaign(self, incarnation: int) -> int:
        """Try to become the controller: the token if this node is (now or already), else 0."""
        key = controller_key(self.prefix)
        record = ControllerRecord(self.membership.node_id, incarnation)
        result = await self.store.txn(
            [Compare.absent(key)],
            [Put(key, record.encode(), lease=incarnation), Get(key)],
            [Get(key)],
        )
        found = result.responses[-1]
        if not isinstance(found, RangeResult) or not found.kvs:
            return 0
        kv = found.kvs[0]
        if result.succeeded or kv.lease == incarnation:
            return kv.create_revision
        return 0

    async def _wait_for_vacancy(self, incarnation: int) -> None:
        """Until the controller key is gone (or this node's registration changed)."""
        while self.view.controller is not None and self.membership.incarnation == incarnation:
            with trio.move_on_after(RETRY_SECONDS * 4):
                await self.view.wait_changed()

    def _fenced(self, incarnation: int, token: int) -> bool:
        return self.membership.incarnation != incarnation or (
            self.view.revision >= token and self.view.controller_revision != token
        )

    async def _serve(self, incarnation: int, token: int) -> None:
        await self.view.wait_for(token)
        interval = self.leader_rebalance_interval
        rebalance_at = trio.current_time() + interval
        while not self._fenced(incarnation, token):
            changes = self.decide()
            if not changes and self.view.preferred_election:  # asked for: now, and once
                request = preferred_election_key(self.prefix)
                done = Change(
                    Compare.mod_revision(request, self.view.preferred_election), Delete(request)
                )
                changes = [*self.preferred_leaders(), done]
            elif not changes and interval and trio.current_time() >= rebalance_at:
                changes = self.preferred_leaders()
                rebalance_at = trio.current_time() + interval
            if changes:
                try:
                    await self._write(token, changes)
                except MetadataError as exc:
                    log.warning("controller: %s", exc)
                    await trio.sleep(RETRY_SECONDS)
                continue
            wait = RETRY_SECONDS * 4
            if interval:
                wait = max(0.0, min(wait, rebalance_at - trio.current_time()))
            with trio.move_on_after(wait):
                await self.view.wait_changed()
            await trio.sleep(DEBOUNCE_SECONDS)

    # -- the decisions -------------------------------------------------------------------------

    def decide(self) -> list[Change]:
        """What the view calls for now (see the module doc)."""
        view, prefix = self.view, self.prefix
        live = view.live
        changes: list[Change] = []
        records = [record for record, _mod in view.partitions.values()]
        for (vhost, queue), stream in sorted(view.streams.items()):
            if (vhost, queue) in view.partitions or not live:
                continue
            count = stream.replicas or min(3, len(live))
            replicas = place(
                count,
                sorted(live),
                records,
                policy=self.policy,
                leader_node=self.membership.node_id,
            )
            leader = replicas[0]
            record = PartitionRecord(
                replicas=replicas,
                leader=leader,
                epoch=1,
                isr={leader: ""},  # the leader writes its replica id when it begins
                min_isr=min(stream.min_isr or min(2, len(replicas)), len(replicas)),
                leader_incarnation=live[leader],
            )
            records.append(record)
            key = partition_key(prefix, vhost, queue)
            changes.append(Change(Compare.absent(key), Put(key, record.encode())))
        for (vhost, queue), (record, mod) in sorted(view.partitions.items()):
            key = partition_key(prefix, vhost, queue)
            if (vhost, queue) not in view.streams:
                changes.append(Change(Compare.mod_revision(key, mod), Delete(key)))
                continue
            elected = elect(record, live, view.reports_for(vhost, queue))
            if elected is not None:
                changes.append(Change(Compare.mod_revision(key, mod), Put(key, elected.encode())))
        changes.extend(Change(compare, write) for compare, write in assignment_changes(view))
        return changes

    def preferred_leaders(self) -> list[Change]:
        """Leadership back to each partition's preferred replica where it is eligible
        (``placement.prefer_leader``)."""
        view = self.view
        changes = []
        for (vhost, queue), (record, mod) in sorted(view.partitions.items()):
            preferred = prefer_leader(record, view.live, view.reports_for(vhost, queue))
            if preferred is not None:
                key = partition_key(self.prefix, vhost, queue)
                changes.append(Change(Compare.mod_revision(key, mod), Put(key, preferred.encode())))
        return changes

    async def _write(self, token: int, changes: Sequence[Change]) -> None:
        fence = Compare(controller_key(self.prefix), "create", "=", token)
        for start in range(0, len(changes), BATCH):
            batch = changes[start : start + BATCH]
            result = await self.store.txn(
                [fence, *(change.compare for change in batch)],
                [change.operation for change in batch],
            )
            if not result.succeeded:
                # The view is behind (or this node was fenced): decide again once it has
                # caught up with the store.
                await self.view.wait_for(result.revision)
                return
            self.writes += len(batch)
            await self.view.wait_for(result.revision)
