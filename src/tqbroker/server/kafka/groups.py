"""Kafka consumer groups, the classic protocol, coordinated by this node (in the shape of
Kafka's ``GroupCoordinator`` and ``GroupMetadata``, without their persistence: a group's
membership lives in memory, its committed offsets in the streams).

A group moves Empty → PreparingRebalance (a member joined, left or timed out: every member
must join again) → CompletingRebalance (every member joined, or the rebalance timeout passed
and the others were dropped: a new generation, its leader chosen, each join answered; the
leader's join has the members and their subscriptions) → Stable (the leader's SyncGroup
brought the assignment: each member's SyncGroup answers its own) and back. Joins and the
followers' syncs wait (Trio events) for their phase to end. A JoinGroup without a member id
from version 4 on is answered ``MEMBER_ID_REQUIRED`` with the id to join with (KIP-394);
static members (``group_instance_id``) keep their member id across restarts. A member that
sends no heartbeat for its session timeout is removed. The error codes are Kafka's
(``Errors.java``): ``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION``, ``REBALANCE_IN_PROGRESS``,
``INCONSISTENT_GROUP_PROTOCOL``, ``MEMBER_ID_REQUIRED``.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import trio

from ...protocol.kafka import errors

EMPTY, PREPARING, COMPLETING, STABLE = (
    "Empty",
    "PreparingRebalance",
    "CompletingRebalance",
    "Stable",
)
MEMBER_ID_REQUIRED: Final = errors.MEMBER_ID_REQUIRED
INCONSISTENT_GROUP_PROTOCOL: Final = errors.INCONSISTENT_GROUP_PROTOCOL
UNKNOWN_MEMBER_ID: Final = errors.UNKNOWN_MEMBER_ID
ILLEGAL_GENERATION: Final = errors.ILLEGAL_GENERATION
REBALANCE_IN_PROGRESS: Final = errors.REBALANCE_IN_PROGRESS
# How long the first rebalance of an empty group waits for more members (Kafka's
# group.initial.rebalance.delay.ms is 3000; shorter here: one node, no coordinator load).
INITIAL_REBALANCE_DELAY: Final = 0.5


@attrs.define
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    session_timeout: float
    rebalance_timeout: float
    protocols: list[tuple[str, bytes]]
    client_host: str = ""
    heartbeat_deadline: float = math.inf
    assignment: bytes = b""
    joined: bool = False  # joined the rebalance under way


@attrs.define
class Group:
    name: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = attrs.field(factory=dict)
    pending: set[str] = attrs.field(factory=set)  # ids given with MEMBER_ID_REQUIRED
    rebalance_deadline: float = math.inf
    # A first rebalance ends no sooner (Kafka's InitialDelayedJoin: more members may come).
    earliest_completion: float = 0.0
    joined: trio.Event = attrs.field(factory=trio.Event)  # the join phase ended
    synced: trio.Event = attrs.field(factory=trio.Event)  # the leader's assignment came


class GroupCoordinator:
    """Every Kafka consumer group of the node (see the module doc); ``run`` expires sessions
    and ends rebalances whose timeout passed."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self._changed = trio.Event()

    def group(self, name: str) -> Group:
        found = self.groups.get(name)
        if found is None:
            found = self.groups[name] = Group(name)
        return found

    async def run(self) -> None:
        while True:
            now = trio.current_time()
            for group in list(self.groups.values()):
                self._tick(group, now)
            deadlines = [g.rebalance_deadline for g in self.groups.values()]
            deadlines += [
                g.earliest_completion for g in self.groups.values() if g.earliest_completion > now
            ]
            deadlines += [
                m.heartbeat_deadline for g in self.groups.values() for m in g.members.values()
            ]
            # No timer while nothing is due: an idle node (or a test's mock clock) is not woken.
            with trio.move_on_at(min(deadlines, default=math.inf)):
                await self._changed.wait()
            self._changed = trio.Event()

    def _tick(self, group: Group, now: float) -> None:
        expired = [m for m in group.members.values() if m.heartbeat_deadline <= now]
        if group.state == PREPARING:
            expired = [m for m in expired if not m.joined]
        for member in expired:
            self._remove(group, member.member_id)
        if (
            group.state == PREPARING
            and now >= group.earliest_completion
            and (group.rebalance_deadline <= now or all(m.joined for m in group.members.values()))
        ):
            self._complete_join(group, now)

    # -- JoinGroup -------------------------------------------------------------------------

    async def join(
        self, body: Mapping[str, Any], version: int, client_id: str, client_host: str = ""
    ) -> dict[str, Any]:
        group = self.group(body["group_id"])
        now = trio.current_time()
        member_id: str = body["member_id"]
        instance: str | None = body.get("group_instance_id")
        protocols = [(p["name"], p["metadata"]) for p in body["protocols"]]
        protocol_type = body["protocol_type"]
        if not protocols:  # nothing to choose from (Kafka's JoinGroup refuses it so too)
            return join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if group.members and protocol_type != group.protocol_type:
            return join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if group.members and not self._common(group, [name for name, _ in protocols]):
            return join_error(INCONSISTENT_GROUP_PROTOCOL, member_id)
        if instance is not None:
            known = next(
                (m for m in group.members.values() if m.group_instance_id == instance), None
            )
            if known is not None:
                member_id = known.member_id
        if not member_id:
            member_id = f"{client_id or 'member'}-{uuid.uuid4()}"
            if version >= 4 and instance is None:
                group.pending.add(member_id)
                return join_error(MEMBER_ID_REQUIRED, member_id)
        elif member_id not in group.members and member_id not in group.pending:
            return join_error(UNKNOWN_MEMBER_ID, member_id)
        group.pending.discard(member_id)
        session = body["session_timeout_ms"] / 1000
        rebalance = body.get("rebalance_timeout_ms", -1)
        member = group.members.get(member_id)
        if member is None:
            member = group.members[member_id] = Member(
                member_id,
                instance,
                client_id,
                session,
                rebalance / 1000 if rebalance > 0 else session,
                protocols,
                client_host,
            )
        member.protocols = protocols
        member.heartbeat_deadline = now + session
        group.protocol_type = protocol_type
        member.joined = True
        if group.state != PREPARING:
            self._prepare(group, now, first=group.state == EMPTY)
        generation_event = group.joined
        self._changed.set()
        await generation_event.wait()
        if member_id not in group.members:  # dropped: it did not join in time
            return join_error(UNKNOWN_MEMBER_ID, member_id)
        leader = group.leader
        members = []
        if member_id == leader:
            chosen = group.protocol
            members = [
                {
                    "member_id": m.member_id,
                    "group_instance_id": m.group_instance_id,
                    "metadata": dict(m.protocols).get(chosen or "", b""),
                }
                for m in group.members.values()
            ]
        return {
            "throttle_time_ms": 0,
            "error_code": errors.NONE,
            "generation_id": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol,
            "leader": leader or "",
            "member_id": member_id,
            "members": members,
        }

    def _prepare(self, group: Group, now: float, *, first: bool = False) -> None:
        """Begin a rebalance: every member must join again."""
        if group.state == COMPLETING:
            group.synced.set()  # followers waiting for an assignment that will not come
        group.state = PREPARING
        group.synced = trio.Event()
        longest = max((m.rebalance_timeout for m in group.members.values()), default=0.0)
        group.rebalance_deadline = now + longest
        group.earliest_completion = now + (INITIAL_REBALANCE_DELAY if first else 0.0)
        self._changed.set()

    def _complete_join(self, group: Group, now: float) -> None:
        for member in [m for m in group.members.values() if not m.joined]:
            del group.members[member.member_id]
        group.generation += 1
        group.rebalance_deadline = math.inf
        joined, group.joined = group.joined, trio.Event()
        if not group.members:
            group.state, group.leader, group.protocol = EMPTY, None, None
            joined.set()
            return
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.protocol = self._chosen(group)
        for member in group.members.values():
            member.joined = False
            member.heartbeat_deadline = now + member.session_timeout
        group.state = COMPLETING
        joined.set()

    @staticmethod
    def _common(group: Group, names: Sequence[str]) -> list[str]:
        supported = set(names)
        for member in group.members.values():
            supported &= {name for name, _ in member.protocols}
        return [name for name in names if name in supported]

    @staticmethod
    def _chosen(group: Group) -> str | None:
        """The protocol every member supports with the most votes (each member votes for its
        first supported one), Kafka's ``selectProtocol``."""
        members = list(group.members.values())
        common = set.intersection(*({name for name, _ in m.protocols} for m in members))
        votes: dict[str, int] = {}
        for member in members:
            choice = next((name for name, _ in member.protocols if name in common), None)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name]) if votes else None

    # -- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------------

    async def sync(self, body: Mapping[str, Any]) -> dict[str, Any]:
        group = self.groups.get(body["group_id"])
        member_id = body["member_id"]
        error = self._check(group, member_id, body["generation_id"])
        if error is not None or group is None:
            return sync_answer(error or UNKNOWN_MEMBER_ID)
        if group.state == PREPARING:
            return sync_answer(REBALANCE_IN_PROGRESS)
        if group.state == COMPLETING:
            if member_id == group.leader:
                assignments = {a["member_id"]: a["assignment"] for a in body["assignments"]}
                for member in group.members.values():
                    member.assignment = assignments.get(member.member_id, b"")
                group.state = STABLE
                group.synced.set()
            else:
                synced = group.synced
                await synced.wait()
                if group.state != STABLE or member_id not in group.members:
                    return sync_answer(REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        member.heartbeat_deadline = trio.current_time() + member.session_timeout
        return sync_answer(errors.NONE, group, member.assignment)

    def heartbeat(self, body: Mapping[str, Any]) -> int:
        group = self.groups.get(body["group_id"])
        member_id = body["member_id"]
        error = self._check(group, member_id, body["generation_id"])
        if error is not None or group is None:
            return error or UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        member.heartbeat_deadline = trio.current_time() + member.session_timeout
        return REBALANCE_IN_PROGRESS if group.state == PREPARING else errors.NONE

    def leave(self, group_id: str, member_ids: Sequence[str]) -> int:
        group = self.groups.get(group_id)
        if group is None or any(m not in group.members for m in member_ids):
            return UNKNOWN_MEMBER_ID
        for member_id in member_ids:
            self._remove(group, member_id)
        return errors.NONE

    def check_commit(self, group_id: str, generation: int, member_id: str) -> int:
        """Whether an OffsetCommit may store offsets for the group: a commit outside the
        group protocol (generation -1, Kafka's "simple" consumer) always may; a member's only
        in the group's current generation, while it is Stable or preparing a rebalance (the
        members commit what they processed before they join again: Kafka's
        ``doCommitOffsets`` takes it, and counts it as a heartbeat), not once every member
        joined (CompletingRebalance: ``REBALANCE_IN_PROGRESS``)."""
        group = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return errors.NONE
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ILLEGAL_GENERATION
        if group.state == COMPLETING:
            return REBALANCE_IN_PROGRESS
        member = group.members[member_id]
        member.heartbeat_deadline = trio.current_time() + member.session_timeout
        return errors.NONE

    def _check(self, group: Group | None, member_id: str, generation: int) -> int | None:
        if group is None or member_id not in group.members:
            return UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ILLEGAL_GENERATION
        return None

    def _remove(self, group: Group, member_id: str) -> None:
        group.members.pop(member_id, None)
        if group.state == PREPARING:
            self._changed.set()  # the join may be complete now
            return
        if group.members or group.state != EMPTY:
            self._prepare(group, trio.current_time())
            if not group.members:
                self._complete_join(group, trio.current_time())


def join_error(code: int, member_id: str) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "generation_id": -1,
        "protocol_name": "",  # null only from version 7
        "leader": "",
        "member_id": member_id,
        "members": [],
    }


def sync_answer(code: int, group: Group | None = None, assignment: bytes = b"") -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "protocol_type": group.protocol_type if group is not None else None,
        "protocol_name": group.protocol if group is not None else None,
        "assignment": assignment,
    }
