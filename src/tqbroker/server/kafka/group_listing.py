"""DescribeGroups and ListGroups: the node's Kafka consumer groups (``GroupCoordinator``: their
members, state and protocol) and the stream groups that only have committed offsets (what
``x-stream-group`` consumers and OffsetCommit leave, Kafka's groups without members: state
``Empty``).

As Kafka's ``ClassicGroup.describe``: a Stable group's members come with their subscription
and assignment, others' without; a group nobody knows is ``Dead`` with no error
(``GroupMetadataManager.describeGroups``). Permissions: describing a group needs ``read`` on
the stream queues of the topics it has offsets on (what fetching its offsets needs); a refusal
is ``GROUP_AUTHORIZATION_FAILED``, and ListGroups leaves out the groups the user may not
describe (``KafkaApis.handleListGroupsRequest`` filters them so).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...protocol.kafka import errors
from ..topic_needs import Need
from ..topic_needs import read as read_needs
from .groups import STABLE, Group
from .session import KafkaSession

DEAD: Final = "Dead"
EMPTY: Final = "Empty"
# AclOperation codes (READ 3, DESCRIBE 8) as DescribeGroups v3's bit field; INT32_MIN when
# not asked for (``MessageUtil``'s "omitted").
AUTHORIZED_OPERATIONS: Final = (1 << 3) | (1 << 8)
NOT_ASKED: Final = -(2**31)

Body = Mapping[str, Any]


def _offset_topics(session: KafkaSession) -> dict[str, list[str]]:
    """Each stream group's topics (where it has offsets or members), by group."""
    found: dict[str, list[str]] = {}
    for summary in session.service.all_groups():
        found.setdefault(summary.group, []).append(summary.topic)
    return found


async def _may_describe(session: KafkaSession, topics: list[str]) -> bool:
    needs: list[Need] = [need for topic in topics for need in read_needs(session.vhost, topic)]
    return await session.allowed(needs)


async def describe_groups(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    offset_topics = _offset_topics(session)
    described = []
    for group_id in body["groups"]:
        answer: dict[str, Any] = {
            "error_code": errors.NONE,
            "group_id": group_id,
            "group_state": DEAD,
            "protocol_type": "",
            "protocol_data": "",
            "members": [],
            "authorized_operations": (
                AUTHORIZED_OPERATIONS if body.get("include_authorized_operations") else NOT_ASKED
            ),
        }
        if not await _may_describe(session, offset_topics.get(group_id, [])):
            answer.update(error_code=errors.GROUP_AUTHORIZATION_FAILED, group_state="")
        else:
            group = session.groups.groups.get(group_id)
            if group is not None and (group.members or group_id not in offset_topics):
                answer.update(_described(group))
            elif group_id in offset_topics:
                answer["group_state"] = EMPTY
        described.append(answer)
    return {"throttle_time_ms": 0, "groups": described}


def _described(group: Group) -> dict[str, Any]:
    stable = group.state == STABLE
    chosen = group.protocol or ""
    members = [
        {
            "member_id": member.member_id,
            "group_instance_id": member.group_instance_id,
            "client_id": member.client_id,
            "client_host": member.client_host,
            "member_metadata": dict(member.protocols).get(chosen, b"") if stable else b"",
            "member_assignment": member.assignment if stable else b"",
        }
        for member in group.members.values()
    ]
    return {
        "group_state": group.state,
        "protocol_type": group.protocol_type or "",
        "protocol_data": chosen if stable else "",
        "members": members,
    }


async def list_groups(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    offset_topics = _offset_topics(session)
    listed: dict[str, str] = {name: "" for name in offset_topics}
    for name, group in session.groups.groups.items():
        if group.members or name not in offset_topics:
            listed[name] = group.protocol_type or ""
    groups = []
    for name in sorted(listed):
        if await _may_describe(session, offset_topics.get(name, [])):
            groups.append({"group_id": name, "protocol_type": listed[name]})
    return {"throttle_time_ms": 0, "error_code": errors.NONE, "groups": groups}
