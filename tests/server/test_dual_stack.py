"""``--host ::`` listens for IPv4 clients too (as RabbitMQ and the HTTP port do): AMQP on
``::`` is dual-stack, and guest logs in from 127.0.0.1 (seen as ``::ffff:127.0.0.1``). Run in a
network namespace of its own (``unshare -n``: only a loopback interface), so binding every
address exposes nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import fcntl, socket, struct, sys
    from pathlib import Path
    # The namespace's loopback interface up (``ip link set lo up``, without iproute2).
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))  # SIOCSIFFLAGS
    import pika
    from tqbroker.testing import start_broker_process
    here = Path(sys.argv[1])
    with start_broker_process(None, extra_args=["--host", "::"], cwd=here) as broker:
        for host in ("127.0.0.1", "::1"):
            params = pika.ConnectionParameters(host, broker.port, connection_attempts=1)
            connection = pika.BlockingConnection(params)
            connection.channel().queue_declare("", exclusive=True)
            connection.close()
            print("logged in via", host)
    """
)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux)")
def test_amqp_on_all_addresses_is_dual_stack(tmp_path: Path) -> None:
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare -n needs privileges)")
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "logged in via 127.0.0.1" in done.stdout
    assert "logged in via ::1" in done.stdout
