"""The oracle for ``rabbitmq_replies.json``: start a real RabbitMQ on loopback, run every case of
``reply_cases`` against it and diff with the checked-in table, so that the table
``test_reply_texts.py`` holds tqbroker to is what RabbitMQ really says.

Slow (a RabbitMQ node starts: ~15 s); needs Debian's ``rabbitmq-server`` package. To refresh the
table after adding a case: ``python tests/compat/reply_cases.py PORT > tests/compat/
rabbitmq_replies.json`` against a RabbitMQ on PORT (this test prints the diff it finds).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from reply_cases import capture_table, load_table

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SERVER = "/usr/sbin/rabbitmq-server"
CTL = "/usr/sbin/rabbitmqctl"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.path.exists(SERVER) and os.path.exists(CTL)),
        reason="needs RabbitMQ (Debian package rabbitmq-server)",
    ),
]


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[tuple[str, int]]:
    sys.path.insert(0, str(BENCHMARKS))
    from targets import Epmd, RabbitMQTarget

    # Not under pytest's tmp_path: its parents are private to us, and Debian's script runs the
    # node as the rabbitmq user when started by root.
    parent = Path(tempfile.mkdtemp(prefix="tqbroker-oracle-"))
    root = parent / "node"
    root.mkdir()
    if os.geteuid() == 0:
        for path in (parent, root):
            shutil.chown(path, "rabbitmq")
    epmd = Epmd()
    target = RabbitMQTarget(root, SERVER, CTL, epmd=epmd)
    try:
        target.start()
        yield "127.0.0.1", target.port
    finally:
        target.close()
        epmd.cleanup()
        shutil.rmtree(parent, ignore_errors=True)


def test_the_table_is_what_rabbitmq_says(rabbitmq: tuple[str, int]) -> None:
    captured = capture_table(*rabbitmq)
    table = load_table()
    assert captured["capabilities"] == table["capabilities"]
    differ = {
        name: {"rabbitmq": answer, "table": table["replies"].get(name)}
        for name, answer in captured["replies"].items()
        if answer != table["replies"].get(name)
    }
    assert not differ, f"rabbitmq_replies.json differs from RabbitMQ: {differ}"
