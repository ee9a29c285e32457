"""HTTP errors: every failure answered as JSON, ``{"error": <reason>, "message": <what to fix>}``,
with a 4xx (or 503) status; unknown paths and methods too, and a 500 for a bug.

Responsibilities:
- ``ApiError``: a refusal of the management API (``/api``), in RabbitMQ's shape
  ``{"error": ..., "reason": ...}``;
- ``RequestError``: a request the HTTP layer itself refuses (credentials, permissions, a body
  too large or malformed), with its status;
- the status of each stream service failure (``TopicError``): ``NotFound`` 404,
  ``InvalidRequest`` 400, ``Conflict`` 409, ``Unavailable`` 503; a read refused while the
  memory alarm is set (``LowOnMemory``): 503 with ``Retry-After``;
- a 401 asks for HTTP Basic credentials (``WWW-Authenticate``) unless a browser asked
  (``challenges``);
- ``EXCEPTION_HANDLERS``: the app's handlers for those, for Starlette's own ``HTTPException``
  and for anything else (a 500, logged with its traceback).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ...broker.read_budget import LowOnMemory
from ...broker.streams.service import Conflict, InvalidRequest, NotFound, TopicError, Unavailable

log = logging.getLogger(__name__)

_REASONS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "too_large",
    500: "internal_error",
    503: "unavailable",
}
_TOPIC_STATUSES: dict[type[TopicError], int] = {
    NotFound: 404,
    InvalidRequest: 400,
    Conflict: 409,
    Unavailable: 503,
}


class RequestError(Exception):
    """A request refused by the HTTP layer, with the status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ApiError(Exception):
    """A management API refusal: RabbitMQ's status, ``error`` and ``reason``."""

    def __init__(self, status: int, error: str, reason: str | list[object]) -> None:
        """``reason``: RabbitMQ's text, or the Erlang term it answers some refusals with
        (``["no_such_user", "bob"]``)."""
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


def api_error_response(exc: ApiError, *, challenge: bool = True) -> Response:
    """The refusal as RabbitMQ's JSON (a 401 asks for Basic credentials with ``challenge``)."""
    challenged = challenge and exc.status == 401
    headers = {"www-authenticate": 'Basic realm="RabbitMQ Management"'} if challenged else None
    return JSONResponse(
        {"error": exc.error, "reason": exc.reason}, status_code=exc.status, headers=headers
    )


def error(status: int, message: str, *, challenge: bool = True) -> JSONResponse:
    """The JSON error response (a 401 asks for Basic credentials with ``challenge``)."""
    headers = (
        {"www-authenticate": 'Basic realm="tqbroker"'} if challenge and status == 401 else None
    )
    return JSONResponse(
        {"error": _REASONS.get(status, "error"), "message": message},
        status_code=status,
        headers=headers,
    )


def topic_status(exc: TopicError) -> int:
    """The HTTP status of a ``broker.streams.service`` failure (``TopicError``)."""
    for kind, status in _TOPIC_STATUSES.items():
        if isinstance(exc, kind):
            return status
    return 400


def challenges(request: Request) -> bool:
    """Whether a 401 may ask for HTTP Basic credentials: not a browser's request (browsers send
    ``Sec-Fetch-Mode``), which would prompt for them and then send them along with requests
    other sites' pages make (the web UI logs in with its own form)."""
    return "sec-fetch-mode" not in request.headers


async def _request_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestError)
    return error(exc.status, exc.message, challenge=challenges(request))


async def _topic_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, TopicError)
    return error(topic_status(exc), exc.message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/api/"):  # the management API answers as RabbitMQ's does
        if exc.status_code == 404:
            return JSONResponse({"error": "Object Not Found", "reason": "Not Found"}, 404)
        return JSONResponse(
            {"error": _REASONS.get(exc.status_code, "error"), "reason": exc.detail}, exc.status_code
        )
    return error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")


async def _disconnect(request: Request, exc: Exception) -> Response:
    """A body that stopped coming (``limits.BodyDeadline`` gave up on it, or the client went)."""
    return error(408, f"{request.method} {request.url.path}: the request body did not arrive")


async def _low_on_memory(request: Request, exc: Exception) -> Response:
    """A read refused while the memory alarm is set: 503, and when to ask again."""
    assert isinstance(exc, LowOnMemory)
    response = error(503, exc.message)
    response.headers["retry-after"] = str(exc.retry_after)
    return response


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("HTTP %s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, f"{request.method} {request.url.path}: internal error (in the log)")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return api_error_response(exc, challenge=challenges(request))


EXCEPTION_HANDLERS: Mapping[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
    ApiError: _api_error,
    RequestError: _request_error,
    TopicError: _topic_error,
    LowOnMemory: _low_on_memory,
    HTTPException: _http_error,
    ClientDisconnect: _disconnect,
    Exception: _internal_error,
}
