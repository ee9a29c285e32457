"""The management API's permission checks: its writes need what the same AMQP operation needs
(RabbitMQ's management plugin checks them through ``rabbit_mgmt_util``, then acts over AMQP):

- declaring or deleting a queue or exchange: ``configure`` on it;
- purging a queue, getting from it: ``read`` on it; publishing: ``write`` on the exchange;
- creating or deleting a binding: ``write`` on the destination, ``read`` on the source.

Refusals are RabbitMQ 3.10's (compared with it in ``tests/auth/test_permissions_mgmt.py``):
401 ``not_authorised`` "Access refused." for a declare, delete, purge or binding; a get is
refused as its AMQP ``basic.get`` would be (401, ``ACCESS_REFUSED - access to queue ...``) and
a publish as its ``basic.publish`` (400 ``bad_request``, ``403 ACCESS_REFUSED - ...``).
A route checks after it found what it touches (404 first, as RabbitMQ's ``resource_exists``).
"""

from __future__ import annotations

from starlette.requests import Request

from ...auth import PermissionKind, ResourceKind
from ...broker.vhost import VirtualHost
from ..access import resource_refusal
from .auth import ApiUser, broker_of
from .errors import ApiError


def access_refused() -> ApiError:
    return ApiError(401, "not_authorised", "Access refused.")


async def allowed(
    request: Request,
    user: ApiUser,
    vhost: VirtualHost,
    kind: ResourceKind,
    name: str,
    permission: PermissionKind,
) -> bool:
    chain = broker_of(request).authenticator.chain
    return await chain.check_resource(user.auth, vhost.name, kind, name, permission)


async def require(
    request: Request,
    user: ApiUser,
    vhost: VirtualHost,
    *needs: tuple[ResourceKind, str, PermissionKind],
) -> None:
    """401 "Access refused." unless ``user`` has every one of ``needs`` on ``vhost``."""
    for kind, name, permission in needs:
        if not await allowed(request, user, vhost, kind, name, permission):
            raise access_refused()


async def require_get(request: Request, user: ApiUser, vhost: VirtualHost, queue: str) -> None:
    """``read`` on the queue, refused as ``basic.get`` is."""
    if not await allowed(request, user, vhost, "queue", queue, "read"):
        text = resource_refusal("queue", queue, vhost.name, user.name)
        raise ApiError(401, "not_authorised", f"ACCESS_REFUSED - {text}")


async def require_publish(
    request: Request, user: ApiUser, vhost: VirtualHost, exchange: str
) -> None:
    """``write`` on the exchange, refused as ``basic.publish`` is."""
    if not await allowed(request, user, vhost, "exchange", exchange, "write"):
        text = resource_refusal("exchange", exchange, vhost.name, user.name)
        raise ApiError(400, "bad_request", f"403 ACCESS_REFUSED - {text}")


def binding_needs(
    source: str, destination: str, destination_kind: ResourceKind
) -> tuple[tuple[ResourceKind, str, PermissionKind], ...]:
    """What a binding from ``source`` to ``destination`` needs (to create or delete it)."""
    return ((destination_kind, destination, "write"), ("exchange", source, "read"))
