"""While the broker is out of descriptors, its accept loop says so in one warning line per
10 s (no traceback), and accepts again once descriptors are back: a broker process with
``ulimit -n 128`` and no per-address handshake cap, held full by raw sockets for 3 s. Between
failed accepts the loop pauses ``RETRY_S`` (on Trio's mock clock: no spinning)."""

from __future__ import annotations

import errno
import os
import socket
import time
from itertools import pairwise
from pathlib import Path

import pika
import pytest
import trio

from tqbroker.server.accepting import RETRY_S, WARN_EVERY_S, AcceptFailures, serve_listeners
from tqbroker.testing import start_broker_process

pytestmark = pytest.mark.timeout(90)


def test_descriptors_exhausted_is_one_line_per_interval_without_traceback(
    tmp_path: Path,
) -> None:
    config = tmp_path / "tqbroker.toml"
    config.write_text("handshake_timeout = 30\nmax_pending_handshakes_per_address = 0\n")
    log = tmp_path / "broker.log"
    with start_broker_process(
        tmp_path / "data", extra_args=["--config", str(config)], max_open_files=128, stderr=log
    ) as broker:
        clients: list[socket.socket] = []
        try:
            for _ in range(200):  # more than the broker's 128: the kernel's backlog takes them
                client = socket.create_connection((broker.host, broker.port), timeout=5)
                clients.append(client)
            time.sleep(3.0)  # about 30 retries of accept
            said = log.read_text()
        finally:
            for client in clients:
                client.close()
        time.sleep(0.5)
        # Descriptors back: a client connects as before.
        pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    lines = [line for line in said.splitlines() if "accept" in line]
    print("\n".join(lines))
    assert len(lines) == 1, lines
    assert "cannot accept connections on AMQP" in lines[0]
    assert "EMFILE" in lines[0]
    assert "Traceback" not in said


def test_failures_are_counted_between_lines(caplog: pytest.LogCaptureFixture) -> None:
    tenths = [0]
    failures = AcceptFailures("AMQP 127.0.0.1:5672", clock=lambda: tenths[0] / 10)
    for _ in range(250):  # 25 s of retries every 0.1 s
        failures.failed(errno.EMFILE)
        tenths[0] += 1
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 3  # at 0, 10 and 20 s
    assert all(os.strerror(errno.EMFILE) in line for line in lines)
    assert [int(line.split(", ")[-1].split()[0]) for line in lines] == [0, 99, 99]
    assert WARN_EVERY_S == 10.0


class ExhaustedListener(trio.abc.Listener[trio.abc.Stream]):
    """A listener whose accepts fail for want of descriptors (EMFILE), noting when; its last
    one fails with another error, which ends the accept loop."""

    def __init__(self, accepts: int) -> None:
        self.accepts = accepts
        self.tried_at: list[float] = []

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.tried_at.append(trio.current_time())
        if len(self.tried_at) == self.accepts:
            raise OSError(errno.EBADF, "the test is over")
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_failed_accept_is_retried_after_a_pause(autojump_clock: trio.abc.Clock) -> None:
    listener = ExhaustedListener(21)

    async def handler(stream: object) -> None:
        raise AssertionError("nothing is accepted")

    async with trio.open_nursery() as handlers:
        with pytest.raises(ExceptionGroup) as ended:
            await serve_listeners(handler, [listener], handler_nursery=handlers, name="AMQP")
    assert ended.group_contains(OSError, match="the test is over")
    tried_at = listener.tried_at
    pauses = [later - earlier for earlier, later in pairwise(tried_at)]
    assert pauses == [pytest.approx(RETRY_S)] * 20
