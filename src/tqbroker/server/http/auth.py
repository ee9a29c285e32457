"""Who a request is from and what it may touch: HTTP Basic authentication against the broker's
users (``loopback_only`` users from loopback only) and the user's vhost permissions.

Responsibilities:
- ``broker_of``: the broker the app serves (``app.state.broker``);
- ``user_of``: the user whose HTTP Basic credentials the request carries (401 otherwise);
- ``vhost_of``: the request's vhost (the ``vhost`` query parameter, ``/`` by default) once its
  credentials and permissions are checked (401, 403; 404 for an unknown vhost).
"""

from __future__ import annotations

import base64
import logging

import trio
from starlette.requests import Request

from ...auth import User, is_loopback
from ...broker.broker import Broker
from ...broker.vhost import VirtualHost
from .errors import RequestError

log = logging.getLogger(__name__)


def broker_of(request: Request) -> Broker:
    """The broker the app serves."""
    broker = request.app.state.broker
    assert isinstance(broker, Broker)
    return broker


async def user_of(request: Request) -> User:
    """The broker user the request's credentials name (401 without valid ones)."""
    broker = broker_of(request)
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    try:
        username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8
        username = password = ""
    if scheme.lower() != "basic" or not username:
        raise RequestError(401, "HTTP Basic credentials of a broker user are required")
    user = await trio.to_thread.run_sync(broker.users.verify, username, password)
    if user is None:
        raise RequestError(401, "login refused")
    if user.loopback_only and not is_loopback(request.client.host if request.client else ""):
        raise RequestError(401, f"user '{username}' can only connect via localhost")
    return user


async def vhost_of(request: Request) -> VirtualHost:
    """The request's vhost, once its credentials and permissions are checked."""
    broker = broker_of(request)
    user = await user_of(request)
    username = user.name
    name = request.query_params.get("vhost", "/")
    if not user.may_open(name):
        raise RequestError(403, f"user '{username}' has no access to vhost '{name}'")
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise RequestError(404, f"no vhost '{name}'")
    return vhost
