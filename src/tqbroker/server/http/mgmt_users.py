"""The management API's users and permissions, read-only until users can be managed at runtime
(the security work), for administrators: ``/api/users[/{name}]``, ``/api/users/{name}/permissions``,
``/api/permissions`` and ``/api/vhosts/{vhost}/permissions``. A user's permissions are
RabbitMQ's ``.*`` configure/write/read on every vhost it may use; a user who may use every
vhost is tagged ``administrator``, another ``management``. Password hashes are never shown.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...auth import User
from .auth import broker_of
from .errors import ApiError
from .mgmt_common import api_user, api_vhost, listing, not_found, segment


async def administrator(request: Request) -> User:
    """The request's user, who must be an administrator (401 ``Not administrator user``
    otherwise, as RabbitMQ answers)."""
    user = await api_user(request)
    if user.vhosts is not None:
        raise ApiError(401, "not_authorised", "Not administrator user")
    return user


def user_tags(user: User) -> list[str]:
    return ["administrator"] if user.vhosts is None else ["management"]


def _user_json(user: User) -> dict[str, Any]:
    return {"name": user.name, "tags": user_tags(user), "limits": {}}


def _permissions(user: User, vhosts: list[str]) -> list[dict[str, Any]]:
    return [
        {"user": user.name, "vhost": v, "configure": ".*", "write": ".*", "read": ".*"}
        for v in vhosts
        if user.may_open(v)
    ]


async def users(request: Request) -> Response:
    """``GET /api/users``."""
    await administrator(request)
    return await listing(request, (_user_json(u) for u in broker_of(request).users.all()))


async def user(request: Request) -> Response:
    """``GET /api/users/{name}``."""
    await administrator(request)
    found = broker_of(request).users.get(segment(request, "name"))
    if found is None:
        raise not_found()
    return JSONResponse(_user_json(found))


async def user_permissions(request: Request) -> Response:
    """``GET /api/users/{name}/permissions``."""
    await administrator(request)
    broker = broker_of(request)
    found = broker.users.get(segment(request, "name"))
    if found is None:
        raise not_found()
    return await listing(request, _permissions(found, sorted(broker.vhosts)))


async def permissions(request: Request) -> Response:
    """``GET /api/permissions``."""
    await administrator(request)
    broker = broker_of(request)
    vhosts = sorted(broker.vhosts)
    return await listing(request, [p for u in broker.users.all() for p in _permissions(u, vhosts)])


async def vhost_permissions(request: Request) -> Response:
    """``GET /api/vhosts/{vhost}/permissions``."""
    vhost = await api_vhost(request, await administrator(request))
    return await listing(
        request, [p for u in broker_of(request).users.all() for p in _permissions(u, [vhost.name])]
    )
