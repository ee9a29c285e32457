"""Consumer groups across a cluster's nodes (§4.8 of ``shared/reference/scaleout.md``): the
members of one group are balanced against each other whichever node they consume on, as if they
were on one node.

Responsibilities:
- ``ClusterGroups``, on every node (the broker's ``GroupCoordination``): when a group's members
  here change, it writes them (``groups/{vhost}/{group}/members/{node}``: each member's id and
  partitions, bound to the node's lease, so a dead node's members go with it; written again
  under every new registration); it applies every assignment the view shows to the groups here
  (members here read what it gives them; one that loses a partition it still consumes is
  cancelled, as on one node); as a partition's leader, it ``refuses`` a group commit from a
  member that an assignment of a later generation no longer gives the partition (Kafka's
  generation fencing: a revoked member's late acks do not move the new owner's offset);
- ``assignment_changes``, the controller's part: each group's members in join order (node
  entries by their keys' create revisions, then each node's own order), assigned as one node
  assigns (``balanced_assignment``: sticky and balanced), written with the next generation
  when the owners change (a compare on the assignment's mod revision).
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Final

import trio

from ..broker.streams.assignment import balanced_assignment
from ..broker.streams.groups import ConsumerGroup
from ..broker.streams.partition import GroupFence
from .membership import Membership
from .metadata import Compare, Delete, MetadataError, MetadataStore, Operation, Put
from .records import GroupAssignment, GroupMembers, group_assignment_key, group_members_key
from .view import ClusterView, Name

if TYPE_CHECKING:
    from ..broker.broker import Broker

log = logging.getLogger(__name__)

RETRY_SECONDS: Final = 0.5
BATCH: Final = 100  # member entries per transaction (etcd refuses more than 128 operations)


class ClusterGroups:
    """This node's part in the cluster's consumer groups (see the module doc)."""

    def __init__(
        self, broker: Broker, store: MetadataStore, view: ClusterView, membership: Membership
    ) -> None:
        self.broker = broker
        self.store = store
        self.view = view
        self.membership = membership
        # Members' ids: this node's, this run's (a restarted node's members are new ones).
        self.member_prefix = f"{membership.node_id}/{secrets.token_hex(3)}/"
        self._dirty: set[Name] = set()  # groups whose entry here is to be written
        self._dirtied = trio.Event()
        self._written_under = 0  # the incarnation the entries were written under
        self._applied: dict[Name, int] = {}  # each assignment's mod revision applied here

    # -- the broker's side (``GroupCoordination``) -----------------------------------------------

    def members_changed(self, vhost: str, group: ConsumerGroup) -> None:
        name = (vhost, group.name)
        self._dirty.add(name)
        self._dirtied.set()
        found = self.view.group_assignments.get(name)
        if found is not None:  # until the next one: members still there keep theirs
            self._apply(name, found[0])

    def refuses(self, vhost: str, queue: str, group: str, fence: GroupFence) -> bool:
        """Whether a commit on ``queue`` by the member ``fence`` names is stale: an assignment
        of a later generation gives the partition to another member."""
        found = self.view.group_assignments.get((vhost, group))
        if found is None:
            return False
        assignment = found[0]
        return (
            assignment.generation > fence.generation
            and assignment.owners.get(queue) != fence.member
        )

    # -- the tasks -------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._write_members)
            nursery.start_soon(self._follow_assignments)
            task_status.started()

    async def _write_members(self) -> None:
        while True:
            with trio.move_on_after(RETRY_SECONDS):
                await self._dirtied.wait()
            incarnation = self.membership.incarnation
            if not incarnation:
                continue
            if incarnation != self._written_under:  # a new lease: its entries are gone
                self._written_under = incarnation
                self._dirty.update(self._local_groups())
            if not self._dirty:
                continue
            dirty, self._dirty = self._dirty, set()
            self._dirtied = trio.Event()
            try:
                await self._write(sorted(dirty), incarnation)
            except MetadataError as exc:
                log.warning("consumer groups: members not written: %s", exc)
                self._dirty |= dirty
                await trio.sleep(RETRY_SECONDS)

    async def _write(self, names: list[Name], incarnation: int) -> None:
        node = self.membership.node_id
        operations: list[Operation] = []
        for vhost, group in names:
            key = group_members_key(self.view.prefix, vhost, group, node)
            entry = self._entry(vhost, group)
            operations.append(
                Delete(key) if entry is None else Put(key, entry.encode(), lease=incarnation)
            )
        for start in range(0, len(operations), BATCH):
            await self.store.txn([], operations[start : start + BATCH])

    def _entry(self, vhost: str, group: str) -> GroupMembers | None:
        found = self.broker.vhosts.get(vhost)
        live = found.consumer_groups.groups.get(group) if found is not None else None
        if live is None or live.empty:
            return None
        return GroupMembers(tuple((m, tuple(ps)) for m, ps in live.member_partitions()))

    def _local_groups(self) -> set[Name]:
        return {
            (name, group)
            for name, vhost in self.broker.vhosts.items()
            for group in vhost.consumer_groups.groups
        }

    async def _follow_assignments(self) -> None:
        while True:
            for name, (assignment, revision) in list(self.view.group_assignments.items()):
                if self._applied.get(name) != revision:
                    self._applied[name] = revision
                    self._apply(name, assignment)
            await self.view.wait_for(self.view.revision + 1)

    def _apply(self, name: Name, assignment: GroupAssignment) -> None:
        vhost = self.broker.vhosts.get(name[0])
        if vhost is not None:
            vhost.consumer_groups.apply_assignment(
                name[1], assignment.owners, assignment.generation
            )


def assignment_changes(view: ClusterView) -> list[tuple[Compare, Operation]]:
    """The controller's writes of groups' assignments (see the module doc)."""
    changes: list[tuple[Compare, Operation]] = []
    for name in sorted(set(view.group_members) | set(view.group_assignments)):
        entries = view.group_members.get(name, {})
        members: list[str] = []
        subscribers: dict[str, list[str]] = {}
        for node, (record, _created) in sorted(entries.items(), key=lambda e: (e[1][1], e[0])):
            if node not in view.nodes:  # gone: its entry goes with its lease
                continue
            for member, partitions in record.members:
                members.append(member)
                for partition in partitions:
                    subscribers.setdefault(partition, []).append(member)
        found = view.group_assignments.get(name)
        owners = dict(found[0].owners) if found is not None else {}
        target = balanced_assignment(subscribers, owners, members, lambda queue: queue)
        if target == owners:
            continue
        key = group_assignment_key(view.prefix, *name)
        generation = found[0].generation + 1 if found is not None else 1
        compare = Compare.mod_revision(key, found[1]) if found else Compare.absent(key)
        changes.append((compare, Put(key, GroupAssignment(generation, target).encode())))
    return changes
