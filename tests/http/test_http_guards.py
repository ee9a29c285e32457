"""The HTTP API's guards, with httpx over loopback: a user's vhost permissions, loopback-only
users (``guest``) refused from elsewhere, ``GET /health`` reporting a backend that cannot write,
and a produce whose fsync failed or is still in flight never answered 201."""

from __future__ import annotations

import errno
import threading
from array import array

import httpx
import pika
import pytest

from tests.support.brokers import MakeBroker
from tqbroker.auth import authenticator as auth_authenticator
from tqbroker.auth import is_loopback
from tqbroker.backends.log import segment as segment_module
from tqbroker.config import PermissionConfig, UserConfig
from tqbroker.recordbatch import BinaryColumn, WriteBatch, encode_write
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(60)

USERS = (
    UserConfig(
        "guest",
        "guest",
        tags=("administrator",),
        permissions={"/": PermissionConfig(), "other": PermissionConfig()},
    ),
    UserConfig("limited", "secret", tags=("management",), permissions={"/": PermissionConfig()}),
    UserConfig(
        "remote",
        "secret",
        tags=("administrator",),
        permissions={"/": PermissionConfig(), "other": PermissionConfig()},
    ),
)
STREAM = {"x-queue-type": "stream"}


@pytest.fixture
def broker(make_broker: MakeBroker) -> RunningBroker:
    return make_broker(vhosts=("/", "other"), users=USERS)


def client(broker: RunningBroker, user: str, password: str, **kwargs: object) -> httpx.Client:
    return httpx.Client(
        base_url=broker.http_url,
        auth=(user, password),
        timeout=10,
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_user_reaches_only_the_vhosts_it_may_open(broker: RunningBroker) -> None:
    with (
        client(broker, "limited", "secret") as limited,
        client(broker, "remote", "secret") as anyone,
    ):
        other = {"vhost": "other"}
        assert anyone.put("/topics/t", json={"partitions": 1}, params=other).status_code == 201
        for response in (
            limited.put("/topics/mine", json={"partitions": 1}, params=other),
            limited.post("/topics/t/messages", json={"value": "x"}, params=other),
            limited.get("/topics/t/messages", params=other),
            limited.get("/topics/t/offsets", params=other),
            limited.post("/topics/t/records", content=b"", params=other),
            limited.get("/topics/t/partitions/0/records", params=other),
            limited.get("/topics/t/groups/g", params=other),
        ):
            assert response.status_code == 403, response.text
            assert "no access to vhost 'other'" in response.json()["message"]
        # Nothing was written or declared there; the vhost it may use works.
        offsets = anyone.get("/topics/t/offsets", params=other).json()
        assert [p["latest"] for p in offsets["partitions"]] == [0]
        assert anyone.get("/topics/mine/offsets", params=other).status_code == 404
        assert limited.put("/topics/mine", json={"partitions": 1}).status_code == 201
        assert limited.post("/topics/mine/messages", json={"value": "x"}).status_code == 201


def test_a_wrong_password_is_refused_after_a_right_one(broker: RunningBroker) -> None:
    """Verified credentials are cached (the hash is slow): the cache must be keyed by the
    password too."""
    for user, right in (("guest", "guest"), ("remote", "secret")):
        with client(broker, user, right) as good, client(broker, user, "wrong") as bad:
            assert good.get("/topics/none/offsets").status_code == 404  # logged in
            refused = bad.get("/topics/none/offsets")
            assert refused.status_code == 401, refused.text
            assert good.get("/topics/none/offsets").status_code == 404


def test_is_loopback_is_the_loopback_ranges() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1"):
        assert is_loopback(host), host
    for host in ("10.0.0.1", "192.0.2.1", "::", "fe80::1%eth0", "localhost", ""):
        assert not is_loopback(host), host


def test_a_loopback_only_user_is_refused_from_another_address(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker takes all of 127.0.0.0/8 as loopback, and tests talk to 127.0.0.1 only: to
    run the refusal with a real peer address, this narrows the classifier to 127.0.0.1 and
    connects from 127.0.0.2 (a socket bound there): ``guest`` is refused (401), another user
    from that address and ``guest`` from 127.0.0.1 are not."""
    seen: list[str] = []

    def only_127_0_0_1(host: str) -> bool:
        seen.append(host)
        return host == "127.0.0.1"

    monkeypatch.setattr(auth_authenticator, "is_loopback", only_127_0_0_1)
    elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
    with (
        client(broker, "guest", "guest", transport=elsewhere) as guest_elsewhere,
        client(
            broker, "remote", "secret", transport=httpx.HTTPTransport(local_address="127.0.0.2")
        ) as remote_elsewhere,
        client(broker, "guest", "guest") as guest_here,
    ):
        refused = guest_elsewhere.put("/topics/t", json={"partitions": 1})
        assert refused.status_code == 401, refused.text
        assert "can only connect via localhost" in refused.json()["message"]
        assert seen == ["127.0.0.2"]  # the peer address the server saw
        assert remote_elsewhere.put("/topics/t", json={"partitions": 1}).status_code == 201
        assert guest_here.post("/topics/t/messages", json={"value": "x"}).status_code == 201
        assert guest_elsewhere.get("/topics/t/offsets").status_code == 401


def failing_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    def sync(segment: segment_module.Segment, *, indexes: bool = True) -> None:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(segment_module.Segment, "sync", sync)


def test_health_is_503_once_a_backend_cannot_write(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    with httpx.Client(base_url=broker.http_url, timeout=10) as anonymous:
        assert anonymous.get("/health").json() == {"status": "ok", "alarms": []}
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.confirm_delivery()
        channel.queue_declare("d", durable=True, arguments={"x-queue-backend": "log"})
        failing_fsync(monkeypatch)
        with pytest.raises(pika.exceptions.NackError):
            channel.basic_publish("", "d", b"x", pika.BasicProperties(delivery_mode=2))
        health = anonymous.get("/health")
        assert health.status_code == 503
        assert health.json() == {"status": "degraded", "failing_backends": ["log"], "alarms": []}
        channel.connection.close()


@pytest.mark.parametrize("route", ["messages", "records"])
def test_a_produce_whose_fsync_failed_is_not_201(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch, route: str
) -> None:
    """The write failed to become durable: 503, and a retry is refused too (the backend stays
    failed until a restart); a reader never sees the records."""
    with client(broker, "guest", "guest") as http:
        channel = pika.BlockingConnection(pika.URLParameters(broker.url)).channel()
        channel.queue_declare("s", durable=True, arguments=STREAM)
        assert http.post("/topics/s/messages", json={"value": "kept"}).status_code == 201
        failing_fsync(monkeypatch)

        def produce() -> httpx.Response:
            if route == "messages":
                return http.post("/topics/s/messages", json={"records": [{"value": "lost"}]})
            batch = WriteBatch(
                array("i", [-1]),
                BinaryColumn.of([b""]),
                BinaryColumn.of([b"lost"]),
                BinaryColumn.of([b""]),
            )
            return http.post("/topics/s/records", content=encode_write(batch))

        for _ in range(2):
            failed = produce()
            assert failed.status_code == 503, failed.text
            assert failed.json()["error"] == "unavailable"
        read = http.get("/topics/s/messages").json()
        assert [m["value"] for m in read["messages"]] == ["kept"]
        channel.connection.close()


def test_a_produce_answers_only_once_its_fsync_is_done(
    broker: RunningBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, entered = threading.Event(), threading.Event()
    real = segment_module.Segment.sync

    def held(segment: segment_module.Segment, *, indexes: bool = True) -> None:
        entered.set()
        release.wait(30)
        real(segment, indexes=indexes)

    with client(broker, "guest", "guest") as http:
        assert http.put("/topics/h", json={"partitions": 1}).status_code == 201
        monkeypatch.setattr(segment_module.Segment, "sync", held)
        answers: list[httpx.Response] = []
        producer = threading.Thread(
            target=lambda: answers.append(http.post("/topics/h/messages", json={"value": "v"}))
        )
        producer.start()
        assert entered.wait(10)
        producer.join(0.5)
        assert answers == []  # no answer while the fsync is in flight
        release.set()
        producer.join(10)
        assert [a.status_code for a in answers] == [201]
