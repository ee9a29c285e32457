"""deploy/ (issue 15 item 10): the systemd unit passes ``systemd-analyze verify``, the broker
tells a service manager it is ready (``READY=1`` after its startup line) and that it stops
(``STOPPING=1``) through a real datagram socket, and the Dockerfile installs the package from
what it copies and runs ``python -m tqbroker`` as a non-root user with a data volume."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from zipfile import ZipFile

import pytest

from tqbroker.sdnotify import notify
from tqbroker.testing import start_broker_process

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "tqbroker.service"
DOCKERFILE = DEPLOY / "Dockerfile"


# -- sd_notify ---------------------------------------------------------------------------------


@pytest.fixture(params=["path", "abstract"])
def notify_socket(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[socket.socket]:
    """A datagram socket as systemd binds one, its name in NOTIFY_SOCKET for the broker."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify")
        sock.bind(name)
    else:
        name = f"@tqbroker-test-{uuid.uuid4().hex}"
        sock.bind("\0" + name[1:])
    sock.settimeout(15)
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    with sock:
        yield sock


def test_ready_once_listening_and_stopping_on_shutdown(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    with start_broker_process(tmp_path / "data") as broker:  # returns after the startup line
        ready = notify_socket.recv(4096).decode()
        lines = ready.splitlines()
        assert lines[0] == "READY=1"
        assert f"STATUS=listening on amqp://{broker.host}:{broker.port}" in lines[1]
        assert f"MAINPID={broker.proc.pid}" in lines
        with socket.create_connection((broker.host, broker.port), timeout=5):
            pass  # listening indeed
        broker.proc.send_signal(signal.SIGTERM)
        assert notify_socket.recv(4096).decode().splitlines()[0] == "STOPPING=1"
        assert broker.proc.wait(timeout=30) == 0


# -- the systemd unit --------------------------------------------------------------------------


def test_the_unit_runs_the_broker_with_the_packaged_config() -> None:
    unit = UNIT.read_text()
    assert "\nType=notify\n" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith(" -m tqbroker --config /etc/tqbroker/tqbroker.toml")
    assert "\nUser=tqbroker\n" in unit
    assert "\nNoNewPrivileges=yes\n" in unit


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    # The unit as shipped, its interpreter (/opt/tqbroker/bin/python) replaced by this one:
    # verify checks that ExecStart's program exists.
    unit = UNIT.read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    program = exec_start.removeprefix("ExecStart=").split()[0]
    (tmp_path / "tqbroker.service").write_text(unit.replace(program, sys.executable))
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "tqbroker.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # verify exits 0 on unknown keys and bad values, but says so: no word is allowed.
    assert done.returncode == 0, done.stderr
    assert "tqbroker.service" not in done.stderr, done.stderr
    # The hardening: systemd's exposure score (0 safest .. 10) stays at most 1.5 (the
    # threshold is in tenths; the unit scores 1.4).
    unit_path = str(tmp_path / "tqbroker.service")
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--threshold=15", unit_path],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "--offline" in security.stderr or "--threshold" in security.stderr:
        return  # systemd < 250: no offline assessment
    assert security.returncode == 0, security.stdout[-2000:]


# -- the Dockerfile ----------------------------------------------------------------------------


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, rest = pending.strip().partition(" ")
        found.append((keyword.upper(), " ".join(rest.split())))
        pending = ""
    return found


def test_the_dockerfile_installs_the_checkout_and_runs_the_broker_unprivileged() -> None:
    steps = instructions(DOCKERFILE.read_text())
    keywords = [keyword for keyword, _ in steps]
    assert steps[0] == ("FROM", "python:3.11-slim")
    copied = [args.split()[0] for keyword, args in steps if keyword == "COPY"]
    assert "src" in copied
    assert any(keyword == "RUN" and "pip install ." in args for keyword, args in steps)
    user = [args for keyword, args in steps if keyword == "USER"]
    assert user == ["tqbroker"]
    assert keywords.index("USER") > max(i for i, k in enumerate(keywords) if k == "RUN")
    exposed = {port for keyword, args in steps if keyword == "EXPOSE" for port in args.split()}
    assert {"5672", "15672", "15692"} <= exposed
    volumes = [json.loads(args) for keyword, args in steps if keyword == "VOLUME"]
    env = " ".join(args for keyword, args in steps if keyword == "ENV")
    assert volumes == [["/var/lib/tqbroker"]]
    assert "TQBROKER_DATA_DIR=/var/lib/tqbroker" in env
    assert "TQBROKER_HOST=0.0.0.0" in env  # published ports reach the broker
    assert json.loads(dict(steps)["CMD"]) == ["python", "-m", "tqbroker"]
    if shutil.which("hadolint"):
        done = subprocess.run(["hadolint", str(DOCKERFILE)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout


def test_what_the_dockerfile_copies_is_enough_to_build_the_package(tmp_path: Path) -> None:
    """The build context the image sees (what COPY takes) builds the wheel with the broker."""
    context = tmp_path / "context"  # the WORKDIR where ``pip install .`` runs
    for keyword, args in instructions(DOCKERFILE.read_text()):
        if keyword == "COPY":  # Docker's rules: a directory's contents go into the target
            *sources, target = args.split()
            into = context / target
            for source in sources:
                if (ROOT / source).is_dir():
                    ignore = shutil.ignore_patterns("__pycache__")
                    shutil.copytree(ROOT / source, into, ignore=ignore, dirs_exist_ok=True)
                else:
                    copy = into / source if target.endswith("/") or len(sources) > 1 else into
                    copy.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(ROOT / source, copy)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("tqbroker-*.whl")
    names = ZipFile(wheel).namelist()
    assert "tqbroker/__main__.py" in names
    assert "tqbroker/cli.py" in names


@pytest.mark.slow
def test_the_image_builds_and_prints_its_config(tmp_path: Path) -> None:
    if shutil.which("docker") is None:
        pytest.skip("docker is not installed")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("the docker daemon is not reachable")
    tag = f"tqbroker-test:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(
        ["docker", "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    try:
        shown = subprocess.run(
            ["docker", "run", "--rm", tag, "python", "-m", "tqbroker", "--print-config"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr
        assert 'host = "0.0.0.0"' in shown.stdout
        assert 'data_dir = "/var/lib/tqbroker"' in shown.stdout
        whoami = subprocess.run(
            ["docker", "run", "--rm", tag, "id", "-u"], capture_output=True, text=True, timeout=120
        )
        assert whoami.stdout.strip() != "0"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def test_notify_without_a_manager_or_with_a_missing_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False  # not under systemd: nothing to do, nothing said
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert notify("READY=1") is False
    assert "cannot notify systemd through" in caplog.text
