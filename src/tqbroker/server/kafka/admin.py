"""Kafka's topic administration over the stream service: CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs and IncrementalAlterConfigs, as Kafka's controller answers
them (``ControllerApis.scala``, ``ReplicationControlManager.java``,
``ConfigAdminManager.scala``), through the same calls as ``PUT``/``PATCH``/``DELETE
/topics/{topic}`` and ``tqbroker-ctl topics``.

- a topic is made as ``tqbroker-ctl topics create`` makes it (an ``x-key-partition`` exchange
  and stream queues ``T-0 ... T-(N-1)``), its configs mapped onto stream arguments
  (``topic_config``: an unknown name or a bad value is ``INVALID_CONFIG``); ``num_partitions``
  -1 is Kafka's ``num.partitions`` default, 1; ``replication_factor`` -1 or, on one node, 1
  (in a cluster, the streams' ``x-stream-replicas``); manual assignments are not taken;
- permissions are RabbitMQ's, as the HTTP topic routes check them (``topic_needs``):
  ``configure`` (and what binding needs) to create, ``configure`` on the topic's exchange and
  queues to delete, grow or alter it, ``read`` on its queues to describe its configs; a refusal
  is ``TOPIC_AUTHORIZATION_FAILED``;
- the broker resource (type 4) describes a few read-only settings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from ...broker.streams.service import (
    Conflict,
    InvalidConfig,
    InvalidRequest,
    NotFound,
    TopicError,
)
from ...protocol.kafka import errors
from .. import topic_needs
from .session import KafkaSession

TOPIC, BROKER = 2, 4  # ConfigResource.Type
DEFAULT_PARTITIONS: Final = 1  # Kafka's num.partitions
DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG = 5, 1, 4  # ConfigSource
MAX_NAME_LENGTH: Final = 249  # Kafka's Topic.MAX_NAME_LENGTH
_LEGAL_NAME: Final = re.compile(r"[a-zA-Z0-9._-]+")
AUTHORIZATION_FAILED: Final = "Authorization failed."  # ControllerApis' message
# A name twice in one request (ControllerApis: each of its entries is refused).
_DUPLICATE: Final[tuple[int, str | None]] = (errors.INVALID_REQUEST, "Duplicate topic name.")

Body = Mapping[str, Any]


def invalid_topic_name(name: str) -> str | None:
    """Why ``name`` is not a Kafka topic name (``Topic.detectInvalidTopic``), or None."""
    if not name:
        return "the empty string is not allowed"
    if name in (".", ".."):
        return f"'{name}' is not allowed"
    if len(name) > MAX_NAME_LENGTH:
        return f"the length of '{name}' is longer than the max allowed length {MAX_NAME_LENGTH}"
    if not _LEGAL_NAME.fullmatch(name):
        return (
            f"'{name}' contains one or more characters other than ASCII alphanumerics, '.', "
            "'_' and '-'"
        )
    return None


def _duplicates(names: list[str]) -> set[str]:
    return {name for name, count in Counter(names).items() if count > 1}


# -- CreateTopics --------------------------------------------------------------------------


async def _each_topic(
    topics: Sequence[Body], answer: Callable[[Body], Awaitable[tuple[int, str | None]]]
) -> list[dict[str, Any]]:
    """Each topic's name, error code and message, once per name: a name given twice is
    refused (``ControllerApis``: INVALID_REQUEST, "Duplicate topic name.")."""
    duplicated = _duplicates([topic["name"] for topic in topics])
    answers: dict[str, dict[str, Any]] = {}
    for topic in topics:
        name = topic["name"]
        if name in answers:
            continue
        code, message = _DUPLICATE if name in duplicated else await answer(topic)
        answers[name] = {"name": name, "error_code": code, "error_message": message}
    return list(answers.values())


async def create_topics(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    validate_only = body.get("validate_only", False)

    async def create(topic: Body) -> tuple[int, str | None]:
        return await _create_topic(session, topic, validate_only)

    return {"throttle_time_ms": 0, "topics": await _each_topic(body["topics"], create)}


async def _create_topic(
    session: KafkaSession, topic: Body, validate_only: bool
) -> tuple[int, str | None]:
    name, count, replication = topic["name"], topic["num_partitions"], topic["replication_factor"]
    why = invalid_topic_name(name)
    if why is not None:
        return errors.INVALID_TOPIC_EXCEPTION, f"Topic name is invalid: {why}"
    count = DEFAULT_PARTITIONS if count == -1 else count
    if not await session.allowed(topic_needs.declare(name, count)):
        return errors.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED
    vhost = session.vhost
    if name in vhost.exchanges or name in vhost.queues:
        return errors.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists."
    if topic["assignments"]:
        return errors.INVALID_REPLICA_ASSIGNMENT, "manual partition assignments are not taken"
    if replication < -1 or replication == 0:  # ReplicationControlManager.createTopic
        return (
            errors.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if count < 1:
        return (
            errors.INVALID_PARTITIONS,
            "Number of partitions was set to an invalid non-positive value.",
        )
    arguments: dict[str, Any] = {}
    if replication > 1:
        if session.broker.replication is None:
            return (
                errors.INVALID_REPLICATION_FACTOR,
                f"Unable to replicate the partition {replication} time(s): The target "
                "replication factor cannot be reached because only 1 broker(s) are registered.",
            )
        arguments["x-stream-replicas"] = replication
    configs = {c["name"]: c["value"] for c in topic["configs"]}
    try:
        table = session.service.arguments_for(arguments, configs)
        if validate_only:
            return _check_count(count)
        await session.service.declare(name, count, table)
    except TopicError as exc:
        return _create_error(exc, count)
    return errors.NONE, None


def _check_count(count: int) -> tuple[int, str | None]:
    if count > 1000:  # topics.declare's bound
        return errors.INVALID_PARTITIONS, f"partitions must be between 1 and 1000 (got {count})"
    return errors.NONE, None


def _create_error(exc: TopicError, count: int) -> tuple[int, str]:
    if isinstance(exc, Conflict):
        return errors.TOPIC_ALREADY_EXISTS, exc.message
    if isinstance(exc, InvalidRequest) and not isinstance(exc, InvalidConfig):
        code = _check_count(count)[0]
        return (code if code != errors.NONE else errors.INVALID_REQUEST), exc.message
    return _failure(exc)


# -- DeleteTopics, CreatePartitions ----------------------------------------------------------


async def delete_topics(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    async def delete(topic: Body) -> tuple[int, str | None]:
        return await _delete_topic(session, topic["name"])

    topics = [{"name": name} for name in body["topic_names"]]
    return {"throttle_time_ms": 0, "responses": await _each_topic(topics, delete)}


async def _refusal(
    session: KafkaSession, name: str, needs: list[topic_needs.Need]
) -> tuple[int, str | None] | None:
    """Why a change to topic ``name`` is refused before it begins: it does not exist, or the
    user lacks ``needs``; None if neither."""
    try:
        session.service.partitions(name)
    except NotFound:
        return errors.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist."
    if not await session.allowed(needs):
        return errors.TOPIC_AUTHORIZATION_FAILED, AUTHORIZATION_FAILED
    return None


def _failure(exc: TopicError) -> tuple[int, str]:
    """Kafka's code for a change the stream service refused."""
    if isinstance(exc, InvalidConfig):
        return errors.INVALID_CONFIG, exc.message
    if isinstance(exc, NotFound):
        return errors.UNKNOWN_TOPIC_OR_PARTITION, exc.message
    if isinstance(exc, InvalidRequest):
        return errors.INVALID_REQUEST, exc.message
    return errors.KAFKA_STORAGE_ERROR, exc.message


async def _delete_topic(session: KafkaSession, name: str) -> tuple[int, str | None]:
    refused = await _refusal(session, name, topic_needs.configure(session.vhost, name))
    if refused is not None:
        return refused
    try:
        await session.service.delete(name)
    except TopicError as exc:
        return _failure(exc)
    return errors.NONE, None


async def create_partitions(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    async def grow(topic: Body) -> tuple[int, str | None]:
        return await _grow(session, topic, body["validate_only"])

    return {"throttle_time_ms": 0, "results": await _each_topic(body["topics"], grow)}


async def _grow(session: KafkaSession, topic: Body, validate_only: bool) -> tuple[int, str | None]:
    name, count = topic["name"], topic["count"]
    needs = topic_needs.configure(session.vhost, name) + topic_needs.declare(name, count)
    refused = await _refusal(session, name, needs)
    if refused is not None:
        return refused
    current = len(session.service.partitions(name))
    if topic["assignments"] is not None:
        return errors.INVALID_REPLICA_ASSIGNMENT, "manual partition assignments are not taken"
    if validate_only:  # the checks ReplicationControlManager.createPartitions makes
        if count == current:
            return errors.INVALID_PARTITIONS, f"Topic already has {current} partition(s)."
        if count < current:
            return (
                errors.INVALID_PARTITIONS,
                f"The topic {name} currently has {current} partition(s); {count} would not be "
                "an increase.",
            )
        return _check_count(count)
    try:
        await session.service.grow(name, count)
    except InvalidRequest as exc:
        return errors.INVALID_PARTITIONS, exc.message
    except TopicError as exc:
        return _failure(exc)
    return errors.NONE, None


# -- DescribeConfigs, IncrementalAlterConfigs ---------------------------------------------


async def describe_configs(session: KafkaSession, body: Body, version: int) -> dict[str, Any]:
    results = []
    for resource in body["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        keys = resource["configuration_keys"]
        answer: dict[str, Any] = {
            "resource_type": kind,
            "resource_name": name,
            "error_code": errors.NONE,
            "error_message": None,
            "configs": [],
        }
        if kind == TOPIC:
            code, message, configs = await _topic_configs(session, name)
        elif kind == BROKER:
            code, message, configs = _broker_configs(session, name)
        else:
            code, message, configs = errors.INVALID_REQUEST, f"Unsupported resource type {kind}", []
        if keys is not None:
            configs = [c for c in configs if c["name"] in keys]
        for config in configs:
            if version == 0:
                config["is_default"] = config["config_source"] == DEFAULT_CONFIG
        answer.update(error_code=code, error_message=message, configs=configs)
        results.append(answer)
    return {"throttle_time_ms": 0, "results": results}


async def _topic_configs(
    session: KafkaSession, name: str
) -> tuple[int, str | None, list[dict[str, Any]]]:
    service = session.service
    refused = await _refusal(session, name, topic_needs.read(session.vhost, name))
    if refused is not None:
        return *refused, []
    limit = session.broker.config.max_message_size
    configs = [
        _config_entry(
            c.name, c.value, DEFAULT_CONFIG if c.is_default else DYNAMIC_TOPIC_CONFIG, False
        )
        for c in service.configs(name, max_message_bytes=limit)
    ]
    return errors.NONE, None, configs


def _broker_configs(
    session: KafkaSession, name: str
) -> tuple[int, str | None, list[dict[str, Any]]]:
    """This node's settings that a topic's defaults come from (read-only here)."""
    node_id = session.nodes.this_node_id
    if name not in ("", str(node_id)):  # ConfigAdminManager: another broker's id
        why = f"Unexpected broker id, expected {node_id}, but received {name}"
        return errors.INVALID_REQUEST, why, []
    settings = {
        "num.partitions": str(DEFAULT_PARTITIONS),
        "default.replication.factor": "1",
        "message.max.bytes": str(session.broker.config.max_message_size),
    }
    return (
        errors.NONE,
        None,
        [_config_entry(k, v, STATIC_BROKER_CONFIG, True) for k, v in settings.items()],
    )


def _config_entry(name: str, value: str, source: int, read_only: bool) -> dict[str, Any]:
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
    }


async def incremental_alter_configs(
    session: KafkaSession, body: Body, version: int
) -> dict[str, Any]:
    responses = []
    for resource in body["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        if kind == TOPIC:
            code, message = await _alter_topic(session, name, resource["configs"], body)
        elif kind == BROKER:
            code, message = errors.INVALID_REQUEST, "broker configs cannot be altered here"
        else:
            code, message = errors.INVALID_REQUEST, f"Unknown resource type {kind}"
        responses.append(
            {
                "resource_type": kind,
                "resource_name": name,
                "error_code": code,
                "error_message": message,
            }
        )
    return {"throttle_time_ms": 0, "responses": responses}


async def _alter_topic(
    session: KafkaSession, name: str, configs: list[Body], body: Body
) -> tuple[int, str | None]:
    refused = await _refusal(session, name, topic_needs.configure(session.vhost, name))
    if refused is not None:
        return refused
    changes = [(c["name"], c["config_operation"], c["value"]) for c in configs]
    if _duplicates([change[0] for change in changes]):
        return errors.INVALID_REQUEST, "Error due to duplicate config keys"
    try:
        await session.service.alter_configs(name, changes, validate_only=body["validate_only"])
    except TopicError as exc:
        return _failure(exc)
    return errors.NONE, None
