"""``HttpAuthBackend``: the I/O half. Asks the service with httpx (on Trio), keeps its answers
in ``AnswerCache``, bounds the requests in flight and the time each may take.

The client (one connection pool) belongs to the Trio run that first uses the backend: it is
closed by a Trio system task when that run ends (the broker's shutdown), so no socket outlives
the broker.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus, urlencode, urlsplit

import certifi
import httpx
import trio

from tqbroker.plugins import (
    AuthBackendError,
    AuthUser,
    Peer,
    PermissionKind,
    ResourceKind,
)

from .contract import (
    PATH_NAMES,
    SUCCESSFUL_STATUSES,
    Answer,
    AnswerCache,
    BadAnswer,
    PathName,
    Query,
    parse_answer,
    redact_url,
    resource_query,
    topic_query,
    user_query,
    vhost_query,
)

log = logging.getLogger(__name__)

BACKEND_NAME = "http"
MAX_BODY = 64 * 1024  # bytes of an answer read at most (an answer is a word and a few tags)
FORM = {"content-type": "application/x-www-form-urlencoded"}


def _number(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be {relation} {minimum:g}, not {value!r}")
    return float(value)


def _url(name: str, value: Any) -> str:
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https"):
        raise ValueError(f"{name} must be an http:// or https:// URL, not {value!r}")
    if not urlsplit(value).hostname:
        raise ValueError(f"{name} has no host: {redact_url(value)!r}")
    return value


class _HttpxRequestLines(logging.Filter):
    """httpx logs each request at INFO with its whole URL: for a GET to one of the service's
    paths the query (the password) is taken out of that line."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], httpx.URL):
            url = args[1]
            if url.query and str(url.copy_with(query=None)) in self.paths:
                record.args = (args[0], url.copy_with(query=b"redacted"), *args[2:])
        return True


REQUEST_LINES = _HttpxRequestLines()
logging.getLogger("httpx").addFilter(REQUEST_LINES)

SSL_OPTIONS = frozenset({"cacertfile", "certfile", "keyfile"})


def tls_context(options: Any) -> ssl.SSLContext:
    """The client TLS context of RabbitMQ's ``ssl_options`` (``cacertfile``: the CAs that sign
    the service's certificate, certifi's bundle by default; ``certfile`` and ``keyfile``: a
    client certificate). The service's certificate and host name are always verified."""
    if not isinstance(options, Mapping) or not set(options) <= SSL_OPTIONS:
        known = ", ".join(sorted(SSL_OPTIONS))
        raise ValueError(f"ssl_options must be a table of {known}, not {options!r}")
    for key, value in options.items():
        if not isinstance(value, str):
            raise ValueError(f"ssl_options.{key} must be a file name, not {value!r}")
    if "keyfile" in options and "certfile" not in options:
        raise ValueError("ssl_options.keyfile needs ssl_options.certfile")
    try:
        context = ssl.create_default_context(cafile=options.get("cacertfile", certifi.where()))
        if "certfile" in options:
            context.load_cert_chain(options["certfile"], options.get("keyfile"))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl_options: {exc}") from None
    return context


class HttpAuthBackend:
    """RabbitMQ's ``rabbitmq_auth_backend_http`` as a tqbroker auth backend (entry point
    ``http`` in ``tqbroker.auth_backends``); options from ``[auth_backend_options.http]``:

    - ``user_path``, ``vhost_path``, ``resource_path``, ``topic_path``: the service's URLs;
    - ``http_method``: ``get`` (RabbitMQ's default: fields in the query string) or ``post``
      (a form body: passwords stay out of the service's access log; recommended);
    - ``cache_ttl``: seconds an ``allow`` is kept (0: ask every time), ``deny_cache_ttl``:
      seconds a ``deny`` is kept; an error (no answer) is never kept;
    - ``timeout``: seconds a question may take, waiting for a free slot included;
    - ``max_concurrent_requests``: requests in flight at most (the pool's connections);
    - ``cache_size``: answers kept at most;
    - ``ssl_options``: for ``https://`` paths, ``cacertfile``, ``certfile``, ``keyfile``.
    """

    def __init__(
        self,
        *,
        user_path: str,
        vhost_path: str,
        resource_path: str,
        topic_path: str,
        http_method: str = "get",
        cache_ttl: float = 15.0,
        deny_cache_ttl: float = 1.0,
        timeout: float = 5.0,
        max_concurrent_requests: int = 16,
        cache_size: int = 10_000,
        ssl_options: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        given = (user_path, vhost_path, resource_path, topic_path)
        self.paths: dict[PathName, str] = {
            name: _url(name, value) for name, value in zip(PATH_NAMES, given, strict=True)
        }
        if not isinstance(http_method, str) or http_method.lower() not in ("get", "post"):
            raise ValueError(f"http_method must be 'get' or 'post', not {http_method!r}")
        self.method = http_method.lower()
        ttl = _number("cache_ttl", cache_ttl, minimum=0)
        deny_ttl = _number("deny_cache_ttl", deny_cache_ttl, minimum=0)
        self.timeout = _number("timeout", timeout, minimum=0, strict=True)
        concurrency = _number("max_concurrent_requests", max_concurrent_requests, minimum=1)
        size = _number("cache_size", cache_size, minimum=0)
        if not concurrency.is_integer() or not size.is_integer():
            raise ValueError("max_concurrent_requests and cache_size must be whole numbers")
        self.max_concurrent_requests = int(concurrency)
        self.cache = AnswerCache(ttl, deny_ttl, int(size), clock)
        self._tls = tls_context(ssl_options or {})
        REQUEST_LINES.paths.update(str(httpx.URL(path).copy_with(query=None)) for path in given)
        self._clock = clock
        # The broker's caches of our answers (its login cache, the channels' permission
        # caches) last while ``generation`` holds: it moves every min(ttl, deny_ttl) seconds
        # (at every reading when that is 0: the broker then keeps nothing) and with every
        # error (no failure is kept). Within that, our own cache gives each answer its TTL.
        self._period = min(ttl, deny_ttl)
        self._readings = 0
        self.requests = 0  # requests sent to the service
        self.errors = 0  # requests that got no answer
        self._flights: dict[bytes, _Flight] = {}  # requests on their way, by cache key
        self._run: tuple[trio.lowlevel.TrioToken, httpx.AsyncClient, trio.Semaphore] | None
        self._run = None

    @property
    def generation(self) -> int:
        if self._period > 0:
            return int(self._clock() / self._period) + self.errors
        self._readings += 1
        return self._readings + self.errors

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        answer = await self._ask(user_query(username, password))
        if not answer.allowed:
            return None
        return AuthUser(username, answer.tags, BACKEND_NAME)

    async def check_vhost(self, user: AuthUser, vhost: str, peer: Peer) -> bool:
        answer = await self._ask(vhost_query(user.name, user.tags, vhost, peer.host))
        return answer.allowed

    async def check_resource(
        self,
        user: AuthUser,
        vhost: str,
        kind: ResourceKind,
        name: str,
        permission: PermissionKind,
    ) -> bool:
        query = resource_query(user.name, user.tags, vhost, kind, name, permission)
        return (await self._ask(query)).allowed

    async def check_topic(
        self,
        user: AuthUser,
        vhost: str,
        exchange: str,
        routing_key: str,
        permission: PermissionKind,
        variables: Mapping[str, str],
    ) -> bool:
        query = topic_query(
            user.name, user.tags, vhost, exchange, routing_key, permission, variables
        )
        return (await self._ask(query)).allowed

    async def _ask(self, query: Query) -> Answer:
        """The cached answer, or the one of a request already on its way for the same query
        (a burst of identical logins is one request), or a new request's."""
        key = self.cache.key(query)
        while True:
            answer = self.cache.get(key)
            if answer is not None:
                return answer
            flight = self._flights.get(key)
            if flight is None:
                break
            await flight.done.wait()
            if flight.answer is not None:
                return flight.answer
            if flight.error is not None:
                raise AuthBackendError(flight.error)
            # the asking task was cancelled: ask again
        flight = self._flights[key] = _Flight()
        try:
            flight.answer = await self._request(query)
        except AuthBackendError as exc:
            flight.error = str(exc)
            raise
        finally:
            del self._flights[key]
            flight.done.set()
        self.cache.put(key, flight.answer)
        return flight.answer

    def _client(self) -> tuple[httpx.AsyncClient, trio.Semaphore]:
        """This Trio run's client and request slots (made on first use in a run)."""
        token = trio.lowlevel.current_trio_token()
        if self._run is None or self._run[0] is not token:
            limits = httpx.Limits(
                max_connections=self.max_concurrent_requests,
                max_keepalive_connections=self.max_concurrent_requests,
            )
            # trust_env=False: no proxy or netrc from the broker's environment.
            client = httpx.AsyncClient(
                timeout=self.timeout,
                limits=limits,
                verify=self._tls,
                follow_redirects=False,
                trust_env=False,
            )
            self._run = (token, client, trio.Semaphore(self.max_concurrent_requests))
            trio.lowlevel.spawn_system_task(_close_when_run_ends, client, name="auth_http")
        return self._run[1], self._run[2]

    async def _request(self, query: Query) -> Answer:
        url = self.paths[query.path]
        client, slots = self._client()
        form = urlencode(query.fields, quote_via=quote_plus)
        try:
            with trio.fail_after(self.timeout):
                async with slots:
                    self.requests += 1
                    if self.method == "get":
                        request = client.build_request("GET", url, params=query.fields)
                    else:
                        request = client.build_request("POST", url, content=form, headers=FORM)
                    response = await client.send(request, stream=True)
                    try:
                        status, body = response.status_code, await _read(response)
                    finally:
                        await response.aclose()
            if status not in SUCCESSFUL_STATUSES:
                raise AuthBackendError(f"HTTP {status}")
            answer = parse_answer(query.path, body.decode("utf-8", "replace"))
        except trio.TooSlowError:
            raise self._failed(query, f"no answer within {self.timeout:g} s") from None
        except httpx.HTTPError as exc:
            raise self._failed(query, _describe(exc)) from None
        except (AuthBackendError, BadAnswer) as exc:
            raise self._failed(query, str(exc)) from None
        if not answer.allowed and answer.reason:
            log.info(
                "HTTP auth service denied %s: %s", _subject(query), _scrub(answer.reason, query)
            )
        return answer

    def _failed(self, query: Query, problem: str) -> AuthBackendError:
        self.errors += 1
        where = redact_url(self.paths[query.path])
        problem = _scrub(problem, query)
        return AuthBackendError(f"HTTP auth service {where} ({query.path}): {problem}")


class _Flight:
    """A request on its way, for the tasks that wait for the same answer."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.answer: Answer | None = None
        self.error: str | None = None


async def _read(response: httpx.Response) -> bytes:
    body = b""
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_BODY:
            raise AuthBackendError(f"an answer longer than {MAX_BODY} bytes")
    return body


def _describe(exc: BaseException) -> str:
    """``ConnectError: <why>``; the words of the first cause that has some when the error has
    none (httpx on Trio wraps an ``ssl.SSLCertVerificationError`` in text-less errors)."""
    inner: BaseException | None = exc
    for _ in range(8):
        if inner is None or str(inner):
            break
        inner = inner.__cause__ or inner.__context__
    if inner is None or not str(inner):
        return type(exc).__name__
    if inner is exc:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {type(inner).__name__}: {inner}"


def _subject(query: Query) -> str:
    fields = dict(query.fields)
    user = fields.get("username", "")[:200]
    if query.path == "user_path":
        return f"user '{user}'"
    if query.path == "vhost_path":
        return f"access to vhost '{fields['vhost']}' for user '{user}'"
    return (
        f"{fields['permission']} access to {fields['resource']} '{fields['name']}' in vhost "
        f"'{fields['vhost']}' for user '{user}'"
    )


def _scrub(text: str, query: Query) -> str:
    """``text`` with the query's password (as sent, or percent-encoded) masked."""
    for key, value in query.fields:
        if key == "password" and value:
            for form in sorted({value, quote_plus(value), quote(value), quote(value, safe="")}):
                text = text.replace(form, "***")
    return text


async def _close_when_run_ends(client: httpx.AsyncClient) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            try:
                await client.aclose()
            except Exception as exc:  # a system task must not raise
                log.warning("closing the HTTP auth client failed: %s", exc)
