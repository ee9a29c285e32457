"""The management API's runtime changes to users and permissions, for administrators, with
RabbitMQ's paths, bodies, statuses and error reasons (checked against RabbitMQ 3.10):

- ``PUT /api/users/{name}`` (``tags`` required, a list or ``"a,b"``; ``password`` or
  ``password_hash`` + ``hashing_algorithm``; neither: a user without a password), 201 or 204;
  ``DELETE /api/users/{name}`` closes the user's connections (320 ``user 'x' is deleted``);
  ``POST /api/users/bulk-delete`` (``{"users": [...]}``);
- ``PUT/GET/DELETE /api/permissions/{vhost}/{user}`` (``configure``, ``write``, ``read``);
- ``PUT/GET/DELETE /api/topic-permissions/{vhost}/{user}`` (``exchange``, ``write``, ``read``).

Every change is saved to ``users.json`` before the answer and applies to the next check at once
(the user database's generation moves: permission caches are dropped). A password is never
logged nor answered.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ...auth import Permission, User
from ...auth.internal import UserDb, permission_json, topic_permission_json
from ...auth.model import TopicPermission
from ...auth.passwords import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    HashError,
    validate_hash,
)
from .auth import broker_of
from .errors import ApiError
from .mgmt_common import bad_request, json_body, not_found, segment
from .mgmt_connections import connections_of
from .mgmt_users import administrator

log = logging.getLogger(__name__)


def _missing(body: dict[str, Any], keys: tuple[str, ...]) -> None:
    """RabbitMQ's 400 for missing keys: ``[{key_missing,write},{key_missing,read}]``."""
    absent = [k for k in keys if k not in body]
    if absent:
        raise bad_request("[" + ",".join(f"{{key_missing,{k}}}" for k in absent) + "]")


def _string(body: dict[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string")
    return value


def _tags(value: object) -> frozenset[str]:
    """Tags as RabbitMQ 3.10 takes them: ``"a,b"`` or a list (blanks trimmed)."""
    if isinstance(value, str):
        return frozenset(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return frozenset(t.strip() for t in value if t.strip())
    raise bad_request("tags must be a comma-separated string or a list of strings")


def _pattern(value: str) -> str:
    """A permission pattern; RabbitMQ's ``invalid_regexp`` 400 if it does not compile."""
    try:
        re.compile(value or "^$")
    except re.error as exc:
        raise ApiError(
            400, "bad_request", ["invalid_regexp", value, [exc.msg, exc.pos or 0]]
        ) from None
    return value


async def _saved(request: Request) -> None:
    broker = broker_of(request)
    await broker.users.save(broker.config.data_dir)


def close_connections(
    request: Request, text: str, *, user: str | None = None, vhost: str | None = None
) -> int:
    """``connection.close`` 320 ``text`` to the connections of ``user``, or of ``vhost``."""
    closed = 0
    for entry in connections_of(request):
        handshake = entry.connection.handshake
        name = handshake.user.name if handshake.user is not None else None
        if (user is not None and name == user) or (
            vhost is not None and handshake.vhost_name == vhost
        ):
            entry.connection.shutdown(text)
            closed += 1
    return closed


def _user_from(name: str, body: dict[str, Any]) -> User:
    if "tags" not in body:
        raise bad_request("tags_not_present")
    tags = _tags(body["tags"])
    password, password_hash = body.get("password"), body.get("password_hash")
    if password is not None and password_hash is not None:
        raise bad_request("both_password_and_password_hash_are_provided")
    if password is not None:
        if not isinstance(password, str):
            raise bad_request("password must be a string")
        return User.with_password(name, password, tags)
    if password_hash is None:
        return User(name, "", DEFAULT_ALGORITHM, tags)  # no password: only EXTERNAL logs in
    algorithm = body.get("hashing_algorithm", DEFAULT_ALGORITHM)
    if not isinstance(password_hash, str) or not isinstance(algorithm, str):
        raise bad_request("password_hash and hashing_algorithm must be strings")
    if algorithm not in ALGORITHMS:
        raise bad_request(f"unknown hashing_algorithm {algorithm!r}")
    try:
        validate_hash(password_hash, algorithm)
    except HashError as exc:
        if "base64" in str(exc):
            raise ApiError(400, "bad_request", ["not_base64", password_hash]) from None
        raise bad_request(str(exc)) from None
    return User(name, password_hash, algorithm, tags)


async def put_user(request: Request) -> Response:
    """``PUT /api/users/{name}``: create (201) or replace (204) a user; its permissions and
    connections stay (a changed password applies to the next login, as in RabbitMQ)."""
    await administrator(request)
    name = segment(request, "name")
    user = _user_from(name, await json_body(request))
    db = broker_of(request).users
    existed = db.get(name) is not None
    db.put_user(user)
    await _saved(request)
    log.info(
        "%s user '%s' (tags: %s)",
        "updated" if existed else "created",
        name,
        ", ".join(sorted(user.tags)) or "none",
    )
    return Response(status_code=204 if existed else 201)


def _delete_user(request: Request, db: UserDb, name: str) -> bool:
    if not db.delete_user(name):
        return False
    closed = close_connections(request, f"user '{name}' is deleted", user=name)
    log.info("deleted user '%s' (closing its %d connection(s))", name, closed)
    return True


async def delete_user(request: Request) -> Response:
    """``DELETE /api/users/{name}``: the user, its permissions and limits go; its connections
    are closed (320 ``user 'x' is deleted``, as RabbitMQ)."""
    await administrator(request)
    if not _delete_user(request, broker_of(request).users, segment(request, "name")):
        raise not_found()
    await _saved(request)
    return Response(status_code=204)


async def bulk_delete_users(request: Request) -> Response:
    """``POST /api/users/bulk-delete`` ``{"users": [...]}``: the existing ones are deleted; a
    missing one is then named (400 ``["no_such_user", name]``, as RabbitMQ)."""
    await administrator(request)
    body = await json_body(request)
    _missing(body, ("users",))
    names = body["users"]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise bad_request("users must be a list of names")
    db = broker_of(request).users
    missing = [n for n in names if not _delete_user(request, db, n)]
    await _saved(request)
    if missing:
        raise ApiError(400, "bad_request", ["no_such_user", missing[0]])
    return Response(status_code=204)


def _user_and_vhost(request: Request) -> tuple[str, str]:
    """The path's user and vhost, both existing (RabbitMQ's 400 otherwise)."""
    user, vhost = segment(request, "user"), segment(request, "vhost")
    broker = broker_of(request)
    if broker.users.get(user) is None or vhost not in broker.vhosts:
        raise bad_request("vhost_or_user_not_found")
    return user, vhost


async def put_permissions(request: Request) -> Response:
    """``PUT /api/permissions/{vhost}/{user}``: 201 (new) or 204."""
    await administrator(request)
    body = await json_body(request)
    user, vhost = _user_and_vhost(request)
    _missing(body, ("configure", "write", "read"))
    patterns = [_pattern(_string(body, k)) for k in ("configure", "write", "read")]
    db = broker_of(request).users
    existed = db.permission(user, vhost) is not None
    db.set_permissions(user, vhost, Permission(*patterns))
    await _saved(request)
    log.info("set permissions of user '%s' on vhost '%s' to %s", user, vhost, patterns)
    return Response(status_code=204 if existed else 201)


async def show_permissions(request: Request) -> Response:
    """``GET /api/permissions/{vhost}/{user}``."""
    await administrator(request)
    user, vhost = segment(request, "user"), segment(request, "vhost")
    found = broker_of(request).users.permission(user, vhost)
    if found is None:
        raise not_found()
    return JSONResponse(permission_json(user, vhost, found))


async def delete_permissions(request: Request) -> Response:
    """``DELETE /api/permissions/{vhost}/{user}``: 204, or 404 if there were none."""
    await administrator(request)
    user, vhost = segment(request, "user"), segment(request, "vhost")
    if not broker_of(request).users.clear_permissions(user, vhost):
        raise not_found()
    await _saved(request)
    log.info("cleared permissions of user '%s' on vhost '%s'", user, vhost)
    return Response(status_code=204)


async def put_topic_permissions(request: Request) -> Response:
    """``PUT /api/topic-permissions/{vhost}/{user}``: 201 when the user had none on the vhost,
    204 otherwise (as RabbitMQ)."""
    await administrator(request)
    body = await json_body(request)
    user, vhost = _user_and_vhost(request)
    _missing(body, ("exchange", "write", "read"))
    exchange = _string(body, "exchange")
    write, read = (_pattern(_string(body, k)) for k in ("write", "read"))
    db = broker_of(request).users
    existed = bool(db.topic_permissions_of(user=user, vhost=vhost))
    db.set_topic_permissions(user, vhost, TopicPermission(exchange, write, read))
    await _saved(request)
    log.info(
        "set topic permissions of user '%s' on exchange '%s' in vhost '%s'", user, exchange, vhost
    )
    return Response(status_code=204 if existed else 201)


async def show_topic_permissions(request: Request) -> Response:
    """``GET /api/topic-permissions/{vhost}/{user}``: the list, 404 if there is none."""
    await administrator(request)
    user, vhost = segment(request, "user"), segment(request, "vhost")
    rows = broker_of(request).users.topic_permissions_of(user=user, vhost=vhost)
    if not rows:
        raise not_found()
    return JSONResponse([topic_permission_json(*row) for row in rows])


async def delete_topic_permissions(request: Request) -> Response:
    """``DELETE /api/topic-permissions/{vhost}/{user}``: every exchange's; 404 if none."""
    await administrator(request)
    user, vhost = segment(request, "user"), segment(request, "vhost")
    if not broker_of(request).users.clear_topic_permissions(user, vhost):
        raise not_found()
    await _saved(request)
    return Response(status_code=204)
