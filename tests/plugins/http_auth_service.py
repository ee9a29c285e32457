"""A small auth service for the HTTP auth backend's tests: RabbitMQ's
``rabbitmq_auth_backend_http`` contract served by Starlette on hypercorn (its Trio worker) in a
thread of its own, on 127.0.0.1. It answers from tables and records every request."""

from __future__ import annotations

import queue
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast
from urllib.parse import parse_qsl

import attrs
import hypercorn.config
import hypercorn.trio
import trio
from hypercorn.typing import Framework
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

KINDS = ("user", "vhost", "resource", "topic")


@attrs.define
class AuthService:
    """The tables: ``users`` name -> (password, answer) (a password of None: any, or none, is
    accepted: a certificate user); ``vhosts`` (user, vhost) allowed; ``resources`` (user, vhost,
    name, resource, permission) allowed (name ``*``: any); ``topics`` (user, vhost, exchange,
    routing key, permission) allowed. ``delay`` seconds before each answer; ``status`` and
    ``body`` override every answer. ``requests`` are (kind, method, fields) in order of
    arrival."""

    users: dict[str, tuple[str | None, str]] = attrs.field(factory=dict)
    vhosts: set[tuple[str, str]] = attrs.field(factory=set)
    resources: set[tuple[str, str, str, str, str]] = attrs.field(factory=set)
    topics: set[tuple[str, str, str, str, str]] = attrs.field(factory=set)
    delay: float = 0.0
    status: int = 200
    body: str | None = None
    requests: list[tuple[str, str, dict[str, str]]] = attrs.field(factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    url: str = ""
    epoch: int = 0

    def count(self, kind: str) -> int:
        return sum(1 for k, _, _ in self.requests if k == kind)

    def fields(self, kind: str) -> list[dict[str, str]]:
        return [f for k, _, f in self.requests if k == kind]

    def decide(self, kind: str, f: dict[str, str]) -> str:
        user = f.get("username", "")
        if kind == "user":
            password, answer = self.users.get(user, ("\0", "deny"))
            return answer if password is None or f.get("password") == password else "deny"
        if kind == "vhost":
            return "allow" if (user, f["vhost"]) in self.vhosts else "deny"
        key = (user, f["vhost"], f["name"])
        if kind == "resource":
            wanted = (f["resource"], f["permission"])
            anything = (user, f["vhost"], "*", *wanted) in self.resources
            return "allow" if anything or (*key, *wanted) in self.resources else "deny"
        topic = (*key, f["routing_key"], f["permission"])
        return "allow" if topic in self.topics else "deny"

    async def answer(self, request: Request) -> PlainTextResponse:
        kind = request.path_params["kind"]
        if request.method == "POST":
            fields = dict(parse_qsl((await request.body()).decode(), keep_blank_values=True))
        else:
            fields = dict(request.query_params)
        self.requests.append((kind, request.method, fields))
        epoch = self.epoch
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await trio.sleep(self.delay)
        finally:
            if epoch == self.epoch:  # not a straggler from before a reset
                self.in_flight -= 1
        body = self.body if self.body is not None else self.decide(kind, fields)
        return PlainTextResponse(body, status_code=self.status)

    def path(self, kind: str) -> str:
        return f"{self.url}/auth/{kind}"

    def options(self, **more: object) -> dict[str, object]:
        """The broker's ``[auth_backend_options.http]`` for this service."""
        return {f"{kind}_path": self.path(kind) for kind in KINDS} | more

    def reset(self) -> None:
        self.requests.clear()
        self.delay, self.status, self.body = 0.0, 200, None
        self.in_flight = self.most_in_flight = 0
        self.epoch += 1


@attrs.frozen
class ServiceTls:
    """HTTPS for the service: its certificate and key (PEM files), and the CA file whose
    client certificates it requires (None: no client certificate asked for)."""

    certfile: str
    keyfile: str
    client_ca: str | None = None


@contextmanager
def running_service(service: AuthService, tls: ServiceTls | None = None) -> Iterator[AuthService]:
    """Serve ``service`` on 127.0.0.1 (an ephemeral port, ``service.url``) until the block
    ends, over HTTPS with ``tls``."""
    routes = [Route("/auth/{kind}", service.answer, methods=["GET", "POST"])]
    app = cast(Framework, Starlette(routes=routes))  # hypercorn's types: any ASGI app
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = config.errorlog = None
    config.graceful_timeout = 0.2  # handlers still sleeping (a slow-service test) are cut
    if tls is not None:
        config.certfile, config.keyfile = tls.certfile, tls.keyfile
        if tls.client_ca is not None:
            config.ca_certs, config.verify_mode = tls.client_ca, ssl.CERT_REQUIRED
    started: queue.Queue[str | BaseException] = queue.Queue()
    stop: list[tuple[trio.lowlevel.TrioToken, trio.Event]] = []

    async def main() -> None:
        done = trio.Event()
        stop.append((trio.lowlevel.current_trio_token(), done))
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: hypercorn.trio.serve(
                    app, config, shutdown_trigger=done.wait, task_status=task_status
                )
            )
            started.put(binds[0])

    def thread_main() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            started.put(exc)

    thread = threading.Thread(target=thread_main, name="auth-service", daemon=True)
    thread.start()
    url = started.get(timeout=30)
    if isinstance(url, BaseException):
        raise RuntimeError("the auth service failed to start") from url
    service.url = url
    try:
        yield service
    finally:
        token, done = stop[0]
        trio.from_thread.run_sync(done.set, trio_token=token)
        thread.join(timeout=10)
