"""The topic routes (JSON, columnar and administration) and the Spark data source's client
check RabbitMQ's permissions on what an AMQP client would touch: producing writes through the
topic's exchange (the default exchange, ``amq.default``, for a topic that is one stream queue),
reading, offsets and group offset resets read the partitions' queues, declaring, growing and
deleting configure the exchange and the queues."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import httpx
import pika
import pytest

from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write
from tqbroker.spark._client import BrokerError, Client
from tqbroker.spark._options import Connection
from tqbroker.testing import RunningBroker, running_broker

USERS = (
    UserConfig("guest", "guest", tags=("administrator",), permissions={"/": PermissionConfig()}),
    # bob may produce to topic t, read its partition 0 and nothing else
    UserConfig("bob", "pw", permissions={"/": PermissionConfig("", "^t$", "^t-0$")}),
    # eve may use the vhost and nothing in it
    UserConfig("eve", "pw", permissions={"/": PermissionConfig("", "", "")}),
)


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker(BrokerConfig(port=0, users=USERS)) as running:
        with httpx.Client(base_url=running.http_url, auth=("guest", "guest")) as guest:
            assert guest.put("/topics/t", json={"partitions": 2}).status_code == 201
        connection = pika.BlockingConnection(pika.URLParameters(running.url))
        connection.channel().queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
        connection.close()
        yield running


def _as(broker: RunningBroker, user: str) -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, auth=(user, "pw"), timeout=10)


def _refused(response: httpx.Response, kind: str, name: str, user: str) -> None:
    assert response.status_code == 403, response.text
    text = f"access to {kind} '{name}' in vhost '/' refused for user '{user}'"
    assert response.json() == {"error": "forbidden", "message": text}


def _body() -> bytes:
    return encode_write(
        WriteBatch(
            array("i", [0]),
            BinaryColumn.of([b"k"]),
            BinaryColumn.of([b"v"]),
            BinaryColumn.of([b""]),
        )
    )


def test_json_routes_allowed_and_refused(broker: RunningBroker) -> None:
    with _as(broker, "bob") as bob, _as(broker, "eve") as eve:
        assert bob.post("/topics/t/messages", json={"key": "a", "value": "1"}).status_code == 201
        _refused(eve.post("/topics/t/messages", json={"value": "1"}), "exchange", "t", "eve")
        # a topic that is one stream queue is produced to through the default exchange
        _refused(
            bob.post("/topics/s/messages", json={"value": "1"}), "exchange", "amq.default", "bob"
        )
        assert bob.get("/topics/t/messages", params={"partition": 0}).status_code == 200
        _refused(bob.get("/topics/t/messages", params={"partition": 1}), "queue", "t-1", "bob")
        _refused(bob.get("/topics/t/offsets"), "queue", "t-1", "bob")
        _refused(bob.put("/topics/u", json={"partitions": 1}), "exchange", "u", "bob")
        # a missing topic is still 404 (nothing to check)
        assert bob.get("/topics/nope/messages").status_code == 404


def test_columnar_routes_allowed_and_refused(broker: RunningBroker) -> None:
    with _as(broker, "bob") as bob, _as(broker, "eve") as eve:
        assert bob.post("/topics/t/records", content=_body()).status_code == 201
        _refused(eve.post("/topics/t/records", content=_body()), "exchange", "t", "eve")
        assert bob.get("/topics/t/partitions/0/records").status_code == 200
        _refused(bob.get("/topics/t/partitions/1/records"), "queue", "t-1", "bob")


def test_admin_routes_allowed_and_refused(broker: RunningBroker) -> None:
    """Deleting or growing a topic needs configure; resetting a group's offsets needs read;
    listing and describing need only the vhost."""
    with _as(broker, "bob") as bob:
        _refused(bob.delete("/topics/t"), "exchange", "t", "bob")
        _refused(bob.patch("/topics/t", json={"partitions": 3}), "exchange", "t", "bob")
        reset = {"to": "earliest", "dry_run": True}
        _refused(bob.post("/topics/t/groups/g/offsets", json=reset), "queue", "t-1", "bob")
        assert bob.get("/topics").status_code == 200
        assert bob.get("/topics/t").status_code == 200
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest")) as guest:
        reset = {"to": "earliest", "dry_run": True}
        assert guest.post("/topics/t/groups/g/offsets", json=reset).status_code == 200


def test_spark_client_gets_the_refusal(broker: RunningBroker) -> None:
    client = Client(Connection(broker.http_url, "eve", "pw"))
    try:
        with pytest.raises(BrokerError) as refused:
            client.produce("t", _body())
        assert refused.value.status == 403
        assert "access to exchange 't' in vhost '/' refused for user 'eve'" in str(refused.value)
        with pytest.raises(BrokerError) as refused:
            client.partitions("t")
        assert "access to queue 't-0' in vhost '/' refused for user 'eve'" in str(refused.value)
    finally:
        client.close()
