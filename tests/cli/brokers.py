"""What the admin tools' tests know of a broker, tqbroker or the oracle RabbitMQ: an HTTP API URL
with the credentials (what ``--url`` takes) and an AMQP URL (for pika)."""

from __future__ import annotations

import subprocess
import sys

import attrs
import httpx


@attrs.frozen
class Broker:
    name: str
    api_url: str  # http://guest:guest@127.0.0.1:PORT
    amqp_url: str

    def ctl(self, *args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
        """``python -m tqbroker ctl ARGS --url ...``, which must exit with ``status``."""
        done = subprocess.run(
            [sys.executable, "-m", "tqbroker", "ctl", "--url", self.api_url, *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == status, (self.name, args, done.stdout, done.stderr)
        return done

    def api(self) -> httpx.Client:
        base = self.api_url.replace("guest:guest@", "")
        return httpx.Client(base_url=base, auth=("guest", "guest"), timeout=30)
