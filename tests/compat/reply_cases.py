"""The error paths RabbitMQ users hit, as client-side scenarios runnable against any broker.

Each case opens its own connection(s) to ``host:port`` (pika for what a client library can
send, ``rawamqp`` for frames no library sends), provokes one error and returns what the broker
answered: ``[reply code, reply text]`` of the channel or connection close, or ``"ok"`` when the
broker did not refuse. ``capture(host, port)`` runs every case; ``rabbitmq_replies.json`` holds
the answers captured from RabbitMQ 3.10, the texts tqbroker must give word for word.

Queue and exchange names are fixed per case (``c.<case>``) so the texts are comparable; a case
deletes what it declared so that the cases can run in any order against one broker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import (
    reply_cases_channel,  # noqa: F401  (registers its cases)
    reply_cases_declare,  # noqa: F401
    reply_cases_frames,  # noqa: F401
    reply_cases_streams,  # noqa: F401
)
from .reply_harness import CASES, Answer, connection

TABLE = Path(__file__).with_name("rabbitmq_replies.json")
__all__ = ["CASES", "Answer", "capabilities", "capture", "capture_table", "load_table"]


def capabilities(host: str, port: int) -> dict[str, Any]:
    """The ``capabilities`` table of the broker's ``connection.start``, as pika saw it."""
    with connection(host, port) as conn:
        table: dict[str, Any] = conn._impl.server_properties["capabilities"]
        return dict(sorted(table.items()))


def capture(host: str, port: int, names: list[str] | None = None) -> dict[str, Answer]:
    """Every case's answer from the broker at ``host:port``."""
    return {name: CASES[name](host, port) for name in (names or list(CASES))}


def capture_table(host: str, port: int) -> dict[str, Any]:
    """What ``rabbitmq_replies.json`` holds, from the broker at ``host:port``."""
    return {"capabilities": capabilities(host, port), "replies": capture(host, port)}


def load_table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


if __name__ == "__main__":  # python tests/compat/reply_cases.py PORT: print a broker's table
    import sys

    print(json.dumps(capture_table("127.0.0.1", int(sys.argv[1])), indent=1))
