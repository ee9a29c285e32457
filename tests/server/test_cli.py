"""``python -m tqbroker`` as a user runs it: startup line, defaults, signals, graceful shutdown."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from tqbroker.testing import BrokerProcess, start_broker_process


def start(tmp_path: Path, *extra: str) -> BrokerProcess:
    """The broker in ``tmp_path`` with the CLI's defaults (data dir, log level) unless ``extra``
    flags say otherwise."""
    return start_broker_process(
        None, cwd=tmp_path, extra_args=extra, stderr=subprocess.PIPE, log_level=None
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_starts_with_defaults_and_exits_zero_on_signal(tmp_path: Path, signum: int) -> None:
    with start(tmp_path) as broker:
        assert (tmp_path / "tqbroker-data").is_dir()
        conn = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
        ch = conn.channel()
        ch.queue_declare("cli-smoke")
        ch.basic_publish("", "cli-smoke", b"x")
        assert ch.basic_get("cli-smoke", auto_ack=True)[2] == b"x"
        conn.close()
        assert broker.stop(signum, timeout=10) == 0


def test_shutdown_closes_clients_with_320(tmp_path: Path) -> None:
    with start(tmp_path, "--data-dir", "elsewhere") as broker:
        assert (tmp_path / "elsewhere").is_dir()
        conn = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
        conn.channel()
        started = time.monotonic()
        broker.proc.send_signal(signal.SIGINT)
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
            conn.process_data_events(time_limit=5)
        assert info.value.reply_code == 320
        assert broker.proc.wait(timeout=10) == 0
        assert time.monotonic() - started < 10


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with start(tmp_path) as broker:
        second = subprocess.run(
            # A data directory of its own: the port, not the data directory's lock, refuses it.
            [sys.executable, "-m", "tqbroker", "--port", str(broker.port), "--data-dir", "other"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert second.returncode == 1
        assert "cannot start" in second.stderr
        assert "in use by another broker" not in second.stderr


def test_config_file_sets_users_vhosts_and_storage(tmp_path: Path) -> None:
    config = tmp_path / "tqbroker.toml"
    config.write_text(
        'data_dir = "from-config"\n'
        'vhosts = ["/", "staging"]\n'
        "[[users]]\n"
        'name = "app"\n'
        'password = "s3cret"\n'
        "[users.permissions.staging]\n"
        "[backend_options.log]\n"
        'fsync = "never"\n'
    )
    with start(tmp_path, "--config", str(config)) as broker:
        assert (tmp_path / "from-config").is_dir()
        credentials = pika.PlainCredentials("app", "s3cret")
        params = pika.ConnectionParameters(broker.host, broker.port, "staging", credentials)
        conn = pika.BlockingConnection(params)
        ch = conn.channel()
        ch.queue_declare("q", durable=True)
        ch.basic_publish("", "q", b"configured", pika.BasicProperties(delivery_mode=2))
        assert ch.basic_get("q", auto_ack=True)[2] == b"configured"
        conn.close()
        default_vhost = pika.ConnectionParameters(broker.host, broker.port, "/", credentials)
        with pytest.raises(pika.exceptions.ProbableAccessDeniedError):
            pika.BlockingConnection(default_vhost)


def test_bad_config_file_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('port = "abc"\ncolour = "blue"\n')
    result = subprocess.run(
        [sys.executable, "-m", "tqbroker", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "port" in result.stderr
    assert "colour" in result.stderr


def test_refuses_to_start_when_a_stored_queue_backend_is_missing(tmp_path: Path) -> None:
    """A durable queue on a backend that does not load must not be recreated empty elsewhere."""
    with start(tmp_path) as broker:
        conn = pika.BlockingConnection(pika.ConnectionParameters(broker.host, broker.port))
        conn.channel().queue_declare(
            "on-memory", durable=True, arguments={"x-queue-backend": "memory"}
        )
        conn.close()
    # Pretend the backend is gone: rewrite the stored definition to name one that is not there.
    definitions = tmp_path / "tqbroker-data" / "definitions.json"
    definitions.write_bytes(definitions.read_bytes().replace(b'"memory"', b'"vanish"'))
    result = subprocess.run(
        [sys.executable, "-m", "tqbroker", "--port", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "'vanish' backend, which is not loaded" in result.stderr


def test_a_backend_option_for_a_backend_that_cannot_load_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[backend_options.log]\nfsync = "sometimes"\n')
    result = subprocess.run(
        [sys.executable, "-m", "tqbroker", "--port", "0", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    # A configuration error naming the option (tests/cli/test_config_errors.py has the rest).
    assert result.returncode == 2
    assert "backend_options.log.fsync: fsync policy" in result.stderr


def test_a_data_directory_that_cannot_be_created_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    done = subprocess.run(
        [sys.executable, "-m", "tqbroker", "--port", "0", "--data-dir", "file/data"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2  # a configuration error
    assert done.stderr.startswith("tqbroker: data_dir: file is a file, not a directory")
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1
