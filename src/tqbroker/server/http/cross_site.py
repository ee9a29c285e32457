"""No request from another site: an ASGI middleware in front of every route but the web UI's
page and ``/health``, so a page elsewhere cannot make a victim's browser act on the broker
(cross-site request forgery) with credentials the browser holds.

- A browser's request from another origin is refused (403): ``Sec-Fetch-Site`` (set by the
  browser, not by the page) must be ``same-origin`` or ``none`` (typed, bookmarked) when it is
  there; without it, an ``Origin`` must name this server (the ``Host`` the request came to).
  A different port on the same host is another origin (``same-site`` is refused too).
- A write's body must be one a cross-site form or a ``no-cors`` ``fetch`` cannot send without
  a CORS preflight (which this server never grants): on the management API (``/api/...``) a
  POST says ``Content-Type: application/json``, and so does any other write that names a type
  (415 otherwise, as RabbitMQ's word for it); on the topic API a write may not be
  ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``.

Clients that are no browsers (``rabbitmqadmin``, ``tqbroker-ctl``, curl, the Spark data
source) send neither header and their own content types; the web UI's requests are
same-origin ``fetch`` calls with JSON bodies.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import ApiError, api_error_response, error

# Where a cross-site request is harmless: the web UI's page and scripts (they hold no data; a
# link from elsewhere opens the page) and the load balancers' health check.
OPEN_PATHS = ("/", "/health")
OPEN_PREFIX = "/ui/"
READS = ("GET", "HEAD", "OPTIONS")
SAME_ORIGIN = ("same-origin", "none")
# The content types an HTML form (or a no-cors fetch) sends without a preflight.
FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
JSON_TYPE = "application/json"
TOPIC_TYPES = "send application/json (records: application/x-tqbroker-records)"
_DEFAULT_PORTS = {"http": 80, "https": 443}


class CrossSiteGuard:
    """Refuses cross-site requests and form-sendable write bodies (see the module)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(scope: Scope) -> Response | None:
    """The answer refusing the request, or None to serve it."""
    path: str = scope["path"]
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIX):
        return None
    headers = Headers(scope=scope)
    api = path.startswith("/api/")
    if not same_origin(headers):
        return _refuse(api, 403, "forbidden", "cross-site requests are refused")
    method: str = scope["method"]
    if method in READS:
        return None
    kind = headers.get("content-type", "").partition(";")[0].strip().lower()
    if api and kind != JSON_TYPE and (kind or method == "POST"):
        why = f"send the request body as {JSON_TYPE} (curl: --json)"
        return _refuse(api, 415, "unsupported_media_type", why)
    if not api and kind in FORM_TYPES:
        return _refuse(
            api, 415, "unsupported_media_type", f"a {kind} body is refused: {TOPIC_TYPES}"
        )
    return None


def same_origin(headers: Headers) -> bool:
    """Whether a browser sent the request from this server's own origin (or no browser did)."""
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site.lower() in SAME_ORIGIN
    origin = headers.get("origin")
    if origin is None:
        return True
    try:
        sent = urlsplit(origin)  # "null" (an opaque origin) has no host
        own = urlsplit(f"{sent.scheme}://{headers.get('host', '')}")
        same = (sent.hostname, _port(sent)) == (own.hostname, _port(own))
    except ValueError:  # a port that is not a number
        return False
    return same and sent.hostname is not None


def _port(address: SplitResult) -> int | None:
    return address.port or _DEFAULT_PORTS.get(address.scheme)


def _refuse(api: bool, status: int, reason: str, message: str) -> Response:
    if api:
        return api_error_response(ApiError(status, reason, message), challenge=False)
    return error(status, message)
