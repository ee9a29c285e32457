"""The web UI: one HTML page with its scripts and style sheet, served from this package (no build
step, nothing fetched from elsewhere) at ``/`` and ``/ui/{name}``. The page reads and acts only
through the management API (``/api/...``) and the topic API (``/topics/...``), sending the HTTP
Basic credentials its login form keeps in the tab's ``sessionStorage``; the routes serving it need
none (the page holds no data).
"""

from __future__ import annotations

import functools
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..errors import RequestError

_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "pages.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# The page runs its own script only, talks to its own origin only, and is never framed.
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@functools.cache
def _content(name: str) -> bytes:
    return resources.files(__name__).joinpath(name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_content(name), media_type=_TYPES[name], headers=_HEADERS)


async def index(request: Request) -> Response:
    """``GET /``: the page."""
    return _asset("index.html")


async def asset(request: Request) -> Response:
    """``GET /ui/{name}``: the page's script or style sheet (404 for anything else)."""
    name = str(request.path_params["name"])
    if name not in _TYPES:
        raise RequestError(404, f"no web UI file '{name}'")
    return _asset(name)


UI_ROUTES = [Route("/", index), Route("/ui/{name}", asset)]
