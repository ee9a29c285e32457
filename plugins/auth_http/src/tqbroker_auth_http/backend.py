"""``HttpAuthBackend``: the I/O half. Asks the service with httpx (on Trio), keeps its answers
in ``AnswerCache``, bounds the requests in flight and the time each may take.

The client (one connection pool) belongs to the Trio run that first uses the backend: it is
closed by a Trio system task when that run ends (the broker's shutdown), so no socket outlives
the broker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from urllib.parse import quote_plus, urlencode

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
from .logtext import REQUEST_LINES, describe, scrub, subject
from .options import number_option, tls_context, url_option

log = logging.getLogger(__name__)

BACKEND_NAME = "http"
MAX_BODY = 64 * 1024  # bytes of an answer read at most (an answer is a word and a few tags)
FORM = {"content-type": "application/x-www-form-urlencoded"}


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
            name: url_option(name, value) for name, value in zip(PATH_NAMES, given, strict=True)
        }
        if not isinstance(http_method, str) or http_method.lower() not in ("get", "post"):
            raise ValueError(f"http_method must be 'get' or 'post', not {http_method!r}")
        self.method = http_method.lower()
        ttl = number_option("cache_ttl", cache_ttl, minimum=0)
        deny_ttl = number_option("deny_cache_ttl", deny_cache_ttl, minimum=0)
        self.timeout = number_option("timeout", timeout, minimum=0, strict=True)
        concurrency = number_option("max_concurrent_requests", max_concurrent_requests, minimum=1)
        size = number_option("cache_size", cache_size, minimum=0)
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
            raise self._failed(query, describe(exc)) from None
        except (AuthBackendError, BadAnswer) as exc:
            raise self._failed(query, str(exc)) from None
        except Exception as exc:  # whatever else the client raises: no answer, not a crash
            raise self._failed(query, describe(exc)) from None
        if not answer.allowed and answer.reason:
            log.info("HTTP auth service denied %s: %s", subject(query), scrub(answer.reason, query))
        return answer

    def _failed(self, query: Query, problem: str) -> AuthBackendError:
        self.errors += 1
        where = redact_url(self.paths[query.path])
        problem = scrub(problem, query)
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


async def _close_when_run_ends(client: httpx.AsyncClient) -> None:
    try:
        await trio.sleep_forever()
    finally:
        with trio.CancelScope(shield=True):
            try:
                await client.aclose()
            except Exception as exc:  # a system task must not raise
                log.warning("closing the HTTP auth client failed: %s", exc)
