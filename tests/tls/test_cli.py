"""The TLS settings on the command line, in TQBROKER_TLS_* variables and in the file's ``[tls]``
table; bad certificate files as one-line errors; ``python -m tqbroker --tls-only --http-tls``
with no plaintext AMQP port, and SIGHUP reloading the certificate (new connections get the new
one, an open connection goes on)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pika
import pytest
import trustme

from tests.support.polling import file_containing
from tests.support.ports import free_port
from tqbroker.cli import effective_config, parse_args
from tqbroker.config import BrokerConfig, load_config
from tqbroker.settings import to_toml

from .harness import HOST, Pki

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("TQBROKER_")]:
        if name != "TQBROKER_TEST_DURABLE_BACKEND":
            monkeypatch.delenv(name)


def test_flags_over_variables_over_the_file(tmp_path: Path, pki: Pki) -> None:
    file = tmp_path / "tqbroker.toml"
    file.write_text(
        f'[tls]\nport = 6000\ncertfile = "{pki.cert}"\nkeyfile = "{pki.key}"\n'
        'verify_peer = true\nssl_cert_login_from = "distinguished_name"\n'
    )
    environ = {"TQBROKER_TLS_PORT": "6001", "TQBROKER_TLS_ONLY": "true"}
    config = effective_config(parse_args(["--config", str(file)]), {})
    assert config.tls.port == 6000
    assert config.tls.verify_peer
    config = effective_config(parse_args(["--config", str(file)]), environ)
    assert (config.tls.port, config.tls.only, config.tls.certfile) == (6001, True, pki.cert)
    args = ["--config", str(file), "--tls-port", "6002", "--http-tls", "--tls-cacertfile"]
    config = effective_config(
        parse_args([*args, str(pki.ca), "--tls-fail-if-no-peer-cert"]), environ
    )
    tls = config.tls
    assert (tls.port, tls.http, tls.cacertfile, tls.fail_if_no_peer_cert) == (
        6002,
        True,
        pki.ca,
        True,
    )
    assert tls.ssl_cert_login_from == "distinguished_name"  # the file's, untouched
    # --print-config shows the [tls] table, and reads back to the same configuration.
    shown = to_toml(config)
    assert "[tls]\nport = 6002\n" in shown
    again = tmp_path / "again.toml"
    again.write_text(shown.replace('"<redacted>"', '"guest"'))
    assert load_config(again).tls == tls
    assert BrokerConfig().tls.port == 5671
    assert not BrokerConfig().tls.enabled


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--tls-port", "70000"], "--tls-port: must be between 0 and 65535"),
        (
            ["--tls-certfile", "/nonexistent/cert.pem", "--tls-keyfile", "k"],
            "tls.certfile: cannot read /nonexistent/cert.pem",
        ),
        (
            ["--tls-certfile", "CERT", "--tls-keyfile", "OTHERKEY"],
            "tls.keyfile: OTHERKEY is not the key of the certificate",
        ),
        (["--tls-certfile", "CERT"], "tls.keyfile: certfile and keyfile go together"),
        (["--tls-only"], "tls.only: needs tls.certfile and tls.keyfile"),
        (
            ["--tls-certfile", "CERT", "--tls-keyfile", "KEY", "--tls-fail-if-no-peer-cert"],
            "tls.fail_if_no_peer_cert: needs tls.verify_peer",
        ),
    ],
)
def test_bad_settings_are_one_line(tmp_path: Path, pki: Pki, flags: list[str], error: str) -> None:
    other = trustme.CA().issue_cert("x").private_key_pem
    other.write_to_path(str(tmp_path / "other.pem"))
    names = {"CERT": str(pki.cert), "KEY": str(pki.key), "OTHERKEY": str(tmp_path / "other.pem")}
    argv = [names.get(flag, flag) for flag in flags]
    done = subprocess.run(
        [sys.executable, "-m", "tqbroker", *argv, "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tqbroker: ")
    assert error.replace("OTHERKEY", names["OTHERKEY"]) in done.stderr


def _issue(ca: trustme.CA, where: Path) -> str:
    """A certificate for 127.0.0.1 written over ``where``'s cert.pem and key.pem; its serial."""
    leaf = ca.issue_cert(HOST)
    leaf.cert_chain_pems[0].write_to_path(str(where / "cert.pem"))
    leaf.private_key_pem.write_to_path(str(where / "key.pem"))
    return _serial(leaf.cert_chain_pems[0].bytes())


def _serial(pem: bytes) -> str:
    der = ssl.PEM_cert_to_DER_cert(pem.decode())
    return der.hex()  # the whole certificate: enough to tell two apart


def _served(port: int, trust: ssl.SSLContext) -> str:
    with (
        socket.create_connection((HOST, port), timeout=5) as raw,
        trust.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return der.hex()


def test_tls_only_and_reload_on_sighup(tmp_path: Path) -> None:
    first_ca, second_ca = trustme.CA(), trustme.CA()
    first = _issue(first_ca, tmp_path)
    trust = ssl.create_default_context()
    for ca in (first_ca, second_ca):
        ca.configure_trust(trust)
    plain_port = free_port(HOST)
    log = tmp_path / "broker.log"
    args = [sys.executable, "-m", "tqbroker", "--port", str(plain_port), "--tls-port", "0"]
    args += ["--http-port", "0", "--metrics-port", "off", "--data-dir", str(tmp_path / "d")]
    args += ["--tls-only", "--http-tls", "--tls-certfile", str(tmp_path / "cert.pem")]
    args += ["--tls-keyfile", str(tmp_path / "key.pem"), "--log-level", "info"]
    with open(log, "w") as stderr:
        broker = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert broker.stdout is not None
        line = broker.stdout.readline()
        assert "amqp://" not in line, line  # --tls-only: no plaintext AMQP port
        amqps = int(line.split("amqps://127.0.0.1:")[1].split(",")[0])
        https = int(line.split("https://127.0.0.1:")[1].split(",")[0].strip())
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((HOST, plain_port), timeout=5)
        assert _served(amqps, trust) == first
        assert _served(https, trust) == first
        params = pika.ConnectionParameters(HOST, amqps, ssl_options=pika.SSLOptions(trust, HOST))
        open_connection = pika.BlockingConnection(params)
        channel = open_connection.channel()
        queue = channel.queue_declare("", exclusive=True).method.queue

        second = _issue(second_ca, tmp_path)
        broker.send_signal(signal.SIGHUP)
        assert "TLS certificate reloaded" in file_containing(log, "TLS certificate reloaded")
        assert _served(amqps, trust) == second  # new connections: the new certificate
        assert _served(https, trust) == second
        channel.basic_publish("", queue, b"across the reload")  # the open one goes on
        assert channel.basic_get(queue, auto_ack=True)[2] == b"across the reload"
        assert httpx.get(f"https://{HOST}:{https}/health", verify=trust, timeout=10).is_success

        # A reload that cannot be used keeps the current certificate.
        trustme.CA().issue_cert(HOST).private_key_pem.write_to_path(str(tmp_path / "key.pem"))
        broker.send_signal(signal.SIGHUP)
        content = file_containing(log, "reload failed")
        assert "TLS certificate reload failed, keeping the current one: tls.keyfile:" in content
        assert _served(amqps, trust) == second
        open_connection.close()
    finally:
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(timeout=30) == 0
        broker.stdout.close()  # type: ignore[union-attr]
    assert "Traceback" not in log.read_text()
