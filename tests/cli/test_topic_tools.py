"""``python -m tqbroker ctl topics create | produce | consume`` against a running broker, as a user
runs them: real processes, real sockets; the AMQP address of ``consume`` comes from the broker."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import httpx
import pika
import pytest

from tests.support.polling import eventually
from tqbroker.client import Client
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(90)


def api_url(broker: RunningBroker, credentials: str = "guest:guest") -> str:
    return broker.http_url.replace("http://", f"http://{credentials}@")


def command(broker: RunningBroker, *args: str) -> list[str]:
    url = [] if "--url" in args else ["--url", api_url(broker)]
    return [sys.executable, "-m", "tqbroker", "ctl", *args, *url]


def wait_for_consumers(broker: RunningBroker, *queues: str, timeout: float = 60) -> None:
    """Until each of ``queues`` has a consumer: a consumer process has subscribed (however long
    its start took on a busy machine)."""
    connection = pika.BlockingConnection(pika.URLParameters(broker.url))
    try:
        channel = connection.channel()
        eventually(
            lambda: all(
                channel.queue_declare(q, passive=True).method.consumer_count for q in queues
            ),
            timeout,
            what=f"a consumer on each of {queues}",
        )
    finally:
        connection.close()


def committed(broker: RunningBroker, topic: str, group: str) -> int:
    """How many records of ``topic`` the group has committed, over its partitions."""
    url = f"{broker.http_url}/topics/{topic}/groups/{group}"
    partitions = httpx.get(url, auth=("guest", "guest"), timeout=10).json()["partitions"]
    return sum(p["committed"] or 0 for p in partitions)


def tool(broker: RunningBroker, *args: str, stdin: str | bytes = "", timeout: float = 30) -> str:
    raw = stdin if isinstance(stdin, bytes) else stdin.encode()
    done = subprocess.run(
        command(broker, *args), input=raw, capture_output=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


def test_create_produce_and_consume_from_every_start(tqbroker_thread: RunningBroker) -> None:
    assert "3 partition(s), created" in tool(
        tqbroker_thread, "topics", "create", "orders", "--partitions", "3", "--arg", "x-max-age=7D"
    )
    again = ("topics", "create", "orders", "--partitions", "3", "--arg", "x-max-age=7D")
    assert "exists" in tool(tqbroker_thread, *again)
    landed = tool(tqbroker_thread, "produce", "orders", "--key", "k1", "-v", stdin="a\nb\nc\n")
    assert len(set(landed.splitlines())) == 3  # one partition (the key's), three offsets
    tool(tqbroker_thread, "produce", "orders", stdin="".join(f"m{n}\n" for n in range(9)))
    everything = tool(tqbroker_thread, "consume", "orders", "--from", "first", "-n", "12")
    assert sorted(everything.split()) == sorted(["a", "b", "c"] + [f"m{n}" for n in range(9)])
    rows = [
        json.loads(line)
        for line in tool(
            tqbroker_thread, "consume", "orders", "--from", "first", "-n", "12", "--format", "json"
        ).splitlines()
    ]
    keyed = [r for r in rows if r["key"] == "k1"]
    assert [r["value"] for r in keyed] == ["a", "b", "c"]
    assert [r["offset"] for r in keyed] == [0, 1, 2]
    # From an offset (on each partition) and from a time after everything: nothing older.
    from_one = tool(tqbroker_thread, "consume", "orders", "--from", "1", "--idle", "1")
    assert 0 < len(from_one.split()) < 12
    later = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 5))
    assert tool(tqbroker_thread, "consume", "orders", "--from", later, "--idle", "1") == ""


def test_topics_take_kafka_configs_and_refuse_unknown_names(
    tqbroker_thread: RunningBroker,
) -> None:
    made = ("topics", "create", "kept", "--partitions", "2", "--config", "retention.ms=86400000")
    assert "2 partition(s), created" in tool(
        tqbroker_thread, *made, "--config", "cleanup.policy=compact"
    )
    described = json.loads(tool(tqbroker_thread, "topics", "describe", "kept", "--format", "json"))
    assert described["arguments"]["x-max-age"] == "86400s"
    assert described["configs"]["cleanup.policy"] == "compact"
    altered = tool(
        tqbroker_thread,
        "topics",
        "alter",
        "kept",
        "--config",
        "retention.bytes=1048576",
        "--delete-config",
        "retention.ms",
    )
    assert "retention.bytes=1048576,retention.ms=-1" in altered
    described = json.loads(tool(tqbroker_thread, "topics", "describe", "kept", "--format", "json"))
    assert described["arguments"]["x-max-length-bytes"] == 1048576
    assert "x-max-age" not in described["arguments"]
    for args, words in (
        (["topics", "create", "stale", "--arg", "retention.ms=86400000"], "Kafka topic config"),
        (["topics", "create", "stale", "--config", "retention.msx=1"], "Unknown topic config"),
        (["topics", "alter", "kept", "--config", "segment.bytes=10"], "segment.bytes"),
        (["topics", "alter", "kept"], "--partitions, --config or --delete-config"),
    ):
        done = subprocess.run(
            command(tqbroker_thread, *args), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode != 0, (args, done.stdout)
        assert done.stderr.count("\n") == 1, done.stderr
        assert words in done.stderr, done.stderr
    listed = tool(tqbroker_thread, "topics", "list")
    assert "stale" not in listed


def test_consume_next_waits_for_new_messages(tqbroker_thread: RunningBroker) -> None:
    tool(tqbroker_thread, "topics", "create", "live", "--partitions", "2")
    tool(tqbroker_thread, "produce", "live", stdin="old\n")
    reader = command(tqbroker_thread, "consume", "live", "-n", "2")
    with subprocess.Popen(reader, stdout=subprocess.PIPE, text=True) as consumer:
        wait_for_consumers(tqbroker_thread, "live-0", "live-1")  # it subscribes at "next"
        tool(tqbroker_thread, "produce", "live", stdin="new1\nnew2\n")
        out, _ = consumer.communicate(timeout=30)
    assert sorted(out.split()) == ["new1", "new2"]


def test_group_consumption_resumes_at_the_commit(tqbroker_thread: RunningBroker) -> None:
    tool(tqbroker_thread, "topics", "create", "jobs", "--partitions", "4")
    tool(tqbroker_thread, "produce", "jobs", stdin="".join(f"j{n}\n" for n in range(20)))
    first = tool(tqbroker_thread, "consume", "jobs", "--group", "g", "--from", "first", "-n", "8")
    eventually(lambda: committed(tqbroker_thread, "jobs", "g") == 8)
    rest = tool(tqbroker_thread, "consume", "jobs", "--group", "g", "--idle", "1.5")
    assert sorted(first.split() + rest.split()) == sorted(f"j{n}" for n in range(20))


def test_errors_are_one_line_and_exit_1_or_2(tqbroker_thread: RunningBroker) -> None:
    for args, status in (
        (["consume", "missing", "--idle", "1"], 1),
        (["consume", "missing", "--from", "yesterday"], 2),
        (["topics", "create", "t", "--partitions", "0"], 1),
        (["topics", "create", "a/b"], 2),
        (["consume", "t\u00f6 pic?", "--idle", "1"], 1),
        (["topics", "create", "t", "--url", api_url(tqbroker_thread, "guest:s3cret")], 1),
        (["consume", "t", "--format", "%z"], 2),
        (["topics", "describe"], 2),
        (["topics", "list", "--url", "ftp://guest:s3cret@127.0.0.1:1"], 2),
    ):
        done = subprocess.run(
            command(tqbroker_thread, *args), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == status, (args, done.stderr)
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("python -m tqbroker ctl"), done.stderr
        assert "s3cret" not in done.stderr


def test_credentials_are_never_printed(tqbroker_thread: RunningBroker) -> None:
    """A consumer that cannot reach the AMQP port, an API that refuses the login, an API that is
    not there: each says where, never with the password."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    tool(tqbroker_thread, "topics", "create", "secret")
    for args in (
        ["consume", "secret", "--amqp-url", f"amqp://guest:s3cret@127.0.0.1:{port}/"],
        ["consume", "secret", "--amqp-url", "amqp://guest:s3cret@127.0.0.1:{port"],
        ["topics", "list", "--url", f"http://guest:s3cret@127.0.0.1:{port}"],
        ["topics", "list", "--url", api_url(tqbroker_thread, "guest:s3cret")],
    ):
        done = subprocess.run(
            command(tqbroker_thread, *args), capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode in (1, 2), done.stderr
        assert "s3cret" not in done.stderr + done.stdout, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
    refused = subprocess.run(
        command(
            tqbroker_thread,
            "consume",
            "secret",
            "--amqp-url",
            f"amqp://guest:s3cret@127.0.0.1:{port}/",
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert f"amqp://127.0.0.1:{port}/" in refused.stderr  # says where
    with pytest.raises(ValueError, match="not an amqp:// URL") as bad:  # the client itself
        Client(f"http://guest:s3cret@127.0.0.1:{port}/")
    assert "s3cret" not in str(bad.value)


def test_a_group_member_takes_back_what_a_leaving_member_had(
    tqbroker_thread: RunningBroker,
) -> None:
    """The CLI re-consumes a revoked partition (it asks for basic.cancel notifications), so
    when the member that took it leaves, it reads it again."""
    tool(tqbroker_thread, "topics", "create", "shared", "--partitions", "2")
    # It stops once it has all 20 (or after 30 s without one: the assertion says what it had).
    stays = command(
        tqbroker_thread, "consume", "shared", "--group", "g", "-n", "20", "--idle", "30"
    )
    with subprocess.Popen(stays, stdout=subprocess.PIPE, text=True) as first:
        wait_for_consumers(tqbroker_thread, "shared-0", "shared-1")
        tool(tqbroker_thread, "consume", "shared", "--group", "g", "--idle", "1.5")  # joins, leaves
        tool(tqbroker_thread, "produce", "shared", stdin="".join(f"s{n}\n" for n in range(20)))
        out, _ = first.communicate(timeout=60)
    assert sorted(out.split()) == sorted(f"s{n}" for n in range(20))


def test_produce_takes_any_bytes_and_topic_names_are_quoted(tqbroker_thread: RunningBroker) -> None:
    tool(tqbroker_thread, "topics", "create", "t\u00f6pic?")
    tool(tqbroker_thread, "produce", "t\u00f6pic?", stdin=b"ok\n\xff\xfe\n")
    rows = tool(
        tqbroker_thread, "consume", "t\u00f6pic?", "--from", "first", "-n", "2", "--format", "json"
    ).splitlines()
    assert [json.loads(row)["value"] for row in rows] == ["ok", "\ufffd\ufffd"]


def test_a_broker_on_its_own_is_no_cluster(tqbroker_thread: RunningBroker) -> None:
    """``GET /cluster`` says ``{"cluster": false}``, ``cluster status`` says so, and ``topics
    describe`` has no Leader, Replicas or Isr columns."""
    assert httpx.get(f"{tqbroker_thread.http_url}/cluster", timeout=10).status_code == 401
    found = httpx.get(f"{tqbroker_thread.http_url}/cluster", auth=("guest", "guest"), timeout=10)
    assert found.json() == {"cluster": False}
    assert (
        tool(tqbroker_thread, "cluster", "status") == "Not a cluster: the broker runs on its own.\n"
    )
    assert json.loads(tool(tqbroker_thread, "cluster", "status", "--format", "json")) == {
        "cluster": False
    }
    tool(tqbroker_thread, "topics", "create", "solo-topic", "--partitions", "2")
    header = tool(tqbroker_thread, "topics", "describe", "solo-topic").splitlines()[1].split()
    assert header[-1] == "BYTES"
