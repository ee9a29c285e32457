"""The management API's users and permissions, read-only here (runtime changes:
``mgmt_user_writes.py``), for administrators: ``/api/users[/{name}]``,
``/api/users/{name}/permissions``,
``/api/users/{name}/topic-permissions``, ``/api/permissions``, ``/api/topic-permissions``,
``/api/vhosts/{vhost}/permissions`` and ``/api/vhosts/{vhost}/topic-permissions``, from the
internal user database: tags as stored, permissions as set. Password hashes are shown to
administrators only (as RabbitMQ's ``/api/users``), and only administrators reach these routes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...auth.internal import permission_json, topic_permission_json, user_json
from .auth import ApiUser, broker_of
from .errors import ApiError
from .mgmt_common import api_user, api_vhost, listing, not_found, segment


async def administrator(request: Request) -> ApiUser:
    """The request's user, who must be an administrator (401 ``Not administrator user``
    otherwise, as RabbitMQ answers)."""
    user = await api_user(request)
    if not user.is_administrator:
        raise ApiError(401, "not_authorised", "Not administrator user")
    return user


async def users(request: Request) -> Response:
    """``GET /api/users``."""
    await administrator(request)
    db = broker_of(request).users
    return await listing(
        request, (user_json(u, with_hash=True, limits=db.limits.get(u.name)) for u in db.all())
    )


async def users_without_permissions(request: Request) -> Response:
    """``GET /api/users/without-permissions``: the users with no permissions on any vhost."""
    await administrator(request)
    db = broker_of(request).users
    permitted = {u for u, _v, _p in db.permissions_of()}
    found = [u for u in db.all() if u.name not in permitted]
    return await listing(
        request, (user_json(u, with_hash=True, limits=db.limits.get(u.name)) for u in found)
    )


async def user(request: Request) -> Response:
    """``GET /api/users/{name}``."""
    await administrator(request)
    db = broker_of(request).users
    found = db.get(segment(request, "name"))
    if found is None:
        raise not_found()
    return JSONResponse(user_json(found, with_hash=True, limits=db.limits.get(found.name)))


async def user_permissions(request: Request) -> Response:
    """``GET /api/users/{name}/permissions``."""
    await administrator(request)
    db = broker_of(request).users
    name = segment(request, "name")
    if db.get(name) is None:
        raise not_found()
    return await listing(request, [permission_json(*row) for row in db.permissions_of(user=name)])


async def user_topic_permissions(request: Request) -> Response:
    """``GET /api/users/{name}/topic-permissions``."""
    await administrator(request)
    db = broker_of(request).users
    name = segment(request, "name")
    if db.get(name) is None:
        raise not_found()
    rows = db.topic_permissions_of(user=name)
    return await listing(request, [topic_permission_json(*row) for row in rows])


async def permissions(request: Request) -> Response:
    """``GET /api/permissions``."""
    await administrator(request)
    rows = broker_of(request).users.permissions_of()
    return await listing(request, [permission_json(*row) for row in rows])


async def topic_permissions(request: Request) -> Response:
    """``GET /api/topic-permissions``."""
    await administrator(request)
    rows = broker_of(request).users.topic_permissions_of()
    return await listing(request, [topic_permission_json(*row) for row in rows])


async def vhost_permissions(request: Request) -> Response:
    """``GET /api/vhosts/{vhost}/permissions``."""
    vhost = await api_vhost(request, await administrator(request))
    rows = broker_of(request).users.permissions_of(vhost=vhost.name)
    return await listing(request, [permission_json(*row) for row in rows])


async def vhost_topic_permissions(request: Request) -> Response:
    """``GET /api/vhosts/{vhost}/topic-permissions``."""
    vhost = await api_vhost(request, await administrator(request))
    rows = broker_of(request).users.topic_permissions_of(vhost=vhost.name)
    return await listing(request, [topic_permission_json(*row) for row in rows])
