"""Users and permissions are the cluster's (``cluster/catalog.py``): made with the management API
on one node of a real three-node cluster, a user logs in on every node with the permissions it
was given there; deleted on another node, it is refused everywhere (RabbitMQ's ``ACCESS_REFUSED``
on login, as for any unknown user)."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import pika
import pika.exceptions
import pytest

from tests.support.cluster_nodes import POLL, three_nodes
from tests.support.cluster_topic import SETTLE
from tests.support.etcd import EtcdProcess
from tests.support.polling import eventually
from tqbroker.testing import BrokerProcess

pytestmark = pytest.mark.timeout(180)


def api(process: BrokerProcess) -> httpx.Client:
    return httpx.Client(base_url=process.http_url, auth=("guest", "guest"), timeout=30)


def logs_in(process: BrokerProcess, user: str, password: str, *, admitted: bool = True) -> bool:
    """Whether ``user`` can open a connection to ``process`` and declare a queue on ``/`` (or,
    ``admitted=False``: whether it is refused)."""
    credentials = pika.PlainCredentials(user, password)
    parameters = pika.ConnectionParameters(process.host, process.port, "/", credentials)
    try:
        connection = pika.BlockingConnection(parameters)
    except pika.exceptions.ProbableAuthenticationError:
        return not admitted
    except pika.exceptions.ProbableAccessDeniedError:  # the user is here, not yet its grant
        return False
    try:
        connection.channel().queue_declare("", exclusive=True)  # configure permission on "/"
        return admitted
    finally:
        connection.close()


def test_a_user_made_on_one_node_logs_in_on_every_node_until_deleted_on_another(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    with three_nodes(tmp_path, etcd) as nodes:
        processes = [nodes.running[f"n{n}"] for n in range(3)]
        with api(processes[0]) as first:
            made = first.put("/api/users/alice", json={"password": "s3cret", "tags": ""})
            assert made.status_code == 201, made.text
            granted = first.put(
                "/api/permissions/%2F/alice",
                json={"configure": ".*", "write": ".*", "read": ".*"},
            )
            assert granted.status_code == 201, granted.text
        for process in processes:
            admitted = functools.partial(logs_in, process, "alice", "s3cret")
            eventually(admitted, SETTLE, POLL, what=f"alice on {process.host}")
        with api(processes[2]) as third:
            assert third.get("/api/permissions/%2F/alice").json()["configure"] == ".*"
            assert third.delete("/api/users/alice").status_code == 204
        for process in processes:
            refused = functools.partial(logs_in, process, "alice", "s3cret", admitted=False)
            eventually(refused, SETTLE, POLL, what=f"alice refused on {process.host}")
