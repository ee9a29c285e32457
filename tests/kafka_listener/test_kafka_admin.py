"""Kafka's admin APIs on the listener, with the real admin clients (kafka-python 3's
``KafkaAdminClient``, confluent-kafka's ``AdminClient``): CreateTopics (its configs mapped onto
stream arguments, ``validate_only``), DeleteTopics, CreatePartitions, DescribeConfigs,
IncrementalAlterConfigs (retention taking effect on the existing streams), DescribeGroups and
ListGroups; a topic an admin client made is produced to and consumed by Kafka clients and seen
as stream queues over the HTTP API. Refused configs and RabbitMQ permissions (``configure`` to
create, alter and delete; ``read`` to describe) get Kafka's error codes.

Kafka's answers are read from its source (apache/kafka): the codes in
``clients/.../common/protocol/Errors.java``; CreateTopics' checks and messages in
``metadata/.../controller/ReplicationControlManager.java`` (``createTopic``,
``createPartitions``), duplicate names and authorization in
``core/.../server/ControllerApis.scala``; config names in ``storage/.../log/LogConfig.java``
(``validateNames``: "Unknown topic config name"), incremental operations in
``core/.../server/ConfigAdminManager.scala``; a group nobody knows is ``Dead`` without an
error (``group-coordinator/.../GroupMetadataManager.java``, ``describeGroups``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewPartitions
from confluent_kafka.cimpl import NewTopic as ConfluentTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource as KpResource
from kafka.admin import ConfigResourceType, KafkaAdminClient, NewTopic
from kafka.admin import NewPartitions as KpPartitions
from kafka.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)

from tests.kafka_listener.clients import consume
from tests.kafka_listener.raw import call
from tests.support.polling import eventually
from tqbroker.testing import RunningBroker, running_broker

pytestmark = pytest.mark.timeout(180)
SASL = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"}
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, INVALID_CONFIG = 29, 30, 40


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as http:
            user = {"password": "pw", "tags": ""}
            assert http.put("/api/users/reader", json=user).status_code == 201
            read_only = {"configure": "", "write": "", "read": ".*"}
            assert http.put("/api/permissions/%2F/reader", json=read_only).status_code == 201
            assert http.put("/api/users/nobody", json=user).status_code == 201
            nothing = {"configure": "", "write": "", "read": ""}
            assert http.put("/api/permissions/%2F/nobody", json=nothing).status_code == 201
        yield running


@pytest.fixture
def admin(broker: RunningBroker) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap)
    try:
        yield client
    finally:
        client.close()


def http_topic(broker: RunningBroker, name: str) -> httpx.Response:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        return http.get(f"/topics/{name}")


def test_kafka_python_creates_grows_alters_and_deletes_a_topic(
    broker: RunningBroker, admin: KafkaAdminClient
) -> None:
    configs = {"retention.ms": "86400000", "cleanup.policy": "delete", "compression.type": "lz4"}
    admin.create_topics([NewTopic("kp-admin", 2, 1, topic_configs=configs)])
    described = http_topic(broker, "kp-admin").json()
    assert [p["queue"] for p in described["partitions"]] == ["kp-admin-0", "kp-admin-1"]
    arguments = described["arguments"]
    assert arguments["x-max-age"] == "86400s"
    assert arguments["x-stream-cleanup-policy"] == "delete"
    assert arguments["x-stream-compression-type"] == "lz4"
    assert described["configs"]["retention.ms"] == "86400000"
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    for n in range(6):
        producer.send("kp-admin", value=b"v%d" % n, partition=n % 2)
    producer.flush()
    producer.close()
    assert sorted(r.value for r in consume(broker, "kp-admin", 6)) == [b"v%d" % n for n in range(6)]
    # ReplicationControlManager.createTopic: "Topic 'kp-admin' already exists."
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topics([NewTopic("kp-admin", 2, 1)])
    admin.create_partitions({"kp-admin": KpPartitions(total_count=3)})
    assert len(http_topic(broker, "kp-admin").json()["partitions"]) == 3
    # createPartitions: not an increase is INVALID_PARTITIONS
    with pytest.raises(InvalidPartitionsError):
        admin.create_partitions({"kp-admin": KpPartitions(total_count=2)})
    resource = KpResource(ConfigResourceType.TOPIC, "kp-admin")
    found = admin.describe_configs([resource], config_filter="all")["topic"]["kp-admin"]
    assert found["retention.ms"]["value"] == "86400000"
    assert found["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert found["retention.bytes"]["value"] == "-1"
    assert found["retention.bytes"]["config_source"] == "DEFAULT_CONFIG"
    assert not found["retention.ms"]["read_only"]
    assert not found["retention.ms"]["is_sensitive"]
    modified = admin.describe_configs([resource])["topic"]["kp-admin"]
    assert set(modified) == {"retention.ms", "cleanup.policy", "compression.type"}
    change = KpResource(
        ConfigResourceType.TOPIC,
        "kp-admin",
        configs={"retention.ms": "3600000", "compression.type": ("DELETE", None)},
    )
    assert admin.alter_configs([change]) == {"topic": {"kp-admin": "OK"}}
    arguments = http_topic(broker, "kp-admin").json()["arguments"]
    assert arguments["x-max-age"] == "3600s"
    assert "x-stream-compression-type" not in arguments
    assert broker.broker is not None  # every partition's stream took it
    queues = broker.broker.vhosts["/"].queues
    assert [queues[f"kp-admin-{n}"].max_age_ms for n in range(3)] == [3_600_000] * 3  # type: ignore[attr-defined]
    admin.delete_topics(["kp-admin"])
    assert http_topic(broker, "kp-admin").status_code == 404
    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["kp-admin"])


def test_defaults_validate_only_and_refusals(
    broker: RunningBroker, admin: KafkaAdminClient
) -> None:
    # -1, -1: num.partitions (1) and one replica. Raw: kafka-python sends -1 only to a broker
    # it takes for 2.4 or later (admin/_topics.py), and it takes this one for 2.1 (Fetch 10).
    topic = {"name": "kp-defaults", "num_partitions": -1, "replication_factor": -1}
    created = call(
        broker.kafka_bootstrap, 19, 3, {"topics": [{**topic, "assignments": [], "configs": []}]}
    )
    assert created["topics"][0]["error_code"] == 0
    assert len(http_topic(broker, "kp-defaults").json()["partitions"]) == 1
    twice = {"topics": [{**topic, "assignments": [], "configs": []}] * 2}
    # ControllerApis: a name given twice is INVALID_REQUEST (42), "Duplicate topic name."
    assert [t["error_code"] for t in call(broker.kafka_bootstrap, 19, 3, twice)["topics"]] == [42]
    admin.create_topics([NewTopic("kp-checked", 3, 1)], validate_only=True)
    assert http_topic(broker, "kp-checked").status_code == 404  # nothing made
    # LogConfig.validateNames: an unknown name is INVALID_CONFIG, and nothing is made
    with pytest.raises(InvalidConfigurationError, match=r"retention\.msx"):
        admin.create_topics([NewTopic("kp-bad", 1, 1, topic_configs={"retention.msx": "1000"})])
    for name, value in [
        ("cleanup.policy", "shred"),
        ("segment.bytes", "100"),
        ("retention.ms", "soon"),
        ("compression.type", "brotli"),
    ]:
        with pytest.raises(InvalidConfigurationError, match=name):
            admin.create_topics([NewTopic("kp-bad", 1, 1, topic_configs={name: value})])
    assert http_topic(broker, "kp-bad").status_code == 404
    # Topic.detectInvalidTopic: ASCII alphanumerics, '.', '_' and '-' only
    with pytest.raises(InvalidTopicError):
        admin.create_topics([NewTopic("kp bad", 1, 1)])
    # createTopic: a replication factor the cluster cannot reach; partitions below 1
    with pytest.raises(InvalidReplicationFactorError):
        admin.create_topics([NewTopic("kp-bad", 1, 3)])
    with pytest.raises(InvalidPartitionsError):
        admin.create_topics([NewTopic("kp-bad", 0, 1)])
    change = KpResource(ConfigResourceType.TOPIC, "kp-defaults", configs={"retention.msx": "1"})
    with pytest.raises(ValueError, match=r"retention\.msx"):  # the client checks before it asks
        admin.alter_configs([change])


def test_max_message_bytes_limits_a_produce(broker: RunningBroker, admin: KafkaAdminClient) -> None:
    configs = {"max.message.bytes": "1000"}
    admin.create_topics([NewTopic("kp-small", 1, 1, topic_configs=configs)])
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, enable_idempotence=False)
    try:
        assert producer.send("kp-small", value=b"s" * 900).get(10).offset == 0
        # UnifiedLog: a batch over max.message.bytes is MESSAGE_TOO_LARGE (10)
        with pytest.raises(MessageSizeTooLargeError):
            producer.send("kp-small", value=b"L" * 2000).get(10)
    finally:
        producer.close()


def test_a_user_without_configure_is_refused(broker: RunningBroker) -> None:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put("/topics/kp-guarded", json={"partitions": 1}).status_code == 201
    reader = KafkaAdminClient(
        bootstrap_servers=broker.kafka_bootstrap,
        sasl_plain_username="reader",
        sasl_plain_password="pw",
        **SASL,
    )
    try:
        # ControllerApis: TOPIC_AUTHORIZATION_FAILED for each topic refused
        with pytest.raises(TopicAuthorizationFailedError):
            reader.create_topics([NewTopic("kp-by-reader", 1, 1)])
        with pytest.raises(TopicAuthorizationFailedError):
            reader.delete_topics(["kp-guarded"])
        with pytest.raises(TopicAuthorizationFailedError):
            reader.create_partitions({"kp-guarded": KpPartitions(total_count=2)})
        resource = KpResource(ConfigResourceType.TOPIC, "kp-guarded")
        found = reader.describe_configs([resource], config_filter="all")["topic"]
        assert found["kp-guarded"]["cleanup.policy"]["value"] == "delete"  # read may describe
        change = KpResource(
            ConfigResourceType.TOPIC, "kp-guarded", configs={"retention.ms": "1000"}
        )
        assert "TopicAuthorizationFailed" in reader.alter_configs([change])["topic"]["kp-guarded"]
    finally:
        reader.close()
    assert http_topic(broker, "kp-by-reader").status_code == 404
    assert len(http_topic(broker, "kp-guarded").json()["partitions"]) == 1
    # without read: DescribeConfigs is refused too (raw, to see the code)
    answer = call(
        broker.kafka_bootstrap,
        32,
        1,
        {
            "resources": [
                {"resource_type": 2, "resource_name": "kp-guarded", "configuration_keys": None}
            ]
        },
        login=("nobody", "pw"),
    )
    assert answer["results"][0]["error_code"] == TOPIC_AUTHORIZATION_FAILED


def test_retention_altered_drops_old_segments(
    broker: RunningBroker, admin: KafkaAdminClient
) -> None:
    mib = 1024 * 1024
    admin.create_topics([NewTopic("kp-retained", 1, 1, topic_configs={"segment.bytes": str(mib)})])
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap, linger_ms=5)
    for n in range(200):  # ~6 MB in segments of 1 MiB
        producer.send("kp-retained", value=b"%04d" % n + b"." * 30_000)
    producer.flush()
    producer.close()
    tp = TopicPartition("kp-retained", 0)
    consumer = KafkaConsumer(bootstrap_servers=broker.kafka_bootstrap)
    try:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        change = KpResource(
            ConfigResourceType.TOPIC, "kp-retained", configs={"retention.bytes": str(2 * mib)}
        )
        assert admin.alter_configs([change]) == {"topic": {"kp-retained": "OK"}}

        def trimmed() -> int:
            """the stream's retention to drop the oldest segments"""
            return consumer.beginning_offsets([tp])[tp]

        start = eventually(trimmed, interval=0.1)
        assert 0 < start < 150
    finally:
        consumer.close()


def _confluent(broker: RunningBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.kafka_bootstrap})


def _error_code(future: Any) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=30)
    code: int = raised.value.args[0].code()
    return code


def test_confluent_kafka_admin_client(broker: RunningBroker) -> None:
    admin = _confluent(broker)
    configs = {"cleanup.policy": "compact", "max.message.bytes": "65536"}
    made = admin.create_topics([ConfluentTopic("ck-admin", 2, 1, config=configs)])
    made["ck-admin"].result(timeout=30)
    arguments = http_topic(broker, "ck-admin").json()["arguments"]
    assert arguments["x-stream-cleanup-policy"] == "compact"
    assert arguments["x-stream-max-message-bytes"] == 65536
    again = admin.create_topics([ConfluentTopic("ck-admin", 2, 1)])
    assert _error_code(again["ck-admin"]) == KafkaError.TOPIC_ALREADY_EXISTS
    bad = admin.create_topics([ConfluentTopic("ck-bad", 1, 1, config={"retention.msx": "1"})])
    assert _error_code(bad["ck-bad"]) == KafkaError.INVALID_CONFIG
    grown = admin.create_partitions([NewPartitions("ck-admin", 4)])
    grown["ck-admin"].result(timeout=30)
    assert len(http_topic(broker, "ck-admin").json()["partitions"]) == 4
    resource = ConfigResource(ResourceType.TOPIC, "ck-admin")
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    assert entries["cleanup.policy"].value == "compact"
    assert not entries["cleanup.policy"].is_default
    assert entries["retention.ms"].value == "-1"
    assert entries["retention.ms"].is_default
    alter = ConfigResource(
        ResourceType.TOPIC,
        "ck-admin",
        incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
            ConfigEntry("retention.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([alter])[alter].result(timeout=30)
    arguments = http_topic(broker, "ck-admin").json()["arguments"]
    assert arguments["x-stream-cleanup-policy"] == "compact,delete"
    assert arguments["x-max-length-bytes"] == 1048576
    # ConfigAdminManager: APPEND only to a list config
    refused = ConfigResource(
        ResourceType.TOPIC,
        "ck-admin",
        incremental_configs=[
            ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.APPEND)
        ],
    )
    assert _error_code(admin.incremental_alter_configs([refused])[refused]) == INVALID_CONFIG
    gone = admin.delete_topics(["ck-admin"])
    gone["ck-admin"].result(timeout=30)
    assert http_topic(broker, "ck-admin").status_code == 404


def test_groups_are_listed_and_described(broker: RunningBroker) -> None:
    admin = _confluent(broker)
    admin.create_topics([ConfluentTopic("ck-grouped", 1, 1)])["ck-grouped"].result(timeout=30)
    group = f"ck-group-{uuid.uuid4().hex[:6]}"
    consumer = Consumer(
        {
            "bootstrap.servers": broker.kafka_bootstrap,
            "group.id": group,
            "client.id": "ck-member",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["ck-grouped"])

        def stable() -> Any:
            """the member to join and the group to be Stable"""
            consumer.poll(0.2)
            found = admin.describe_consumer_groups([group])[group].result(timeout=30)
            return found if str(found.state).endswith("STABLE") else None

        described = eventually(stable, interval=0.1)
        assert [m.client_id for m in described.members] == ["ck-member"]
        assert described.members[0].assignment.topic_partitions[0].topic == "ck-grouped"
        listed = admin.list_consumer_groups().result(timeout=30)
        assert group in {g.group_id for g in listed.valid}
        kp = KafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap)
        try:
            assert group in {g["group_id"] for g in kp.list_groups()}
            found = kp.describe_groups([group])[group]
            assert found["group_state"] == "Stable"
            assert found["protocol_type"] == "consumer"
            assert kp.describe_groups(["ck-nobody"])["ck-nobody"]["group_state"] == "Dead"
        finally:
            kp.close()
    finally:
        consumer.close()


def test_describing_a_group_needs_read(broker: RunningBroker) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.kafka_bootstrap)
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as http:
        assert http.put("/topics/kp-offsets", json={"partitions": 1}).status_code == 201
    producer.send("kp-offsets", value=b"x").get(10)
    producer.close()
    consumer = KafkaConsumer(
        "kp-offsets",
        bootstrap_servers=broker.kafka_bootstrap,
        group_id="kp-committed",
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    try:
        assert next(iter(consumer)).value == b"x"
        consumer.commit()
    finally:
        consumer.close()
    answer = call(
        broker.kafka_bootstrap, 15, 3, {"groups": ["kp-committed"]}, login=("nobody", "pw")
    )
    assert answer["groups"][0]["error_code"] == GROUP_AUTHORIZATION_FAILED
    listed = call(broker.kafka_bootstrap, 16, 2, {}, login=("nobody", "pw"))
    assert "kp-committed" not in {g["group_id"] for g in listed["groups"]}
    answer = call(
        broker.kafka_bootstrap, 15, 3, {"groups": ["kp-committed"]}, login=("reader", "pw")
    )
    assert (answer["groups"][0]["error_code"], answer["groups"][0]["group_state"]) == (0, "Empty")


def test_aiokafka_admin_client(broker: RunningBroker) -> None:
    """aiokafka's ``AIOKafkaAdminClient``: create, list, grow, describe the configs of and
    delete a topic, and list and describe groups (it has no IncrementalAlterConfigs: its
    ``alter_configs`` sends AlterConfigs, 33, which is not served)."""
    import asyncio

    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AkPartitions
    from aiokafka.admin import NewTopic as AkTopic
    from aiokafka.admin.config_resource import ConfigResource as AkResource
    from aiokafka.admin.config_resource import ConfigResourceType as AkResourceType

    name = f"ak-admin-{uuid.uuid4().hex[:8]}"

    async def main() -> tuple[Any, ...]:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.kafka_bootstrap)
        await admin.start()
        try:
            configs = {"retention.ms": "3600000", "cleanup.policy": "compact"}
            await admin.create_topics([AkTopic(name, 2, 1, topic_configs=configs)])
            listed = await admin.list_topics()
            await admin.create_partitions({name: AkPartitions(4)})
            described = await admin.describe_configs([AkResource(AkResourceType.TOPIC, name)])
            groups = await admin.list_consumer_groups()
            await admin.delete_topics([name])
            after = await admin.list_topics()
            return listed, described, groups, after
        finally:
            await admin.close()

    listed, described, _groups, after = asyncio.run(main())
    assert name in listed
    assert name not in after
    ((_code, _message, _type, resource_name, entries),) = described[0].resources
    assert resource_name == name
    values = {entry[0]: entry[1] for entry in entries}
    assert values["retention.ms"] == "3600000"
    assert values["cleanup.policy"] == "compact"
    assert http_topic(broker, name).status_code == 404
