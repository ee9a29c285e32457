"""Exchange types load through entry points, first-party and third-party alike."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pika
import pytest

from tests.support.plugin_dist import PluginDistribution
from tqbroker.plugins.loader import load_backends, load_exchange_types
from tqbroker.testing import running_broker


def test_builtin_exchange_types_come_from_entry_points() -> None:
    assert {"direct", "fanout", "topic", "headers"} <= set(load_exchange_types())
    assert "memory" in load_backends()


REVERSE_EXCHANGE = '''
            class ReverseRouter:
                """Routes to bindings whose key is the routing key reversed."""
                def __init__(self):
                    self.bindings = {}
                def bind(self, destination, key, arguments):
                    self.bindings.setdefault(key, set()).add(destination)
                def unbind(self, destination, key, arguments):
                    self.bindings.get(key, set()).discard(destination)
                def route(self, routing_key, headers):
                    return self.bindings.get(routing_key[::-1], ())

            class ReverseExchange:
                def validate(self, arguments):
                    if "x-bad" in arguments:
                        raise ValueError("x-bad is not allowed")
                def create_router(self, arguments):
                    return ReverseRouter()
            '''


@pytest.fixture
def third_party_plugin(tmp_path: Path) -> Iterator[None]:
    """Install a tiny distribution (module + dist-info with entry points) on sys.path: one good
    exchange type ``x-reverse`` and one broken plugin."""
    plugin = PluginDistribution(
        tmp_path,
        name="reverse-exchange",
        version="1.0",
        module="reverse_exchange",
        source=REVERSE_EXCHANGE,
        exchange_types={
            "x-reverse": "reverse_exchange:ReverseExchange",
            "x-broken": "reverse_exchange:DoesNotExist",
        },
    )
    plugin.install()
    try:
        yield
    finally:
        plugin.uninstall()


def test_third_party_exchange_type_routes_and_broken_plugin_is_skipped(
    third_party_plugin: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="tqbroker.plugins"), running_broker() as broker:
        conn = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = conn.channel()
        ch.exchange_declare("rev", "x-reverse")
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(queue, "rev", "cba")
        ch.basic_publish("rev", "abc", b"reversed")
        ch.basic_publish("rev", "cba", b"not reversed")
        assert ch.basic_get(queue, auto_ack=True)[2] == b"reversed"
        assert ch.basic_get(queue, auto_ack=True)[0] is None
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            ch.exchange_declare("rev2", "x-reverse", arguments={"x-bad": 1})
        assert refused.value.reply_code == 406
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as unknown:
            ch.exchange_declare("broken", "x-broken")
        assert unknown.value.reply_code == 503
    assert any("x-broken" in record.getMessage() for record in caplog.records)
