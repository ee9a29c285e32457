"""Who a request is from and what it may touch: HTTP Basic authentication through the broker's
``Authenticator`` (the same rate limit, failure delay, backends and loopback users as AMQP) and
the user's vhost access from the auth backend.

Responsibilities:
- ``broker_of``: the broker the app serves (``app.state.broker``);
- ``user_of``: the user whose HTTP Basic credentials the request carries (401 otherwise);
- ``ApiUser``: a management API user, its tags and the vhosts it may see;
- ``vhost_of``: the request's vhost (the ``vhost`` query parameter, ``/`` by default) once its
  credentials and permissions are checked (401, 403; 404 for an unknown vhost).
"""

from __future__ import annotations

import base64
import logging

import attrs
from starlette.requests import Request

from ...auth import AuthUser, LoginRefused, Peer
from ...auth.model import ADMINISTRATOR, MONITORING
from ...broker.broker import Broker
from ...broker.vhost import VirtualHost
from .errors import RequestError

log = logging.getLogger(__name__)


def broker_of(request: Request) -> Broker:
    """The broker the app serves."""
    broker = request.app.state.broker
    assert isinstance(broker, Broker)
    return broker


@attrs.frozen
class ApiUser:
    """A management API user: the authenticated user and the vhosts it may see (RabbitMQ's
    tags: ``administrator`` and ``monitoring`` see every vhost and every user's connections;
    ``management`` and ``policymaker`` the vhosts they have permissions on, and their own
    connections)."""

    auth: AuthUser
    vhosts: frozenset[str]

    @property
    def name(self) -> str:
        return self.auth.name

    @property
    def tags(self) -> frozenset[str]:
        return self.auth.tags

    @property
    def is_administrator(self) -> bool:
        return ADMINISTRATOR in self.auth.tags

    @property
    def sees_everything(self) -> bool:
        """Administrator or monitoring: every vhost, every user's connections and channels."""
        return bool(self.auth.tags & {ADMINISTRATOR, MONITORING})

    def may_open(self, vhost: str) -> bool:
        return vhost in self.vhosts


def peer_of(request: Request) -> Peer:
    """The request's peer address (not the address the server is bound to)."""
    return Peer(request.client.host if request.client else "")


async def user_of(request: Request) -> AuthUser:
    """The broker user the request's credentials name (401 without valid ones)."""
    broker = broker_of(request)
    scheme, _, encoded = request.headers.get("authorization", "").partition(" ")
    try:
        username, _, password = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:  # not base64 (binascii.Error), not ASCII, not UTF-8
        username = password = ""
    if scheme.lower() != "basic" or not username:
        raise RequestError(401, "HTTP Basic credentials of a broker user are required")
    try:
        return await broker.authenticator.login(username, password, peer_of(request))
    except LoginRefused as refused:
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in username[:200])
        log.warning("HTTP login refused: user '%s' - %s", shown, refused.reason)
        if refused.loopback:
            raise RequestError(401, f"user '{username}' can only connect via localhost") from None
        raise RequestError(401, "login refused") from None


async def vhost_of(request: Request) -> VirtualHost:
    """The request's vhost, once its credentials and permissions are checked."""
    broker = broker_of(request)
    user = await user_of(request)
    username = user.name
    name = request.query_params.get("vhost", "/")
    vhost = broker.vhosts.get(name)
    if vhost is None:  # first, as AMQP's connection.open ("vhost x not found")
        raise RequestError(404, f"no vhost '{name}'")
    if not await broker.authenticator.chain.check_vhost(user, name, peer_of(request)):
        raise RequestError(403, f"user '{username}' has no access to vhost '{name}'")
    return vhost
