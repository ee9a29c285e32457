"""The definitions file is assembled from pre-encoded parts (``definitions.encode_snapshot``):
each queue's entry is encoded once, the arrays and maps around them get hand-made CBOR heads.
What it writes must decode as the plain structure would, whatever the counts."""

from __future__ import annotations

from pathlib import Path

import cbor2
import pika
from hypothesis import given
from hypothesis import strategies as st

from tqbroker.broker.definitions import ARRAY, MAP, _head
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker


@given(st.integers(0, 300_000), st.sampled_from([ARRAY, MAP]))
def test_heads_are_what_cbor2_writes(length: int, major: int) -> None:
    if major == ARRAY:
        expected = cbor2.dumps([None] * length)
    else:
        expected = cbor2.dumps({n: None for n in range(length)})
    assert expected.startswith(_head(major, length))
    assert len(_head(major, length)) <= 9


def test_three_hundred_durable_queues_survive_a_restart(tmp_path: Path) -> None:
    """300 queues: a two-byte array head; one deleted and one declared after the first
    encoding (the cached entries of the others are reused)."""
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    with running_broker(config) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.exchange_declare("x", "direct", durable=True)
        for n in range(300):
            channel.queue_declare(f"q{n}", durable=True, arguments={"x-max-length": n + 1})
        channel.queue_bind("q7", "x", routing_key="seven")
        channel.queue_delete("q3")
        channel.queue_declare("late", durable=True)
        connection.close()
    stored = cbor2.loads((tmp_path / "definitions.cbor").read_bytes())
    queues = {q["name"]: q for q in stored["definitions"]["/"]["queues"]}
    assert set(queues) == {f"q{n}" for n in range(300) if n != 3} | {"late"}
    assert queues["q9"]["arguments"] == {"x-max-length": 10}
    with running_broker(config) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        for n in (0, 150, 299):
            channel.queue_declare(f"q{n}", passive=True)
        channel.basic_publish("x", "seven", b"routed")
        _method, _props, body = channel.basic_get("q7", auto_ack=True)
        assert body == b"routed"
        connection.close()
