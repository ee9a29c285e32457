"""The management API's runtime changes to vhosts and the vhost and user limits, with RabbitMQ's
paths, bodies, statuses and reasons (checked against RabbitMQ 3.10):

- ``PUT /api/vhosts/{vhost}`` (``description``, ``tags``; 201 or 204): a new vhost, durable
  before the answer; its creator gets ``.*`` permissions on it, as RabbitMQ's management
  plugin grants; ``DELETE /api/vhosts/{vhost}``: its connections closed (320 ``vhost 'v' is
  deleted``), its queues and their stored messages, exchanges, bindings, limits and
  permissions deleted;
- ``GET /api/vhost-limits[/{vhost}]``, ``PUT/DELETE /api/vhost-limits/{vhost}/{name}``
  (``max-connections``, ``max-queues``; body ``{"value": N}``, negative: no limit);
- ``GET /api/user-limits[/{user}]``, ``PUT/DELETE /api/user-limits/{user}/{name}``
  (``max-connections``, ``max-channels``).

Writes are for administrators; the limit lists show what the user may see (its vhosts, its own
user limits), as RabbitMQ's do.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...auth import Permission
from ...broker.limits import USER_LIMITS, VHOST_LIMITS, LimitError, check_limit, vhost_metadata
from .auth import broker_of
from .errors import ApiError
from .mgmt_common import api_user, bad_request, json_body, not_found, segment
from .mgmt_user_writes import close_connections
from .mgmt_users import administrator

log = logging.getLogger(__name__)


def _tags(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [t.strip() for t in value.split(",") if t.strip()]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return [t.strip() for t in value if t.strip()]
    raise bad_request("tags must be a comma-separated string or a list of strings")


async def put_vhost(request: Request) -> Response:
    """``PUT /api/vhosts/{vhost}``: 201 for a new vhost (its creator may use it), 204 for an
    existing one (its description and tags replaced)."""
    user = await administrator(request)
    name = segment(request, "vhost")
    body = await json_body(request)
    description = body.get("description", "")
    if not isinstance(description, str):
        description = str(description)
    metadata = vhost_metadata(description, _tags(body.get("tags")))
    broker = broker_of(request)
    existed = name in broker.vhosts
    since = broker.definitions.mark()
    broker.add_vhost(name)
    if metadata:
        broker.vhost_metadata[name] = metadata
    else:
        broker.vhost_metadata.pop(name, None)
    broker.definitions.changed()
    if not existed:
        broker.users.set_permissions(user.name, name, Permission(".*", ".*", ".*"))
        await broker.users.save(broker.config.data_dir)
        log.info("added vhost '%s'", name)
    await broker.definitions.wait(since)
    return Response(status_code=204 if existed else 201)


async def delete_vhost(request: Request) -> Response:
    """``DELETE /api/vhosts/{vhost}``: 204 once the deletion is durable, 404 if none."""
    await administrator(request)
    name = segment(request, "vhost")
    broker = broker_of(request)
    if name not in broker.vhosts:
        raise not_found()
    close_connections(request, f"vhost '{name}' is deleted", vhost=name)
    await broker.delete_vhost(name)
    return Response(status_code=204)


def _value(body: dict[str, Any]) -> object:
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    return body["value"]


async def vhost_limits(request: Request) -> Response:
    """``GET /api/vhost-limits[/{vhost}]``: ``[{"vhost": ..., "value": {...}}]``."""
    user = await api_user(request)
    broker = broker_of(request)
    if "vhost" in request.path_params:
        name = segment(request, "vhost")
        if name not in broker.vhosts or not user.may_open(name):
            raise not_found()
        names = [name]
    else:
        names = [n for n in broker.vhosts if user.may_open(n)]
    rows = [
        {"vhost": n, "value": dict(broker.limits.vhosts[n])}
        for n in names
        if broker.limits.vhosts.get(n)
    ]
    return JSONResponse(rows)


async def parameters(request: Request) -> Response:
    """``GET /api/parameters[/{component}[/{vhost}]]``: the runtime parameters, which in
    tqbroker are the vhost limits (component ``vhost-limits``), as RabbitMQ lists them."""
    user = await api_user(request)
    broker = broker_of(request)
    component = segment(request, "component") if "component" in request.path_params else None
    vhost = segment(request, "vhost") if "vhost" in request.path_params else None
    if vhost is not None and (vhost not in broker.vhosts or not user.may_open(vhost)):
        raise not_found()
    rows = [
        p
        for p in broker.limits.parameters(vhost)
        if user.may_open(p["vhost"]) and component in (None, p["component"])
    ]
    return JSONResponse(rows)


async def put_vhost_limit(request: Request) -> Response:
    """``PUT /api/vhost-limits/{vhost}/{name}`` ``{"value": N}``: 204."""
    await administrator(request)
    vhost, name = segment(request, "vhost"), segment(request, "name")
    body = await json_body(request)
    broker = broker_of(request)
    if vhost not in broker.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    try:
        value = check_limit(name, _value(body), VHOST_LIMITS, "limits")
    except LimitError as exc:
        raise bad_request(f"Validation failed\n\n{exc}\n") from None
    since = broker.definitions.mark()
    broker.limits.set_vhost(vhost, name, value)
    broker.definitions.changed()
    await broker.definitions.wait(since)
    log.info("set limit %s of vhost '%s' to %d", name, vhost, value)
    return Response(status_code=204)


async def delete_vhost_limit(request: Request) -> Response:
    """``DELETE /api/vhost-limits/{vhost}/{name}``: 204 (also when it was not set)."""
    await administrator(request)
    vhost, name = segment(request, "vhost"), segment(request, "name")
    broker = broker_of(request)
    if vhost not in broker.vhosts:
        raise ApiError(404, "not_found", "vhost_not_found")
    since = broker.definitions.mark()
    broker.limits.clear_vhost(vhost, name)
    broker.definitions.changed()
    await broker.definitions.wait(since)
    return Response(status_code=204)


async def user_limits(request: Request) -> Response:
    """``GET /api/user-limits[/{user}]``: ``[{"user": ..., "value": {...}}]`` (a user that is
    not an administrator sees its own)."""
    user = await api_user(request)
    db = broker_of(request).users
    if "user" in request.path_params:
        name = segment(request, "user")
        if db.get(name) is None or not (user.is_administrator or name == user.name):
            raise not_found()
        names = [name]
    else:
        names = [n for n in sorted(db.users) if user.is_administrator or n == user.name]
    return JSONResponse(
        [{"user": n, "value": dict(db.limits[n])} for n in names if db.limits.get(n)]
    )


async def put_user_limit(request: Request) -> Response:
    """``PUT /api/user-limits/{user}/{name}`` ``{"value": N}``: 204."""
    await administrator(request)
    user, name = segment(request, "user"), segment(request, "name")
    body = await json_body(request)
    broker = broker_of(request)
    if broker.users.get(user) is None:
        raise ApiError(400, "bad_request", ["no_such_user", user])
    try:
        value = check_limit(name, _value(body), USER_LIMITS, "user-limits")
    except LimitError as exc:
        raise bad_request(str(exc)) from None
    broker.users.limits.setdefault(user, {})[name] = value
    await broker.users.save(broker.config.data_dir)
    log.info("set limit %s of user '%s' to %d", name, user, value)
    return Response(status_code=204)


async def delete_user_limit(request: Request) -> Response:
    """``DELETE /api/user-limits/{user}/{name}``: 204 (also when it was not set); 404 for an
    unknown user."""
    await administrator(request)
    user, name = segment(request, "user"), segment(request, "name")
    broker = broker_of(request)
    if broker.users.get(user) is None:
        raise not_found()
    found = broker.users.limits.get(user, {})
    found.pop(name, None)
    if not found:
        broker.users.limits.pop(user, None)
    await broker.users.save(broker.config.data_dir)
    return Response(status_code=204)
