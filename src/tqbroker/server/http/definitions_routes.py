"""``/api/definitions[/{vhost}]``: export (GET) and import (POST) RabbitMQ's definitions JSON, as
RabbitMQ's management API does (``broker/definitions_api.py`` does the work).

Answers as RabbitMQ 3.10's: 200 with the document (``?download=NAME`` adds the attachment
header), 204 for an import (what it skipped is logged and summed up in the
``X-Definitions-Skipped`` header), 400 ``{"error": "bad_request", "reason": ...}`` for a document
that cannot be imported, 401 ``Not administrator user`` for anyone but an administrator (a
whole broker's or one vhost's: an import creates users and permissions, and an export lists
them), 404 for a POST to a missing vhost and 400 for a GET of one. The document is sent as
``application/json`` (``cross_site.py`` refuses other types, multipart forms included: a page
on another site could send one).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...broker.definitions_api import encode, export, import_document
from ...broker.definitions_json import DefinitionsError, parse_document
from ...protocol.errors import AMQPError
from .auth import broker_of
from .errors import ApiError, RequestError
from .inputs import read_body
from .jsonbody import parse_json_paced
from .mgmt_common import api_user, segment

log = logging.getLogger(__name__)

SKIPPED_HEADER = "x-definitions-skipped"
_SAFE_FILENAME = re.compile(r"[^A-Za-z0-9._@+-]")
# The JSON values a definitions body may hold (counted before parsing, 413 over it): 10,000
# queues with their bindings hold about 300,000; a 64 MiB body of tiny values could hold 30M.
DEFINITIONS_MAX_VALUES = 2_000_000


async def _authorised(request: Request) -> None:
    if not (await api_user(request)).is_administrator:
        raise ApiError(401, "not_authorised", "Not administrator user")


def _vhost_param(request: Request) -> str | None:
    return segment(request, "vhost") if "vhost" in request.path_params else None


async def get_definitions(request: Request) -> Response:
    """``GET /api/definitions[/{vhost}]``."""
    vhost = _vhost_param(request)
    await _authorised(request)
    broker = broker_of(request)
    if vhost is not None and vhost not in broker.vhosts:
        raise ApiError(400, "bad_request", "vhost_not_found")
    document = await export(broker, vhost)
    headers = {}
    download = request.query_params.get("download")
    if download:
        filename = _SAFE_FILENAME.sub("_", download)[:200]
        headers["content-disposition"] = f"attachment; filename={filename}"
    return StreamingResponse(encode(document), 200, headers, media_type="application/json")


async def post_definitions(request: Request) -> Response:
    """``POST /api/definitions[/{vhost}]``: import a JSON document."""
    vhost = _vhost_param(request)
    await _authorised(request)
    broker = broker_of(request)
    if vhost is not None and vhost not in broker.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    try:
        raw = await read_body(request)
    except RequestError as exc:
        raise ApiError(exc.status, "bad_request", exc.message) from None
    try:
        loaded = await _parsed(raw) if raw.strip() else {}
    except ValueError as exc:  # not JSON (nor UTF-8)
        raise ApiError(400, "bad_request", f"failed_to_parse_json: {exc}") from None
    try:
        document = parse_document(loaded, vhost=vhost)
        since = broker.definitions.mark()
        skipped = await import_document(broker, document, strict=False)
        if broker.limits.load_parameters(loaded.get("parameters"), broker.vhosts, vhost):
            broker.definitions.changed()  # vhost limits, as RabbitMQ imports them
    except DefinitionsError as exc:
        log.info("definitions import refused: %s", exc)
        raise ApiError(400, "bad_request", str(exc)) from None
    try:
        await broker.definitions.wait(since)  # durable before the answer, as a declare-ok
    except AMQPError as exc:  # 541: the definitions could not be stored
        raise ApiError(500, "internal_server_error", exc.reply_text) from None
    headers = {}
    if skipped:
        summary = "; ".join(skipped)
        headers[SKIPPED_HEADER] = summary.encode("ascii", "backslashreplace").decode()[:4000]
    return Response(None, 204, headers)


async def _parsed(raw: bytes) -> Any:
    """The definitions body, parsed by the bounded parser a piece at a time (other clients run
    in between: a 55 MiB body parsed in one go stalled them 179 ms)."""
    return await parse_json_paced(raw, "the definitions", DEFINITIONS_MAX_VALUES)
