"""The HTTP auth backend (plugins/auth_http) asked directly, from Trio, against a real Starlette
service on 127.0.0.1: the fields of each path as RabbitMQ sends them (GET and POST), answers
and tags, EXTERNAL without a password, errors that refuse without a password in the message,
the cache and the bound on requests in flight. (The broker's use of it: test_auth_http_broker.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from tqbroker_auth_http import AnswerCache, BadAnswer, HttpAuthBackend, Query, parse_answer

from tqbroker.auth import AuthConfigError, load_chain
from tqbroker.plugins import AuthBackendError, AuthUser, Peer

from .http_auth_service import AuthService, running_service

pytestmark = pytest.mark.timeout(30)

PEER = Peer("127.0.0.1")
ALICE = AuthUser("alice", frozenset({"management"}), "http")


@pytest.fixture(scope="module")
def shared() -> Iterator[AuthService]:
    service = AuthService(
        users={"alice": ("s3cret p&ss", "allow management"), "cert-user": (None, "allow")},
        vhosts={("alice", "/")},
        resources={
            ("alice", "/", "q1", "queue", "configure"),
            ("alice", "/", "amq.default", "exchange", "write"),
        },
        topics={("alice", "/", "events", "eu.orders", "write")},
    )
    with running_service(service):
        yield service


@pytest.fixture
def service(shared: AuthService) -> AuthService:
    shared.reset()
    return shared


def dead_paths() -> dict[str, Any]:
    """The four paths, on a port where nothing listens."""
    kinds = ("user", "vhost", "resource", "topic")
    return {f"{k}_path": f"http://127.0.0.1:1/auth/{k}" for k in kinds}


def backend(service: AuthService, **options: object) -> HttpAuthBackend:
    chain = load_chain(["http"], {"http": service.options(**options)})
    found = chain.backends["http"]
    assert isinstance(found, HttpAuthBackend)
    return found


@pytest.mark.parametrize("method", ["get", "post"])
async def test_each_path_gets_rabbitmqs_fields(service: AuthService, method: str) -> None:
    http = backend(service, http_method=method, cache_ttl=0)
    user = await http.authenticate("alice", "s3cret p&ss", PEER)
    assert user == AuthUser("alice", frozenset({"management"}), "http")
    assert await http.authenticate("alice", "wrong", PEER) is None
    assert await http.authenticate("mallory", "x", PEER) is None
    assert await http.check_vhost(ALICE, "/", PEER)
    assert not await http.check_vhost(ALICE, "other", PEER)
    assert await http.check_resource(ALICE, "/", "queue", "q1", "configure")
    assert not await http.check_resource(ALICE, "/", "queue", "q1", "read")
    assert await http.check_resource(ALICE, "/", "exchange", "amq.default", "write")
    variables = {"username": "alice", "vhost": "/", "client_id": "c1"}
    assert await http.check_topic(ALICE, "/", "events", "eu.orders", "write", variables)
    assert not await http.check_topic(ALICE, "/", "events", "us.orders", "write", variables)
    assert {m for _, m, _ in service.requests} == {method.upper()}
    assert service.fields("user")[0] == {"username": "alice", "password": "s3cret p&ss"}
    assert service.fields("vhost")[0] == {
        "username": "alice",
        "vhost": "/",
        "ip": "127.0.0.1",
        "tags": "management",
    }
    assert service.fields("resource")[0] == {
        "username": "alice",
        "vhost": "/",
        "resource": "queue",
        "name": "q1",
        "permission": "configure",
        "tags": "management",
    }
    assert service.fields("topic")[0] == {
        "username": "alice",
        "vhost": "/",
        "resource": "topic",
        "name": "events",
        "permission": "write",
        "tags": "management",
        "routing_key": "eu.orders",
        "variable_map.client_id": "c1",
        "variable_map.username": "alice",
        "variable_map.vhost": "/",
    }


async def test_external_login_sends_no_password(service: AuthService) -> None:
    http = backend(service)
    assert await http.authenticate("cert-user", None, PEER) == AuthUser("cert-user", (), "http")
    assert service.fields("user") == [{"username": "cert-user"}]


async def test_tags_come_from_the_answer(service: AuthService) -> None:
    service.body = "  Allow administrator  management\tmonitoring \n"
    user = await backend(service).authenticate("anyone", "pw", PEER)
    assert user is not None
    assert user.tags == {"administrator", "management", "monitoring"}


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (500, "allow", "HTTP 500"),
        (302, "allow", "HTTP 302"),
        (200, "yes", "unexpected answer"),
        (200, "allowed", "unexpected answer"),
        (200, "", "unexpected answer"),
        (200, "allow " + "x" * 70_000, "an answer longer than 65536 bytes"),
    ],
)
async def test_anything_but_allow_or_deny_refuses_without_the_password(
    service: AuthService, status: int, body: str, problem: str
) -> None:
    service.status, service.body = status, body
    http = backend(service)
    generation = http.generation
    with pytest.raises(AuthBackendError, match=problem) as raised:
        await http.authenticate("alice", "s3cret p&ss", PEER)
    assert "s3cret" not in str(raised.value)
    assert service.path("user") in str(raised.value)
    assert http.generation != generation  # the broker keeps no failure
    assert len(http.cache) == 0
    service.reset()
    assert await http.authenticate("alice", "s3cret p&ss", PEER) is not None


async def test_a_deny_reason_is_logged_without_the_password(
    service: AuthService, caplog: pytest.LogCaptureFixture
) -> None:
    service.body = "deny wrong password 's3cret p&ss' (s3cret+p%26ss)"
    with caplog.at_level(logging.INFO):
        assert await backend(service).authenticate("alice", "s3cret p&ss", PEER) is None
    assert "HTTP auth service denied user 'alice': wrong password '***' (***)" in caplog.text
    assert "s3cret" not in caplog.text


async def test_a_resource_answer_with_tags_is_malformed(service: AuthService) -> None:
    service.body = "allow administrator"
    with pytest.raises(AuthBackendError, match="unexpected answer"):
        await backend(service).check_resource(ALICE, "/", "queue", "q1", "read")


async def test_no_service_and_a_slow_service_refuse_in_time(service: AuthService) -> None:
    dead = HttpAuthBackend(**dead_paths())
    with pytest.raises(AuthBackendError, match="ConnectError"):
        await dead.authenticate("alice", "pw", PEER)
    service.delay = 1
    slow = backend(service, timeout=0.2)
    started = trio.current_time()
    with pytest.raises(AuthBackendError, match=r"no answer within 0.2 s"):
        await slow.check_vhost(ALICE, "/", PEER)
    assert trio.current_time() - started < 1.0


async def test_answers_are_cached_for_their_ttl(service: AuthService) -> None:
    now = [100.0]
    http = backend(service, cache_ttl=10, deny_cache_ttl=1, clock=lambda: now[0])
    for _ in range(3):
        assert await http.authenticate("alice", "s3cret p&ss", PEER) is not None
        assert await http.authenticate("alice", "wrong", PEER) is None
    assert service.count("user") == 2  # one allow, one deny, each asked once
    now[0] += 1.5  # the deny expired, the allow not
    assert await http.authenticate("alice", "wrong", PEER) is None
    assert await http.authenticate("alice", "s3cret p&ss", PEER) is not None
    assert service.count("user") == 3
    now[0] += 10  # both expired
    assert await http.authenticate("alice", "s3cret p&ss", PEER) is not None
    assert service.count("user") == 4


async def test_requests_in_flight_are_bounded(service: AuthService) -> None:
    service.delay = 0.1
    http = backend(service, max_concurrent_requests=2, cache_ttl=0, deny_cache_ttl=0)
    async with trio.open_nursery() as nursery:
        for n in range(6):
            nursery.start_soon(http.check_resource, ALICE, "/", "queue", f"q{n}", "read")
    assert service.count("resource") == 6
    assert service.most_in_flight == 2


async def test_identical_questions_at_once_are_one_request(service: AuthService) -> None:
    service.delay = 0.2
    http = backend(service, cache_ttl=0)
    users: list[AuthUser | None] = []

    async def login(password: str) -> None:
        users.append(await http.authenticate("alice", password, PEER))

    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(login, "s3cret p&ss")
        nursery.start_soon(login, "wrong")
    assert service.count("user") == 2
    assert sum(user is not None for user in users) == 10
    service.status = 500  # an error reaches every waiting task, and is not kept
    with pytest.RaisesGroup(AuthBackendError, AuthBackendError, AuthBackendError):
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(login, "s3cret p&ss")
    assert service.count("user") == 3
    service.status, users[:] = 200, []

    async def impatient() -> None:
        with trio.move_on_after(0.05):
            await login("s3cret p&ss")

    async with trio.open_nursery() as nursery:  # the asker gives up: the waiting task asks
        nursery.start_soon(impatient)
        await trio.sleep(0.01)
        nursery.start_soon(login, "s3cret p&ss")
    assert service.count("user") == 5
    assert users == [AuthUser("alice", {"management"}, "http")]


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"http_method": "put"}, "http_method must be 'get' or 'post'"),
        ({"timeout": 0}, "timeout must be > 0"),
        ({"cache_ttl": -1}, "cache_ttl must be >= 0"),
        ({"max_concurrent_requests": 0}, "max_concurrent_requests must be >= 1"),
        ({"user_path": "ftp://x/auth"}, "user_path must be an http:// or https:// URL"),
        ({"colour": "red"}, "unexpected keyword argument 'colour'"),
    ],
)
def test_bad_options_are_a_clear_startup_error(options: dict[str, object], problem: str) -> None:
    base = dead_paths()
    with pytest.raises(AuthConfigError, match=f"auth backend 'http'.*{problem}"):
        load_chain(["http"], {"http": base | options})


def test_answers_as_rabbitmq_reads_them() -> None:
    assert parse_answer("user_path", "allow").allowed
    assert parse_answer("user_path", "ALLOW Administrator").tags == {"administrator"}
    assert parse_answer("vhost_path", "deny").allowed is False
    denied = parse_answer("resource_path", "deny  not\x07 yours ")
    assert (denied.allowed, denied.reason) == (False, "not? yours")
    for body in ("allow x", "allowx", "ok", "denied"):
        with pytest.raises(BadAnswer):
            parse_answer("vhost_path", body)


def test_cache_keys_hold_no_password_and_tell_queries_apart() -> None:
    cache = AnswerCache(ttl=60, deny_ttl=0, size=2)
    a = Query("user_path", (("username", "a"), ("password", "bc")))
    b = Query("user_path", (("username", "ab"), ("password", "c")))
    assert cache.key(a) != cache.key(b)
    assert b"bc" not in cache.key(a)
    assert AnswerCache(60, 0, 2).key(a) != cache.key(a)  # a key per process


def test_the_brokers_caches_last_one_cache_period_at_most() -> None:
    """``generation`` (what the broker's login and permission caches compare) moves every
    min(cache_ttl, deny_cache_ttl) seconds, and at every reading when that is 0."""
    now = [0.0]
    http = HttpAuthBackend(**dead_paths(), cache_ttl=5, deny_cache_ttl=2, clock=lambda: now[0])
    generation = http.generation
    now[0] += 1.9
    assert http.generation == generation
    now[0] += 0.2
    assert http.generation != generation
    uncached = HttpAuthBackend(**dead_paths(), deny_cache_ttl=0)
    assert uncached.generation != uncached.generation
