"""Talking to a broker's HTTP API for the command line: ``--url`` (``TQBROKER_URL``) names the
API and carries the credentials, ``http://user:password@host:15672``, or several nodes of a
cluster, comma-separated (as Kafka's ``--bootstrap-server``): a node that refuses the
connection or cannot be resolved is passed over for the next (never one that may have taken
the request: a timeout or an error reply is the answer). The AMQP address a consumer needs is
asked of the broker (``/api/overview``'s listeners) unless ``--amqp-url`` says. Credentials
never appear in a message: errors name ``Target.shown``, the URL without them.

Failures are ``CommandError``s (one line, exit status 1); a setting that cannot be used is a
``UsageError`` (exit status 2).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import attrs

DEFAULT_URL = "http://guest:guest@127.0.0.1:15672"
URL_VARIABLE = "TQBROKER_URL"
AMQP_URL_VARIABLE = "TQBROKER_AMQP_URL"
DEFAULT_AMQP_PORT = 5672


class CommandError(Exception):
    """A problem to report in one line (exit status 1)."""


class UsageError(CommandError):
    """A command line that cannot be used as given (exit status 2)."""


class _Refused(Exception):
    """The node took no connection (refused, or its name does not resolve): nothing sent."""


def quote(text: str) -> str:
    """A path segment: vhost ``/`` is ``%2F``, as RabbitMQ's API wants it."""
    return urllib.parse.quote(text, safe="")


def redact(url: str) -> str:
    """``url`` without its user and password."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(an unparsable URL)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@attrs.frozen
class Target:
    """Where the HTTP API is (``base``, no credentials) and who logs in."""

    base: str
    host: str
    user: str
    password: str

    @property
    def shown(self) -> str:
        return self.base

    @classmethod
    def parse(cls, url: str) -> Target:
        shown = redact(url)
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018 (raises ValueError for a bad port)
        except ValueError:
            raise UsageError(f"--url: not a valid URL: {shown}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--url wants http://user:password@host:port (got {shown})")
        user = urllib.parse.unquote(parts.username or "guest")
        password = urllib.parse.unquote(parts.password or "guest")
        return cls(shown.rstrip("/"), parts.hostname, user, password)


def settings_url(given: str | None) -> str:
    return given or os.environ.get(URL_VARIABLE) or DEFAULT_URL


class Api:
    """The broker's HTTP API (the management API under ``/api``, topics under ``/topics``)."""

    def __init__(self, url: str | None, vhost: str = "/", timeout: float = 60) -> None:
        self.targets = [Target.parse(u.strip()) for u in settings_url(url).split(",") if u]
        if not self.targets:
            raise UsageError("--url: no URL given")
        self.vhost = vhost
        self.timeout = timeout

    @property
    def target(self) -> Target:
        """The node in use: the first that took a connection."""
        return self.targets[0]

    def request(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The decoded JSON reply (None for an empty one); ``CommandError`` for an error
        status, naming the server's reason. A node that refuses the connection is passed
        over for the next one (see the module doc)."""
        refused: list[str] = []
        for _ in range(len(self.targets)):
            try:
                return self._request(method, path, body, query=query, headers=headers)
            except _Refused as exc:
                refused.append(str(exc))
                if len(self.targets) == 1:
                    raise CommandError(refused[0]) from None
                self.targets.append(self.targets.pop(0))
        raise CommandError("no node answers: " + "; ".join(refused))

    def _request(
        self,
        method: str,
        path: str,
        body: object,
        *,
        query: dict[str, str] | None,
        headers: dict[str, str] | None,
    ) -> Any:
        url = self.target.base + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = json.dumps(body).encode() if body is not None else None
        credentials = f"{self.target.user}:{self.target.password}".encode()
        sent = {
            "content-type": "application/json",
            "authorization": "Basic " + base64.b64encode(credentials).decode(),
            **(headers or {}),
        }
        request = urllib.request.Request(url, data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise CommandError(f"{exc.code}: {_reason(exc)}") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, ConnectionRefusedError | socket.gaierror):
                raise _Refused(f"cannot reach {self.target.shown}: {exc.reason}") from None
            raise CommandError(f"cannot reach {self.target.shown}: {exc.reason}") from None
        except OSError as exc:
            raise CommandError(f"cannot reach {self.target.shown}: {exc}") from None
        try:
            return json.loads(raw) if raw.strip() else None
        except ValueError:
            raise CommandError(f"{self.target.shown}{path}: the reply is not JSON") from None

    def get(self, path: str, **query: str) -> Any:
        return self.request("GET", path, query=query or None)

    def topic_query(self) -> dict[str, str] | None:
        """The topic routes take the vhost as a parameter."""
        return {"vhost": self.vhost} if self.vhost != "/" else None

    def topics(self, method: str, path: str, body: object = None) -> Any:
        """A request to the topic routes (``/topics...``, ``/groups``) in the vhost."""
        return self.request(method, path, body, query=self.topic_query())

    def amqp_url(self, override: str | None) -> str:
        """The AMQP URL to consume from: ``override`` (``--amqp-url``, ``TQBROKER_AMQP_URL``),
        else the broker's AMQP listener at the API's host, with the API's credentials."""
        given = override or os.environ.get(AMQP_URL_VARIABLE)
        vhost = "" if self.vhost == "/" else quote(self.vhost)
        if given:
            if not given.startswith("amqp://"):
                raise UsageError(f"--amqp-url wants amqp://host:port (got {redact(given)})")
            return given if self.vhost == "/" else given.rstrip("/") + "/" + vhost
        port = DEFAULT_AMQP_PORT
        try:
            overview = self.get("/api/overview")
        except CommandError:
            overview = None  # an older broker: the default port
        if isinstance(overview, dict):
            for listener in overview.get("listeners", []):
                if listener.get("protocol") == "amqp" and isinstance(listener.get("port"), int):
                    port = listener["port"]
                    break
        host = self.target.host
        host = f"[{host}]" if ":" in host else host
        user, password = quote(self.target.user), quote(self.target.password)
        return f"amqp://{user}:{password}@{host}:{port}/{vhost}"


def _reason(exc: urllib.error.HTTPError) -> str:
    """The server's words: tqbroker's ``message``, RabbitMQ's ``reason``."""
    try:
        body = json.loads(exc.read())
    except (ValueError, OSError):
        return str(exc.reason)
    if isinstance(body, dict):
        for key in ("message", "reason", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key]).strip()
            if isinstance(body.get(key), list):  # RabbitMQ's ["no_such_user", "bob"]
                return json.dumps(body[key])
    return str(exc.reason)
