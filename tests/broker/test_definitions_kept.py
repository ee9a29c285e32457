"""Nothing durable leaves the definitions file except by a delete: a stored exchange whose type
no longer loads (an uninstalled plugin) or a stored queue whose arguments no longer validate stops
the start, leaving the data directory byte-identical, or with ``--keep-unloadable-definitions``
is kept dormant and written back unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.support.plugin_dist import PluginDistribution
from tqbroker import BrokerConfig
from tqbroker.broker.definitions_file import DefinitionsFile
from tqbroker.testing import running_broker

ROUTER = """
class ReverseRouter:
    cacheable = True

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
        pass

    def create_router(self, arguments):
        return ReverseRouter()
"""


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[PluginDistribution]:
    """The distribution ``reverse-exchange`` 1.0 with the exchange type ``x-reverse``, which a
    test installs (on sys.path) and uninstalls."""
    installed = PluginDistribution(
        tmp_path / "site",
        name="reverse-exchange",
        version="1.0",
        module="reverse_exchange",
        source=ROUTER,
        exchange_types={"x-reverse": "reverse_exchange:ReverseExchange"},
    )
    try:
        yield installed
    finally:
        installed.uninstall()


def config(data_dir: Path, **options: object) -> BrokerConfig:
    return BrokerConfig(port=0, http_port=None, data_dir=data_dir, **options)  # type: ignore[arg-type]


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def stored_definitions(data_dir: Path) -> dict[str, Any]:
    """The vhost ``/`` of the definitions file, in the stored form."""
    definitions = DefinitionsFile(data_dir, bytes).load()
    stored = definitions["definitions"]["/"]
    assert isinstance(stored, dict)
    return stored


def declare_topology(url: str) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("orders", "x-reverse", durable=True)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "orders", "cba")
    channel.basic_publish(
        "orders", "abc", b"kept", properties=pika.BasicProperties(delivery_mode=2)
    )
    connection.close()


BROKER = (
    sys.executable,
    "-m",
    "tqbroker",
    "--port",
    "0",
    "--http-port",
    "-1",
    "--metrics-port",
    "-1",
)


def start_cli(data_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``python -m tqbroker`` in a process of its own: the plugin is not on its path."""
    return subprocess.run(
        [*BROKER, "--data-dir", str(data_dir), *flags],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_uninstalled_exchange_type_stops_the_start_and_touches_nothing(
    plugin: PluginDistribution, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    plugin.install()
    with running_broker(config(data_dir)) as broker:
        declare_topology(broker.url)
    plugin.uninstall()
    before = snapshot(data_dir)
    result = start_cli(data_dir)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("tqbroker:")]
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert "cannot start" in line
    assert "exchange 'orders'" in line
    assert "vhost '/'" in line
    assert "'x-reverse'" in line
    assert "reverse-exchange 1.0" in line
    assert "--keep-unloadable-definitions" in line
    assert snapshot(data_dir) == before, "a refused start changed the data directory"


def test_kept_dormant_and_written_back_then_restored_when_the_plugin_returns(
    plugin: PluginDistribution, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    plugin.install()
    with running_broker(config(data_dir)) as broker:
        declare_topology(broker.url)
    stored = stored_definitions(data_dir)
    plugin.uninstall()

    with running_broker(config(data_dir, keep_unloadable_definitions=True)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as declared:
            channel.exchange_declare("orders", "direct", durable=True)
        assert declared.value.reply_code == 406
        assert "dormant" in declared.value.reply_text
        assert "x-reverse" in declared.value.reply_text
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as looked_up:
            channel.exchange_declare("orders", passive=True)
        assert looked_up.value.reply_code == 404
        assert "dormant" in looked_up.value.reply_text
        channel = connection.channel()
        assert channel.queue_declare("q", passive=True).method.message_count == 1
        connection.close()
    # Written back unchanged: the exchange and its binding are still stored.
    assert stored_definitions(data_dir) == stored

    plugin.install()
    with running_broker(config(data_dir)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.basic_publish("orders", "abc", b"routed again")
        assert channel.basic_get("q", auto_ack=True)[2] == b"kept"
        assert channel.basic_get("q", auto_ack=True)[2] == b"routed again"
        connection.close()


def test_a_dormant_exchange_can_be_deleted(plugin: PluginDistribution, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    plugin.install()
    with running_broker(config(data_dir)) as broker:
        declare_topology(broker.url)
    plugin.uninstall()
    with running_broker(config(data_dir, keep_unloadable_definitions=True)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        channel = connection.channel()
        channel.exchange_delete("orders")
        channel.exchange_declare("orders", "direct", durable=True)
        connection.close()
    stored = stored_definitions(data_dir)
    assert [(x["name"], x["type"]) for x in stored["exchanges"]] == [("orders", "direct")]
    assert stored["bindings"] == []
    # No longer needs the plugin to start.
    with running_broker(config(data_dir)):
        pass


def test_a_queue_whose_arguments_no_longer_validate_stops_the_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with running_broker(config(data_dir)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        connection.channel().queue_declare("limited", durable=True, arguments={"x-max-length": 5})
        connection.close()
    # As if a newer broker had stricter rules: the stored argument is no longer valid.
    definitions = json.loads((data_dir / "definitions.json").read_bytes())
    (entry,) = definitions["queues"]
    entry["arguments"]["x-max-length"] = "five"
    (data_dir / "definitions.json").write_text(json.dumps(definitions))
    (queue,) = stored_definitions(data_dir)["queues"]
    before = snapshot(data_dir)
    result = start_cli(data_dir)
    assert result.returncode == 1
    assert "queue 'limited' in vhost '/'" in result.stderr
    assert "x-max-length" in result.stderr
    assert snapshot(data_dir) == before
    with running_broker(config(data_dir, keep_unloadable_definitions=True)) as broker:
        connection = pika.BlockingConnection(pika.URLParameters(broker.url))
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as looked_up:
            connection.channel().queue_declare("limited", passive=True)
        assert looked_up.value.reply_code == 404
        assert "dormant" in looked_up.value.reply_text
        connection.close()
    assert stored_definitions(data_dir)["queues"] == [queue]
