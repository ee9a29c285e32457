"""What every route of the RabbitMQ-compatible management API (``/api/...``) shares.

Responsibilities:
- ``ApiError``: a refusal in RabbitMQ's shape, ``{"error": ..., "reason": ...}`` with its status
  (``not_found()`` is RabbitMQ's ``Object Not Found``);
- ``RawApiPaths``: ``/api`` paths are routed on the raw path, so a vhost spelled ``%2F`` stays one
  path segment (``segment`` decodes a path parameter);
- ``api_user``, ``api_vhost``: HTTP Basic credentials, the user's tags (``ApiUser``: a user
  without a management tag is refused) and vhost access, answered as RabbitMQ answers (401
  ``Login failed``, 404 for an unknown vhost);
- ``listing``: a list answered as RabbitMQ answers one: ``name``/``use_regex`` filtering,
  ``sort``/``sort_reverse``, ``page``/``page_size`` pagination and ``columns=`` selection;
- ``json_body``, ``flag``: request bodies, including rabbitmqadmin's ``"true"`` strings.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import unquote

import regex
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ...auth.model import ADMINISTRATOR, MANAGEMENT_TAGS, MONITORING
from ...broker.broker import Broker
from ...broker.pacing import Pacer
from ...broker.vhost import VirtualHost
from ...protocol.codec import FieldTable
from ...protocol.errors import AMQPError, ReplyCode
from .auth import ApiUser, broker_of, peer_of, user_of
from .errors import ApiError, RequestError
from .inputs import field_table, read_body
from .jsonbody import parse_json_paced

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100
# The time a name filter's regular expression may take over a whole list.
REGEX_SECONDS = 1.0
# Lists at least this long are streamed, encoded this many rows at a time.
STREAMED_ROWS = 200


def not_found() -> ApiError:
    return ApiError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def refusal(exc: AMQPError) -> ApiError:
    """A vhost's refusal (an ``AMQPError``) as RabbitMQ's API words it."""
    if exc.code == ReplyCode.NOT_FOUND:
        return ApiError(404, "not_found", exc.text)
    if exc.code == ReplyCode.ACCESS_REFUSED:
        return ApiError(401, "not_authorised", "Access refused.")
    if exc.code in (ReplyCode.RESOURCE_ERROR, ReplyCode.INTERNAL_ERROR):
        return ApiError(503, "unavailable", exc.text)
    return bad_request(exc.text)


@asynccontextmanager
async def topology_change(vhost: VirtualHost) -> AsyncIterator[None]:
    """A change to ``vhost``'s topology made over the API: it returns once the change is
    durable (as the AMQP ``*-ok`` would), and a refusal is answered as RabbitMQ's API words
    it."""
    since = vhost.definitions.mark()
    try:
        yield
        await vhost.definitions.wait(since)
    except AMQPError as exc:
        raise refusal(exc) from None


class RawApiPaths:
    """Routes ``/api/...`` requests on their raw (still percent-encoded) path: RabbitMQ's
    clients send the vhost ``/`` as ``%2F``, which must stay inside one path segment."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/api/"):
            raw = scope.get("raw_path")
            if raw:
                scope = dict(scope, path=raw.decode("latin-1").partition("?")[0])
        await self.app(scope, receive, send)


def segment(request: Request, name: str) -> str:
    """A path parameter, percent-decoded (``%2F`` is ``/``; ``limits.ValidPaths`` has refused
    paths that do not decode to UTF-8)."""
    return unquote(str(request.path_params[name]), errors="strict")


async def api_user(request: Request) -> ApiUser:
    """The user of the request's Basic credentials, with a management tag (401 in RabbitMQ's
    words otherwise)."""
    try:
        user = await user_of(request)
    except RequestError as exc:
        if exc.status == 401:
            raise ApiError(401, "not_authorized", "Login failed") from None
        raise
    if not user.tags & MANAGEMENT_TAGS:
        raise ApiError(401, "not_authorised", "Not management user")
    broker = broker_of(request)
    names = list(broker.vhosts)
    if not user.tags & {ADMINISTRATOR, MONITORING}:
        chain, peer = broker.authenticator.chain, peer_of(request)
        names = [n for n in names if await chain.check_vhost(user, n, peer)]
    return ApiUser(user, frozenset(names))


async def api_vhost(request: Request, user: ApiUser | None = None) -> VirtualHost:
    """The path's ``{vhost}``, once the user may use it (404 if it does not exist)."""
    user = user or await api_user(request)
    name = segment(request, "vhost")
    vhost = broker_of(request).vhosts.get(name)
    if vhost is None:
        raise not_found()
    if not user.may_open(name):
        raise ApiError(401, "not_authorised", "Access refused.")
    return vhost


def visible_vhosts(broker: Broker, user: ApiUser, name: str | None = None) -> list[VirtualHost]:
    """The vhosts a listing covers: ``name``'s (404 if unknown) or every one the user may use."""
    if name is not None:
        vhost = broker.vhosts.get(name)
        if vhost is None:
            raise not_found()
        if not user.may_open(name):
            raise ApiError(401, "not_authorised", "Access refused.")
        return [vhost]
    return [v for n, v in sorted(broker.vhosts.items()) if user.may_open(n)]


async def listed_vhosts(request: Request, user: ApiUser | None = None) -> list[VirtualHost]:
    """The vhosts of a listing route with an optional ``{vhost}`` path parameter."""
    user = user or await api_user(request)
    name = segment(request, "vhost") if "vhost" in request.path_params else None
    return visible_vhosts(broker_of(request), user, name)


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (400 in RabbitMQ's words otherwise; 413 beyond the size limit);
    an empty body is ``{}``."""
    try:
        raw = await read_body(request)
    except RequestError as exc:
        raise ApiError(exc.status, "bad_request", exc.message) from None
    if not raw.strip():
        return {}
    try:
        body = await parse_json_paced(raw)
    except ValueError as exc:
        raise bad_request(f"invalid payload: {exc}") from None
    except RequestError as exc:
        raise ApiError(exc.status, "bad_request", f"invalid payload: {exc.message}") from None
    if not isinstance(body, dict):
        kind = "a string" if isinstance(body, str) else "an array"
        kind = kind if isinstance(body, str | list) else "a scalar"
        raise bad_request(
            f"invalid payload: the request body JSON-decoded to {kind}. "
            "Is the input doubly-JSON-encoded?"
        )
    return body


def table(value: object, name: str) -> FieldTable:
    """A JSON object as an AMQP field table (400 in RabbitMQ's error shape otherwise)."""
    try:
        return field_table(value if value is not None else {}, name)
    except RequestError as exc:
        raise bad_request(exc.message) from None


def short_string(value: object, what: str) -> str:
    """A name or routing key as AMQP carries it: text of at most 255 bytes in UTF-8 (400
    otherwise: a queue could not store it)."""
    if not isinstance(value, str):
        raise bad_request(f"{what} must be a string")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise bad_request(f"{what} is not valid Unicode text") from None
    if size > 255:
        raise bad_request(f"{what} is longer than 255 bytes")
    return value


def integer(body: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    """An integer field between ``low`` and ``high`` (a number or its text, as rabbitmqadmin
    sends them)."""
    value = body.get(key, default)
    if value in (None, ""):
        return default
    try:
        number = int(value) if not isinstance(value, bool | float) else None
    except (TypeError, ValueError):
        number = None
    if isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not low <= number <= high:
        raise bad_request(f"'{key}' must be an integer between {low} and {high}, not {value!r}")
    return number


def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    """A boolean field: JSON's ``true``/``false`` or rabbitmqadmin's ``"true"``/``"false"``."""
    value = body.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad_request(f"'{key}' must be true or false, not {value!r}")


def query_flag(request: Request, key: str) -> bool:
    return request.query_params.get(key, "").lower() == "true"


async def listing(request: Request, items: Iterable[dict[str, Any]]) -> Response:
    """``items`` as RabbitMQ lists them, honouring the query's filtering, sorting, pagination and
    ``columns``. Building and encoding a long list gives way to other clients (``items`` is
    consumed with a pacer: pass a generator; a long answer is streamed)."""
    params = request.query_params
    rows = []
    pacer = Pacer()
    for item in items:
        rows.append(item)
        await pacer.step()
    total = len(rows)
    pattern = params.get("name")
    if pattern:
        rows = await _named(rows, pattern, params.get("use_regex", "").lower() == "true")
    sort = params.get("sort")
    if sort:
        rows.sort(key=lambda r: _sort_key(_dotted(r, sort)))
    if params.get("sort_reverse", "").lower() == "true":
        rows.reverse()
    columns = [c for c in params.get("columns", "").split(",") if c]
    if "page" not in params:
        return await _json([_columns(r, columns) for r in rows])
    page, size = _page(params.get("page"), params.get("page_size"))
    filtered = len(rows)
    page_count = -(-filtered // size)  # 0 for an empty list, as RabbitMQ counts
    if page > max(page_count, 1):
        raise bad_request_page(page, size, filtered)
    shown = rows[(page - 1) * size : page * size]
    return await _json(
        {
            "filtered_count": filtered,
            "item_count": len(shown),
            "items": [_columns(r, columns) for r in shown],
            "page": page,
            "page_count": page_count,
            "page_size": size,
            "total_count": total,
        }
    )


async def _json(content: Any) -> Response:
    """A JSON response; a long list is streamed, encoded a slice of rows at a time with a
    checkpoint between (one ``json.dumps`` of 10,000 queues holds the event loop ~100 ms)."""
    if not isinstance(content, list) or len(content) < STREAMED_ROWS:
        return JSONResponse(content)
    return StreamingResponse(_chunks(content), media_type="application/json")


async def _chunks(rows: list[dict[str, Any]]) -> AsyncIterator[bytes]:
    pacer = Pacer()
    pending = [b"["]
    for n, row in enumerate(rows):
        pending.append(b"," if n else b"")
        pending.append(json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode())
        if len(pending) >= 2 * STREAMED_ROWS:
            yield b"".join(pending)
            pending.clear()
        await pacer.step()
    pending.append(b"]")
    yield b"".join(pending)


async def _named(rows: list[dict[str, Any]], pattern: str, use_regex: bool) -> list[dict[str, Any]]:
    """The rows whose name contains ``pattern`` or, with ``use_regex``, matches it somewhere;
    a regular expression gets ``REGEX_SECONDS`` in all (400 beyond: a pattern such as
    ``^(a+)+$`` could otherwise hold the broker for ever)."""
    if not use_regex:
        return [r for r in rows if pattern in str(r.get("name", ""))]
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise bad_request(f"invalid regular expression {pattern!r}: {exc}") from None
    deadline = time.monotonic() + REGEX_SECONDS
    pacer = Pacer()
    found = []
    for row in rows:
        left = deadline - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            if compiled.search(str(row.get("name", "")), timeout=min(left, 0.004)):
                found.append(row)
        except TimeoutError:
            raise bad_request(f"the regular expression {pattern!r} takes too long") from None
        await pacer.step()
    return found


def bad_request_page(page: int, size: int, length: int) -> ApiError:
    return ApiError(
        400,
        "page_out_of_range",
        f"Page out of range, page: {page} page size: {size}, len: {length}",
    )


def _page(page_text: str | None, size_text: str | None) -> tuple[int, int]:
    try:
        page = int(page_text or "")
        size = int(size_text) if size_text else DEFAULT_PAGE_SIZE
    except ValueError:
        page = size = 0
    if page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
        raise ApiError(
            400,
            "invalid_pagination_parameters",
            f"Invalid pagination parameters: page number {page_text}, "
            f"page size {size_text or 'undefined'}",
        )
    return page, size


def _dotted(row: dict[str, Any], path: str) -> Any:
    value: Any = row
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _sort_key(value: Any) -> tuple[int, Any]:
    if value is None:
        return (0, 0)
    if isinstance(value, bool | int | float):
        return (1, value)
    return (2, str(value))


def _columns(row: dict[str, Any], columns: list[str]) -> dict[str, Any]:
    """``row`` reduced to ``columns`` (dotted paths keep their nesting), as RabbitMQ does."""
    if not columns:
        return row
    picked: dict[str, Any] = {}
    for column in columns:
        parts = column.split(".")
        value: Any = row
        for part in parts:
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            target = picked
            for part in parts[:-1]:
                target = target.setdefault(part, {})
            target[parts[-1]] = value
    return picked
