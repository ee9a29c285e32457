"""Logs an operator can use (issue 15 item 7), read from a real broker process: JSON lines in a
file with the connection's life (accepted, authenticated, closing with its duration), a refused
login naming the user and the reason but never the password, the HTTP access log when asked
for; the log file follows logrotate's rename, or rotates itself with ``log_max_bytes``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pika
import pytest

from tests.support.polling import file_containing
from tqbroker.testing import BrokerProcess, start_broker_process

PASSWORD = "hunter2-not-logged"


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No stray TQBROKER_<KEY> setting from the environment running the tests."""
    for name in [name for name in os.environ if name.startswith("TQBROKER_")]:
        if name != "TQBROKER_TEST_DURABLE_BACKEND":
            monkeypatch.delenv(name)


def broker(tmp_path: Path, *flags: str) -> BrokerProcess:
    return start_broker_process(
        tmp_path / "data", extra_args=flags, stderr=subprocess.PIPE, log_level="info"
    )


def test_json_lines_of_a_connection_a_refused_login_and_http_requests(
    tmp_path: Path, clean_environment: None
) -> None:
    log = tmp_path / "broker.log"
    flags = ("--log-format", "json", "--log-file", str(log), "--http-access-log")
    with broker(tmp_path, *flags) as running:
        params = pika.URLParameters(running.url)
        params.client_properties = {"connection_name": "billing-worker"}
        pika.BlockingConnection(params).close()
        refused = pika.ConnectionParameters(
            running.host, running.port, credentials=pika.PlainCredentials("bob", PASSWORD)
        )
        with pytest.raises(pika.exceptions.ProbableAuthenticationError):
            pika.BlockingConnection(refused)
        assert httpx.get(f"{running.http_url}/health", timeout=10).status_code == 200
        file_containing(log, '"GET /health')
        assert running.stop() == 0
    lines = records(log)
    assert PASSWORD not in log.read_text()
    by_message = {line["message"]: line for line in lines}
    local = f"{running.host}:{running.port}"

    authenticated = next(
        line for line in lines if "authenticated and granted access" in line["message"]
    )
    peer = authenticated["peer"]
    assert authenticated["message"].startswith(
        f"connection {peer} -> {local} - billing-worker: user 'guest' authenticated and "
        "granted access to vhost '/' (client: Pika Python Client Library "
    )
    assert authenticated["level"] == "INFO"
    assert authenticated["user"] == "guest"
    assert authenticated["vhost"] == "/"
    assert authenticated["connection_name"] == "billing-worker"
    assert authenticated["client_product"] == "Pika Python Client Library"
    assert authenticated["time"]
    assert f"accepting AMQP connection {peer} -> {local}" in by_message
    closing = next(line for line in lines if line["message"].startswith("closing AMQP connection"))
    assert closing["message"].startswith(
        f"closing AMQP connection {peer} -> {local} - billing-worker, vhost: '/', "
        "user: 'guest', duration: "
    )
    assert 0 <= closing["duration_s"] < 30

    refusal = next(line for line in lines if "login refused" in line["message"])
    assert refusal["message"].endswith("PLAIN login refused: user 'bob' - invalid credentials")
    assert refusal["level"] == "WARNING"
    assert refusal["user"] == "bob"
    assert refusal["reason"] == "invalid credentials"

    access = [line for line in lines if line["logger"] == "tqbroker.http.access"]
    assert len(access) == 1  # one line per request
    assert '"GET /health 1.1" 200 ' in access[0]["message"]
    assert (access[0]["method"], access[0]["path"], access[0]["status"]) == ("GET", "/health", 200)
    assert access[0]["peer"].startswith("127.0.0.1:")


def test_text_lines_on_stderr_by_default_and_no_access_log(
    tmp_path: Path, clean_environment: None
) -> None:
    stderr = tmp_path / "stderr.txt"
    with start_broker_process(tmp_path / "data", stderr=stderr, log_level="info") as running:
        pika.BlockingConnection(pika.URLParameters(running.url)).close()
        assert httpx.get(f"{running.http_url}/health", timeout=10).status_code == 200
        content = file_containing(stderr, "closing AMQP connection")
        assert running.stop() == 0
    assert " INFO tqbroker.server.handshake: accepting AMQP connection " in content
    assert "user 'guest' authenticated and granted access to vhost '/'" in content
    assert "/health" not in stderr.read_text()  # the access log is off by default


def test_logrotate_renames_the_file_and_the_broker_follows(
    tmp_path: Path, clean_environment: None
) -> None:
    log = tmp_path / "broker.log"
    with broker(tmp_path, "--log-file", str(log)) as running:
        pika.BlockingConnection(pika.URLParameters(running.url)).close()
        file_containing(log, "closing AMQP connection")
        log.rename(tmp_path / "broker.log.1")  # what logrotate does (no copytruncate)
        running.proc.send_signal(signal.SIGHUP)  # a postrotate habit: it must not stop it
        assert "received SIGHUP: log file reopened" in file_containing(log, "SIGHUP")
        pika.BlockingConnection(pika.URLParameters(running.url)).close()
        content = file_containing(log, "closing AMQP connection")
        assert running.stop() == 0
    assert "authenticated and granted access to vhost '/'" in content
    assert " INFO tqbroker.server.handshake: accepting AMQP connection " in content
    assert "closing AMQP connection" in (tmp_path / "broker.log.1").read_text()


def test_the_broker_rotates_the_file_itself_with_log_max_bytes(
    tmp_path: Path, clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TQBROKER_LOG_MAX_BYTES", "1000")
    monkeypatch.setenv("TQBROKER_LOG_BACKUPS", "2")
    log = tmp_path / "broker.log"
    with broker(tmp_path, "--log-file", str(log)) as running:
        for _ in range(8):
            pika.BlockingConnection(pika.URLParameters(running.url)).close()
        file_containing(tmp_path / "broker.log.2", "AMQP connection")
        assert running.stop() == 0
    assert sorted(path.name for path in tmp_path.glob("broker.log*")) == [
        "broker.log",
        "broker.log.1",
        "broker.log.2",
    ]
    assert all(path.stat().st_size <= 1000 for path in tmp_path.glob("broker.log*"))
