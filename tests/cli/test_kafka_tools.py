"""The Kafka-style tools of ``tqbroker-ctl`` as a user runs them (real processes against a real
broker): ``topics list|describe|delete|alter``, ``groups list|describe|reset-offsets``,
``produce --key-separator/--header/--partition`` and ``consume --partition`` with a kcat
format string."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.ports import free_port
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(120)


def ctl_at(url: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tqbroker", "ctl", "--url", url, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ctl(
    broker: RunningBroker, *args: str, stdin: str = "", status: int = 0
) -> subprocess.CompletedProcess[str]:
    done = ctl_at(broker.http_url.replace("http://", "http://guest:guest@"), *args, stdin=stdin)
    assert done.returncode == status, (args, done.stdout, done.stderr)
    return done


def out(broker: RunningBroker, *args: str, stdin: str = "") -> str:
    return ctl(broker, *args, stdin=stdin).stdout


def test_topics_list_describe_alter_delete(tqbroker_thread: RunningBroker) -> None:
    b = tqbroker_thread
    out(b, "topics", "create", "orders", "--partitions", "2", "--arg", "x-max-age=7D")
    out(b, "produce", "orders", "--partition", "1", stdin="a\nb\n")
    assert out(b, "topics", "list").splitlines() == ["TOPIC   PARTITIONS", "orders  2"]
    assert json.loads(out(b, "topics", "list", "--format", "json")) == [
        {"topic": "orders", "partitions": 2}
    ]
    described = out(b, "topics", "describe", "orders").splitlines()
    assert described[0].split("\t")[:3] == [
        "Topic: orders",
        "PartitionCount: 2",
        "Configs: x-max-age=7D,x-queue-type=stream",
    ]
    assert described[1].split() == [
        "PARTITION",
        "QUEUE",
        "LOG-START-OFFSET",
        "LOG-END-OFFSET",
        "MESSAGES",
        "SEGMENTS",
        "BYTES",
    ]
    assert described[2].split()[:5] == ["0", "orders-0", "0", "0", "0"]
    assert described[3].split()[:5] == ["1", "orders-1", "0", "2", "2"]
    shrink = ctl(b, "topics", "alter", "orders", "--partitions", "1", status=1)
    assert shrink.stderr == (
        "python -m tqbroker ctl topics alter: 400: Topic currently has 2 partitions, which is "
        "higher than the requested 1.\n"
    )
    assert "2 -> 3 partition(s)" in out(b, "topics", "alter", "orders", "--partitions", "3")
    assert "orders  3" in out(b, "topics", "list")
    assert "3 partition(s)" in out(b, "topics", "delete", "orders")
    assert out(b, "topics", "list").splitlines() == ["TOPIC  PARTITIONS"]
    gone = ctl(b, "topics", "describe", "orders", status=1)
    assert "404: no topic 'orders'" in gone.stderr


def test_produce_options_and_kcat_format(tqbroker_thread: RunningBroker) -> None:
    b = tqbroker_thread
    out(b, "topics", "create", "kv", "--partitions", "3")
    lines = "k1:v1\nk2:v:2\n"
    out(
        b,
        "produce",
        "kv",
        "--key-separator",
        ":",
        "--header",
        "h=1",
        "--header",
        "s=x y",
        stdin=lines,
    )
    out(b, "produce", "kv", "--partition", "2", "--key", "fixed", stdin="p2\n")
    printed = out(
        b, "consume", "kv", "--from", "first", "-n", "3", "--format", r"%t|%p|%o|%k|%s|%h|%S|%K\n"
    )
    rows = sorted(printed.splitlines(), key=lambda r: r.split("|")[4])
    keyed = [r.split("|") for r in rows]
    assert [(r[3], r[4], r[5], r[6], r[7]) for r in keyed] == [
        ("fixed", "p2", "", "2", "5"),
        ("k1", "v1", "h=1,s=x y", "2", "2"),
        ("k2", "v:2", "h=1,s=x y", "3", "2"),  # split at the first separator, as Kafka
    ]
    assert all(r[0] == "kv" for r in keyed)
    assert keyed[0][1] == "2"  # --partition 2
    only = out(
        b,
        "consume",
        "kv",
        "--partition",
        "2",
        "--from",
        "first",
        "--idle",
        "1",
        "--format",
        r"%p %s\n",
    )
    assert "2 p2" in only.splitlines()
    assert {line.split()[0] for line in only.splitlines()} == {"2"}
    as_json = json.loads(
        out(
            b, "consume", "kv", "--partition", "2", "--from", "first", "-n", "1", "--format", "json"
        )
    )
    assert (as_json["partition"], as_json["offset"]) == (2, 0)
    missing = ctl(
        b, "produce", "kv", "--key-separator", ":", stdin="ok:1\nno separator\n", status=1
    )
    assert "No key separator found on line number 2: 'no separator'" in missing.stderr
    ctl(b, "produce", "kv", "--header", "novalue", stdin="x\n", status=2)
    ctl(b, "consume", "kv", "--partition", "7", "--idle", "1", status=1)


def test_groups_list_describe_and_reset(tqbroker_thread: RunningBroker) -> None:
    b = tqbroker_thread
    out(b, "topics", "create", "jobs", "--partitions", "2")
    out(b, "produce", "jobs", stdin="".join(f"j{n}\n" for n in range(10)))
    assert out(b, "groups", "list").splitlines() == ["GROUP  TOPIC  STATE  MEMBERS"]
    out(b, "consume", "jobs", "--group", "g", "--from", "first", "-n", "10")
    assert out(b, "groups", "list").splitlines()[1].split() == ["g", "jobs", "Empty", "0"]
    described = out(b, "groups", "describe", "--group", "g").splitlines()
    assert described[0] == "Consumer group 'g' has no active members."
    assert described[2].split() == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    ]
    rows = [json.loads(out(b, "groups", "describe", "--group", "g", "--format", "json"))]
    assert [(r["partition"], r["lag"], r["consumer_id"]) for r in rows[0]] == [
        (0, 0, None),
        (1, 0, None),
    ]
    # Without --execute nothing changes (and a warning says so), as in Kafka.
    dry = ctl(b, "groups", "reset-offsets", "--group", "g", "--topic", "jobs", "--to-earliest")
    assert "--execute option is missing" in dry.stderr
    assert [r.split() for r in dry.stdout.splitlines()] == [
        ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"],
        ["g", "jobs", "0", "0"],
        ["g", "jobs", "1", "0"],
    ]
    lags = json.loads(out(b, "groups", "describe", "--group", "g", "--format", "json"))
    assert [r["lag"] for r in lags] == [0, 0]
    out(
        b,
        "groups",
        "reset-offsets",
        "--group",
        "g",
        "--topic",
        "jobs:1",
        "--to-offset",
        "3",
        "--execute",
    )
    lags = json.loads(
        out(b, "groups", "describe", "--group", "g", "--topic", "jobs", "--format", "json")
    )
    assert [r["current_offset"] for r in lags] == [5, 3]
    again = out(b, "consume", "jobs", "--group", "g", "--idle", "1.5")
    assert len(again.split()) == 2  # what follows offset 3 on partition 1
    ctl(
        b,
        "groups",
        "reset-offsets",
        "--group",
        "g",
        "--topic",
        "jobs",
        "--to-datetime",
        "soon",
        status=2,
    )
    ctl(b, "groups", "reset-offsets", "--group", "g", "--topic", "jobs", status=2)
    unknown = ctl(b, "groups", "describe", "--group", "nobody", status=1)
    assert "Consumer group 'nobody' does not exist." in unknown.stderr


def test_the_console_script_is_the_same_tool(tqbroker_thread: RunningBroker) -> None:
    script = Path(sys.executable).parent / "tqbroker-ctl"
    if not script.exists():
        found = shutil.which("tqbroker-ctl")
        if found is None:
            pytest.skip("tqbroker-ctl is not installed (pip install -e . installs it)")
        script = Path(found)
    url = tqbroker_thread.http_url.replace("http://", "http://guest:guest@")
    done = subprocess.run(
        [str(script), "topics", "list"],
        env={"TQBROKER_URL": url, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "TOPIC  PARTITIONS\n"), done.stderr


def test_a_url_list_passes_over_a_node_that_refuses_connections(
    tqbroker_thread: RunningBroker,
) -> None:
    """As Kafka's ``--bootstrap-server`` list: the first node is down (nothing listens on its
    port), the command runs on the next; with every node down it says which it tried."""
    live = tqbroker_thread.http_url.replace("http://", "http://guest:guest@")
    dead = f"http://guest:guest@127.0.0.1:{free_port()}"
    listing = ctl_at(f"{dead},{live}", "topics", "list")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[0].split() == ["TOPIC", "PARTITIONS"]
    other = f"http://guest:guest@127.0.0.1:{free_port()}"
    failed = ctl_at(f"{dead},{other}", "topics", "list")
    assert failed.returncode == 1
    assert "no node answers" in failed.stderr
    assert dead.removeprefix("http://guest:guest@") in failed.stderr
    assert "guest:guest" not in failed.stderr  # credentials never shown
