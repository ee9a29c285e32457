"""The definitions file is RabbitMQ's definitions JSON (``broker/definitions_json.py``): the
mapping between the broker's stored topology and the document round-trips whatever the
topology; a ``definitions.cbor`` written by tqbroker 0.1.0 is migrated at start (removed only
once the JSON is durable); a broken file is a one-line refusal to start."""

from __future__ import annotations

import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import cbor2
import pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tqbroker import BrokerConfig
from tqbroker.broker import definitions_file
from tqbroker.broker.definitions_json import (
    DefinitionsError,
    from_stored,
    parse_document,
    to_stored,
)
from tqbroker.storage_env import StorageEnv
from tqbroker.testing import running_broker

DATA = Path(__file__).parent.parent / "data"

names = st.text(st.characters(codec="utf-8"), max_size=12)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    names,
    st.binary(max_size=8),
    st.decimals(
        allow_nan=False, allow_infinity=False, places=2, max_value=10**6, min_value=-(10**6)
    ),
    st.datetimes(min_value=datetime.datetime(1970, 1, 1), timezones=st.just(datetime.UTC)).map(
        lambda moment: moment.replace(microsecond=0)
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=6,
)
tables = st.dictionaries(names, values, max_size=4)
queues = st.fixed_dictionaries(
    {
        "name": names,
        "backend": st.sampled_from(["log", "memory", "rocksdb"]),
        "auto_delete": st.booleans(),
        "arguments": tables,
    }
)
exchanges = st.fixed_dictionaries(
    {
        "name": names,
        "type": st.sampled_from(["direct", "topic", "x-reverse"]),
        "auto_delete": st.booleans(),
        "internal": st.booleans(),
        "arguments": tables,
        "type_distribution": st.none() | st.just("reverse-exchange 1.0"),
    },
    optional={"store_backend": st.sampled_from(["log", "rocksdb"])},
)
bindings = st.fixed_dictionaries(
    {
        "source": names,
        "destination": names,
        "destination_type": st.sampled_from(["queue", "exchange"]),
        "routing_key": names,
        "arguments": tables,
    }
)
topologies = st.dictionaries(
    names,
    st.fixed_dictionaries(
        {
            "exchanges": st.lists(exchanges, max_size=3),
            "queues": st.lists(queues, max_size=3),
            "bindings": st.lists(bindings, max_size=3),
        }
    ),
    min_size=1,
    max_size=3,
).map(lambda per_vhost: {"vhosts": list(per_vhost), "definitions": per_vhost})


@settings(max_examples=60, deadline=None)
@given(topologies)
def test_the_schema_mapping_round_trips_any_topology(stored: dict[str, Any]) -> None:
    """Stored topology -> RabbitMQ's JSON text -> stored topology is the identity (argument
    values JSON lacks included: a binding's identity is its arguments)."""
    text = json.dumps(from_stored(stored, "9.9"))
    document = json.loads(text)
    assert set(document) >= {
        "rabbit_version",
        "rabbitmq_version",
        "product_name",
        "product_version",
        "users",
        "vhosts",
        "permissions",
        "topic_permissions",
        "parameters",
        "global_parameters",
        "policies",
        "queues",
        "exchanges",
        "bindings",
    }
    assert to_stored(parse_document(document)) == stored


def test_a_rabbitmq_export_reads_as_the_stored_form() -> None:
    document = parse_document(json.loads((DATA / "rabbitmq-3.10-definitions.json").read_text()))
    stored = to_stored(document)
    assert "users" not in document.unmodelled
    assert document.auth["users"][0]["name"] == "guest"
    root = stored["definitions"]["/"]
    queue = next(q for q in root["queues"] if q["name"] == "orders.eu")
    assert queue["backend"] is None  # RabbitMQ's file names none: the broker chooses
    assert queue["arguments"]["x-max-length"] == 1000
    assert not any(q["name"] == "transient" for q in root["queues"])  # not durable


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ([], "a JSON object"),
        ({"queues": {}}, "'queues' must be a list"),
        ({"queues": [{"vhost": "/"}]}, "queues[0]: 'name' must be a string"),
        ({"queues": [{"name": "q", "durable": "yes"}]}, "'durable' must be true or false"),
        ({"exchanges": [{"name": "x"}]}, "exchanges[0]: 'type' must be a string"),
        (
            {"bindings": [{"source": "x", "destination": "q", "destination_type": "topic"}]},
            "queue or exchange",
        ),
        ({"queues": [{"name": "q", "arguments": {"n": 2**64}}]}, "64-bit"),
        ({"queues": [{"name": "q", "arguments": []}]}, "'arguments' must be an object"),
        ({"users": {}}, "'users' must be a list"),
    ],
)
def test_a_bad_document_names_what_is_wrong(document: object, says: str) -> None:
    with pytest.raises(DefinitionsError, match=None) as raised:
        parse_document(document)
    assert says in str(raised.value)


# -- the file at start ------------------------------------------------------------------------


def config(data_dir: Path, **options: Any) -> BrokerConfig:
    return BrokerConfig(port=0, http_port=None, data_dir=data_dir, **options)


def check_topology(url: str) -> None:
    """What tests/data/definitions-0.1.0.cbor holds, in each of its vhosts, routes as before."""
    for vhost in ("", "billing"):
        connection = pika.BlockingConnection(pika.URLParameters(url + vhost))
        channel = connection.channel()
        for queue in ("orders.eu", "in-memory", "events", "lost"):
            channel.queue_declare(queue, passive=True)
        channel.basic_publish("orders", "eu.de", b"routed")
        refund = pika.BasicProperties(headers={"kind": "refund"})
        channel.basic_publish("orders", "refund", b"audited", refund)
        _m, _p, body = channel.basic_get("orders.eu", auto_ack=True)
        assert body == b"routed"
        _m, _p, body = channel.basic_get("lost", auto_ack=True)
        assert body == b"audited"  # orders -> audit (exchange to exchange) -> lost (headers)
        connection.close()


def test_a_cbor_file_of_0_1_0_is_migrated(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(DATA / "definitions-0.1.0.cbor", data_dir / "definitions.cbor")
    with running_broker(config(data_dir)) as broker:
        assert not (data_dir / "definitions.cbor").exists()
        check_topology(broker.url)
    document = json.loads((data_dir / "definitions.json").read_text())
    assert document["product_name"] == "tqbroker"
    assert [v["name"] for v in document["vhosts"]] == ["/", "billing"]
    memory = [q for q in document["queues"] if q["name"] == "in-memory"]
    assert [q["tqbroker"] for q in memory] == [{"backend": "memory"}] * 2
    with running_broker(config(data_dir)) as broker:  # and it reads back
        check_topology(broker.url)
    # Entry for entry what the CBOR held (built-in exchange types name no distribution now).
    legacy = cbor2.loads((DATA / "definitions-0.1.0.cbor").read_bytes())
    for defs in legacy["definitions"].values():
        for exchange in defs["exchanges"]:
            exchange["type_distribution"] = None
    loaded = definitions_file.DefinitionsFile(data_dir, bytes).load()
    assert loaded == {**legacy, "parameters": [], "vhost_metadata": {}}  # (none in 0.1.0)


def test_the_cbor_file_stays_until_the_json_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(DATA / "definitions-0.1.0.cbor", data_dir / "definitions.cbor")

    real = StorageEnv.atomic_write

    def full_disk(env: StorageEnv, path: Path, data: bytes, *, fsync: bool = True) -> None:
        if path.name == definitions_file.DEFINITIONS_FILE:
            raise OSError(28, "No space left on device")
        real(env, path, data, fsync=fsync)

    monkeypatch.setattr(StorageEnv, "atomic_write", full_disk)
    with running_broker(config(data_dir)) as broker:
        check_topology(broker.url)
    assert (data_dir / "definitions.cbor").read_bytes() == (
        DATA / "definitions-0.1.0.cbor"
    ).read_bytes()
    assert not (data_dir / "definitions.json").exists()


def start_cli(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "-1"]
    command += ["--metrics-port", "-1", "--data-dir", str(data_dir), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_broken_definitions_file_stops_the_start_in_one_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "definitions.json").write_text('{"queues": [{"name": "q", "durable": "yes"}]}')
    result = start_cli(data_dir)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("tqbroker: cannot start: ")
    assert "queues[0]: 'durable' must be true or false" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_rabbitmq_export_serves_as_the_definitions_file(tmp_path: Path) -> None:
    """The same schema: RabbitMQ's export put in place of the file starts a broker with its
    durable topology, each queue on the backend a declare would choose (the file names none)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(DATA / "rabbitmq-3.10-definitions.json", data_dir / "definitions.json")
    with running_broker(config(data_dir, durable_backend="log")) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        for queue in ("orders.eu", "prioritised", "lost", "events", "short-lived"):
            channel.queue_declare(queue, passive=True)
        channel.basic_publish("orders", "eu.fr", b"eu")
        assert channel.basic_get("orders.eu", auto_ack=True)[2] == b"eu"
        connection.close()
    written = json.loads((data_dir / "definitions.json").read_text())
    backends = {q["name"]: q["tqbroker"]["backend"] for q in written["queues"]}
    assert backends == dict.fromkeys(
        ["orders.eu", "prioritised", "lost", "events", "short-lived"], "log"
    )
