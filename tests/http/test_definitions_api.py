"""``/api/definitions[/{vhost}]`` without a RabbitMQ: a RabbitMQ 3.10 export (checked in,
captured from the real one) imports and exports back; RabbitMQ's status codes and error shape;
the import is durable when answered; the real ``rabbitmqadmin`` exports and imports;
``--definitions FILE`` imports at boot and refuses a file that contradicts the broker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest

from tests.support.brokers import MakeBroker
from tqbroker.broker.definitions_file import DEFINITIONS_FILE
from tqbroker.config import PermissionConfig, UserConfig
from tqbroker.storage_env import StorageEnv
from tqbroker.testing import RunningBroker, start_broker_process

DATA = Path(__file__).parent.parent / "data"
EXPORT = DATA / "rabbitmq-3.10-definitions.json"
ADMIN = "/usr/bin/rabbitmqadmin"
JSON = {"content-type": "application/json"}


def topology(document: dict[str, Any], vhost: str = "/") -> dict[str, list[str]]:
    """Queues, exchanges, bindings of ``vhost``, comparable (tqbroker's extras left out)."""

    def key(entry: dict[str, Any]) -> str:
        kept = {k: v for k, v in entry.items() if k not in ("vhost", "tqbroker")}
        return json.dumps(kept, sort_keys=True)

    return {
        section: sorted(key(e) for e in document[section] if e.get("vhost", vhost) == vhost)
        for section in ("queues", "exchanges", "bindings")
    }


@pytest.fixture
def broker(make_broker: MakeBroker, tmp_path: Path) -> RunningBroker:
    users = (
        UserConfig(
            "guest", "guest", tags=("administrator",), permissions={"/": PermissionConfig()}
        ),
        UserConfig("shopper", "pw", tags=("management",), permissions={"/": PermissionConfig()}),
    )
    return make_broker(data_dir=tmp_path / "data", users=users)


def client(broker: RunningBroker, user: str = "guest", password: str = "guest") -> httpx.Client:
    return httpx.Client(base_url=broker.http_url, auth=(user, password), timeout=30)


def test_a_rabbitmq_export_imports_routes_and_exports_back(
    broker: RunningBroker, tmp_path: Path
) -> None:
    api = client(broker)
    answer = api.post("/api/definitions", content=EXPORT.read_bytes(), headers=JSON)
    assert answer.status_code == 204, answer.text
    skipped = answer.headers["x-definitions-skipped"]
    assert "users" not in skipped  # imported, not skipped
    assert "permissions" not in skipped
    # Durable when answered: the file has it already.
    stored = json.loads((tmp_path / "data" / "definitions.json").read_text())
    assert {q["name"] for q in stored["queues"]} >= {"orders.eu", "events", "lost"}
    exported = api.get("/api/definitions").json()
    assert topology(exported) == topology(json.loads(EXPORT.read_text()))
    original = json.loads(EXPORT.read_text())
    # RabbitMQ's users and permissions came in as they were (its guest's hash of "guest"),
    # beside the broker's own (shopper).
    assert [u for u in exported["users"] if u["name"] == "guest"] == original["users"]
    assert original["permissions"][0] in exported["permissions"]
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    channel = connection.channel()
    refund = pika.BasicProperties(headers={"kind": "refund"})
    channel.basic_publish("orders", "refund", b"audited", refund)  # orders -> audit -> lost
    channel.basic_publish("orders", "eu.fr", b"eu")
    assert channel.basic_get("lost", auto_ack=True)[2] == b"audited"
    assert channel.basic_get("orders.eu", auto_ack=True)[2] == b"eu"
    connection.close()
    # Importing it again changes nothing.
    assert (
        api.post("/api/definitions", content=EXPORT.read_bytes(), headers=JSON).status_code == 204
    )
    assert topology(api.get("/api/definitions").json()) == topology(exported)


def test_an_import_is_answered_once_durable(
    broker: RunningBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """204 after the definitions file holds the import (a slow disk: the answer waits); 500
    when it cannot be written."""
    real = StorageEnv.atomic_write

    def slow_write(env: StorageEnv, path: Path, data: bytes, *, fsync: bool = True) -> None:
        if path.name == DEFINITIONS_FILE:
            time.sleep(0.5)
        real(env, path, data, fsync=fsync)

    monkeypatch.setattr(StorageEnv, "atomic_write", slow_write)
    api = client(broker)
    document = {"queues": [{"name": "kept", "vhost": "/", "durable": True, "arguments": {}}]}
    assert api.post("/api/definitions", json=document).status_code == 204
    stored = json.loads((tmp_path / "data" / "definitions.json").read_text())
    assert [q["name"] for q in stored["queues"]] == ["kept"]

    def full_disk(env: StorageEnv, path: Path, data: bytes, *, fsync: bool = True) -> None:
        if path.name == DEFINITIONS_FILE:
            raise OSError(28, "No space left on device")
        real(env, path, data, fsync=fsync)

    monkeypatch.setattr(StorageEnv, "atomic_write", full_disk)
    document["queues"][0]["name"] = "unstored"
    failed = api.post("/api/definitions", json=document)
    assert failed.status_code == 500
    assert "could not be stored" in failed.json()["reason"]


def test_errors_have_rabbitmqs_status_and_shape(broker: RunningBroker) -> None:
    api = client(broker)
    bad = api.post("/api/definitions", content=b"{", headers=JSON)
    assert bad.status_code == 400
    assert bad.json()["error"] == "bad_request"
    assert bad.json()["reason"].startswith("failed_to_parse_json")
    # Checked before anything is created: the queue before the bad exchange is not made.
    document = {
        "queues": [{"name": "first", "vhost": "/", "durable": True, "arguments": {}}],
        "exchanges": [{"name": "x", "vhost": "/", "type": "x-nope", "durable": True}],
    }
    refused = api.post("/api/definitions", json=document)
    assert refused.status_code == 400
    assert "exchange 'x' in vhost '/': unknown exchange type 'x-nope'" in refused.json()["reason"]
    invalid = {"queues": [{"name": "q", "arguments": {"x-max-length": "five"}}]}
    refused = api.post("/api/definitions", json=invalid)
    assert refused.status_code == 400
    assert "invalid arg 'x-max-length'" in refused.json()["reason"]
    assert api.get("/api/definitions").json()["queues"] == []
    assert api.get("/api/definitions/nowhere").json() == {
        "error": "bad_request",
        "reason": "vhost_not_found",
    }
    missing = api.post("/api/definitions/nowhere", json={})
    assert (missing.status_code, missing.json()["reason"]) == (404, "vhost_not_found")
    assert (
        api.post(
            "/api/definitions", content=b"{}", headers={"content-type": "text/plain"}
        ).status_code
        == 415
    )
    assert httpx.get(broker.http_url + "/api/definitions").status_code == 401
    # A management user is no administrator, even for its own vhost (as RabbitMQ's).
    shopper = client(broker, "shopper", "pw")
    for path in ("/api/definitions", "/api/definitions/%2F"):
        for denied in (shopper.get(path), shopper.post(path, json={})):
            assert denied.status_code == 401
            assert denied.json() == {"error": "not_authorised", "reason": "Not administrator user"}


def test_an_existing_queue_that_differs_is_kept_as_rabbitmq_does(broker: RunningBroker) -> None:
    api = client(broker)
    first = {
        "queues": [{"name": "q", "vhost": "/", "durable": True, "arguments": {"x-max-length": 5}}]
    }
    assert api.post("/api/definitions", json=first).status_code == 204
    second = {
        "queues": [{"name": "q", "vhost": "/", "durable": True, "arguments": {"x-max-length": 9}}]
    }
    answer = api.post("/api/definitions", json=second)
    assert answer.status_code == 204
    assert "queue 'q' in vhost '/': kept as it is" in answer.headers["x-definitions-skipped"]
    (queue,) = api.get("/api/definitions").json()["queues"]
    assert queue["arguments"] == {"x-max-length": 5}
    # An exclusive queue of a connection: its name is taken, its bindings are the owner's.
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    connection.channel().queue_declare("mine", exclusive=True)
    binding = {"source": "amq.fanout", "vhost": "/", "destination": "mine"}
    answer = api.post(
        "/api/definitions", json={"queues": [{"name": "mine"}], "bindings": [binding]}
    )
    connection.close()
    assert answer.status_code == 204
    skipped = answer.headers["x-definitions-skipped"]
    assert "queue 'mine' in vhost '/': kept as it is" in skipped
    assert "binding of queue 'mine' to exchange 'amq.fanout'" in skipped


def test_a_vhost_import_and_the_download_name(broker: RunningBroker) -> None:
    """A vhost's import puts every entry there (whatever vhost it names), as RabbitMQ's; a
    multipart form is refused (a page on another site could send one: ``cross_site.py``);
    ``?download=`` names the attachment."""
    api = client(broker)
    entry = {"name": "via-vhost", "vhost": "elsewhere", "durable": True, "arguments": {}}
    form = api.post(
        "/api/definitions/%2F",
        files={"file": ("defs.json", json.dumps({"queues": [entry]}).encode())},
        data={"redirect": "../../#/"},
    )
    assert form.status_code == 415
    assert api.post("/api/definitions/%2F", json={"queues": [entry]}).status_code == 204
    (queue,) = api.get("/api/definitions/%2F").json()["queues"]
    assert queue["name"] == "via-vhost"
    assert "vhost" not in queue
    download = api.get("/api/definitions?download=backup.json")
    assert download.headers["content-disposition"] == "attachment; filename=backup.json"


@pytest.mark.skipif(
    not Path(ADMIN).exists(), reason="rabbitmqadmin is absent (Debian package rabbitmq-server)"
)
def test_rabbitmqadmin_exports_and_imports(broker: RunningBroker, tmp_path: Path) -> None:
    assert broker.http_port is not None
    admin = [sys.executable, ADMIN, "-H", "127.0.0.1", "-P", str(broker.http_port)]
    admin += ["-u", "guest", "-p", "guest"]
    imported = subprocess.run(
        [*admin, "import", str(EXPORT)], capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    assert "Uploaded definitions" in imported.stdout
    target = tmp_path / "exported.json"
    exported = subprocess.run(
        [*admin, "export", str(target)], capture_output=True, text=True, timeout=60
    )
    assert exported.returncode == 0, exported.stderr
    assert topology(json.loads(target.read_text())) == topology(json.loads(EXPORT.read_text()))
    vhost_file = tmp_path / "vhost.json"
    per_vhost = subprocess.run(
        [*admin, "-V", "/", "export", str(vhost_file)], capture_output=True, text=True, timeout=60
    )
    assert per_vhost.returncode == 0, per_vhost.stderr
    assert "vhosts" not in json.loads(vhost_file.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text('{"exchanges": [{"name": "x", "vhost": "/", "type": "x-nope"}]}')
    refused = subprocess.run(
        [*admin, "import", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0
    assert "unknown exchange type 'x-nope'" in refused.stderr  # the reason, as RabbitMQ's


# -- load_definitions at boot -----------------------------------------------------------------


def test_definitions_flag_imports_at_boot(tmp_path: Path) -> None:
    with start_broker_process(
        tmp_path / "data", extra_args=["--definitions", str(EXPORT)]
    ) as process:
        connection = pika.BlockingConnection(pika.URLParameters(process.url))
        channel = connection.channel()
        for queue in ("orders.eu", "events", "lost", "prioritised"):
            channel.queue_declare(queue, passive=True)
        connection.close()
    # And again on a broker that has it all already: equal definitions are fine.
    with start_broker_process(tmp_path / "data", extra_args=["--definitions", str(EXPORT)]):
        pass


def boot_error(tmp_path: Path, definitions: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tqbroker", "--port", "0", "--http-port", "-1"]
    command += ["--metrics-port", "-1", "--data-dir", str(tmp_path / "data")]
    command += ["--definitions", str(definitions)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_definitions_file_that_contradicts_the_broker_stops_the_boot(tmp_path: Path) -> None:
    with start_broker_process(tmp_path / "data") as process:
        connection = pika.BlockingConnection(pika.URLParameters(process.url))
        connection.channel().queue_declare("orders.eu", durable=True)
        connection.close()
    result = boot_error(tmp_path, EXPORT)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("tqbroker: cannot start: load_definitions: ")
    assert "queue 'orders.eu' in vhost '/'" in line
    assert "Traceback" not in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    result = boot_error(tmp_path, broken)
    assert result.returncode == 1
    assert "Expecting property name" in result.stderr.strip().splitlines()[-1]
    result = boot_error(tmp_path, tmp_path / "absent.json")
    assert result.returncode == 1
    assert "cannot read" in result.stderr
    assert "No such file" in result.stderr


def test_a_long_export_is_streamed_whole(broker: RunningBroker) -> None:
    """250 queues and bindings: encoded a slice at a time, the answer is one JSON document."""
    api = client(broker)
    queues = [{"name": f"q{n}", "vhost": "/", "arguments": {"x-max-length": n}} for n in range(250)]
    exchanges = [{"name": "fan", "vhost": "/", "type": "fanout"}]
    bindings = [
        {"source": "fan", "vhost": "/", "destination": f"q{n}", "destination_type": "queue"}
        for n in range(250)
    ]
    document = {"queues": queues, "exchanges": exchanges, "bindings": bindings}
    assert api.post("/api/definitions", json=document).status_code == 204
    exported = api.get("/api/definitions").json()
    assert [q["arguments"]["x-max-length"] for q in exported["queues"]] == list(range(250))
    assert len(exported["bindings"]) == 250
    assert exported["policies"] == []
