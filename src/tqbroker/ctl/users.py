"""rabbitmqctl's user, permission, vhost and limit commands, over the management API (so they
work against tqbroker and RabbitMQ alike), with rabbitmqctl's names and arguments (``add_user``
also works for ``add-user``):

- ``add-user NAME [PASSWORD]``, ``change-password NAME [PASSWORD]`` (no PASSWORD: one line of
  standard input, never echoed), ``clear-password NAME``, ``delete-user NAME``,
  ``set-user-tags NAME [TAG...]``, ``list-users``;
- ``set-permissions [-p VHOST] USER CONF WRITE READ``, ``clear-permissions [-p VHOST] USER``,
  ``list-permissions [-p VHOST]``, ``list-user-permissions USER``;
- ``set-topic-permissions [-p VHOST] USER EXCHANGE WRITE READ``,
  ``clear-topic-permissions [-p VHOST] USER``, ``list-topic-permissions [-p VHOST]``;
- ``add-vhost NAME [--description D] [--tags a,b]``, ``delete-vhost NAME``;
- ``set-vhost-limits [-p VHOST] JSON``, ``clear-vhost-limits [-p VHOST]``,
  ``list-vhost-limits [-p VHOST]``, ``set-user-limits USER JSON``,
  ``clear-user-limits USER NAME|all``, ``list-user-limits [USER]`` (JSON as rabbitmqctl takes
  it, ``'{"max-connections": 10}'``; ``set-*-limits`` replaces the limits, as rabbitmqctl).

A password is never printed, neither in output nor in an error.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from . import output
from .api import Api, CommandError, UsageError, quote


def _command(
    subparsers: argparse._SubParsersAction[Any], common: Any, name: str, help: str, run: Any
) -> argparse.ArgumentParser:
    # rabbitmqctl's own spelling works too: add_user, set_permissions, ...
    aliases = [name.replace("-", "_")]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, parents=[common], help=help, aliases=aliases
    )
    parser.set_defaults(run=run)
    return parser


def add(subparsers: argparse._SubParsersAction[Any], common: Any) -> None:
    for name, help, run in [
        ("add-user", "add a user (PASSWORD, or one line of standard input)", add_user),
        ("change-password", "change a user's password (as add-user takes it)", change_password),
    ]:
        parser = _command(subparsers, common, name, help, run)
        parser.add_argument("user")
        parser.add_argument("password", nargs="?", help="omitted: read from standard input")
    for name, help, run in [
        ("clear-password", "remove a user's password (only EXTERNAL logs it in)", clear_password),
        ("delete-user", "delete a user (its connections are closed)", delete_user),
        ("clear-permissions", "clear a user's permissions in the vhost", clear_permissions),
        ("clear-topic-permissions", "clear a user's topic permissions", clear_topic_permissions),
        ("list-user-permissions", "a user's permissions in every vhost", list_user_permissions),
    ]:
        _command(subparsers, common, name, help, run).add_argument("user")
    tags = _command(subparsers, common, "set-user-tags", "replace a user's tags", set_user_tags)
    tags.add_argument("user")
    tags.add_argument("tags", nargs="*", metavar="TAG")
    _command(subparsers, common, "list-users", "users and their tags", list_users)
    permissions = _command(
        subparsers, common, "set-permissions", "set a user's permissions", set_permissions
    )
    for argument in ("user", "configure", "write", "read"):
        permissions.add_argument(argument)
    _command(subparsers, common, "list-permissions", "permissions in the vhost", list_permissions)
    topic = _command(
        subparsers,
        common,
        "set-topic-permissions",
        "set a user's topic permissions on an exchange",
        set_topic_permissions,
    )
    for argument in ("user", "exchange", "write", "read"):
        topic.add_argument(argument)
    _command(
        subparsers,
        common,
        "list-topic-permissions",
        "topic permissions in the vhost",
        list_topic_permissions,
    )
    vhost = _command(subparsers, common, "add-vhost", "add a virtual host", add_vhost)
    vhost.add_argument("name")
    vhost.add_argument("--description", default="")
    vhost.add_argument("--tags", default="", help="comma-separated")
    _command(
        subparsers, common, "delete-vhost", "delete a vhost and all it holds", delete_vhost
    ).add_argument("name")
    limits = _command(
        subparsers, common, "set-vhost-limits", "replace the vhost's limits", set_vhost_limits
    )
    limits.add_argument("limits", help="JSON, e.g. '{\"max-connections\": 64}'")
    _command(subparsers, common, "clear-vhost-limits", "clear the vhost's limits", clear_vhost)
    _command(subparsers, common, "list-vhost-limits", "the vhost's limits", list_vhost_limits)
    user_limits = _command(
        subparsers, common, "set-user-limits", "replace a user's limits", set_user_limits
    )
    user_limits.add_argument("user")
    user_limits.add_argument("limits", help="JSON, e.g. '{\"max-channels\": 16}'")
    clear = _command(
        subparsers, common, "clear-user-limits", "clear a user's limits", clear_user_limits
    )
    clear.add_argument("user")
    clear.add_argument("name", help="max-connections, max-channels or all")
    listing = _command(subparsers, common, "list-user-limits", "users' limits", list_user_limits)
    listing.add_argument("user", nargs="?")


# -- users ----------------------------------------------------------------------------------


def _user_path(name: str) -> str:
    return f"/api/users/{quote(name)}"


def _password(args: argparse.Namespace) -> str:
    """The command line's password, or one line of standard input (prompted on a terminal,
    without echo)."""
    if args.password is not None:
        return str(args.password)
    if sys.stdin.isatty():
        return getpass.getpass("Password: ")
    line = sys.stdin.readline()
    if not line:
        raise UsageError("no password given (as an argument or on standard input)")
    return line.rstrip("\r\n")


def _existing(api: Api, name: str) -> dict[str, Any]:
    try:
        found = api.get(_user_path(name))
    except CommandError as exc:
        if str(exc).startswith("404"):
            raise CommandError(f"no user '{name}'") from None
        raise
    if not isinstance(found, dict):
        raise CommandError(f"{_user_path(name)}: expected an object")
    return found


def _tags_of(user: dict[str, Any]) -> str:
    tags = user.get("tags", [])
    return ",".join(tags) if isinstance(tags, list) else str(tags)


def add_user(args: argparse.Namespace, api: Api) -> int:
    try:
        api.get(_user_path(args.user))
    except CommandError as exc:
        if not str(exc).startswith("404"):
            raise
    else:
        raise CommandError(f"user '{args.user}' already exists")
    api.request("PUT", _user_path(args.user), {"password": _password(args), "tags": ""})
    print(f"added user '{args.user}'")
    return 0


def change_password(args: argparse.Namespace, api: Api) -> int:
    tags = _tags_of(_existing(api, args.user))
    api.request("PUT", _user_path(args.user), {"password": _password(args), "tags": tags})
    print(f"changed the password of user '{args.user}'")
    return 0


def clear_password(args: argparse.Namespace, api: Api) -> int:
    tags = _tags_of(_existing(api, args.user))
    api.request("PUT", _user_path(args.user), {"tags": tags})
    print(f"cleared the password of user '{args.user}'")
    return 0


def delete_user(args: argparse.Namespace, api: Api) -> int:
    try:
        api.request("DELETE", _user_path(args.user))
    except CommandError as exc:
        if str(exc).startswith("404"):
            raise CommandError(f"no user '{args.user}'") from None
        raise
    print(f"deleted user '{args.user}'")
    return 0


def set_user_tags(args: argparse.Namespace, api: Api) -> int:
    """The password (its hash) is kept: the user is written back with new tags."""
    user = _existing(api, args.user)
    body = {
        "password_hash": user.get("password_hash", ""),
        "hashing_algorithm": user.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
        "tags": ",".join(args.tags),
    }
    api.request("PUT", _user_path(args.user), body)
    print(f"set the tags of user '{args.user}' to [{', '.join(args.tags)}]")
    return 0


def _emit(args: argparse.Namespace, columns: list[str], rows: Any, fields: list[str]) -> int:
    if not isinstance(rows, list):
        raise CommandError("expected a list")
    table = [[row.get(f) for f in fields] for row in rows if isinstance(row, dict)]
    output.emit(args.format, columns, table)
    return 0


def list_users(args: argparse.Namespace, api: Api) -> int:
    rows = api.get("/api/users")
    return _emit(args, ["user", "tags"], rows, ["name", "tags"])


# -- permissions ----------------------------------------------------------------------------


def _permissions_path(api: Api, user: str, kind: str = "permissions") -> str:
    return f"/api/{kind}/{quote(api.vhost)}/{quote(user)}"


def set_permissions(args: argparse.Namespace, api: Api) -> int:
    body = {"configure": args.configure, "write": args.write, "read": args.read}
    api.request("PUT", _permissions_path(api, args.user), body)
    print(f"set permissions of user '{args.user}' in vhost '{api.vhost}'")
    return 0


def _delete_if_there(api: Api, path: str) -> None:
    """DELETE ``path``; one that is not there (404) is already as asked."""
    try:
        api.request("DELETE", path)
    except CommandError as exc:
        if not str(exc).startswith("404"):
            raise


def clear_permissions(args: argparse.Namespace, api: Api) -> int:
    _delete_if_there(api, _permissions_path(api, args.user))
    print(f"cleared permissions of user '{args.user}' in vhost '{api.vhost}'")
    return 0


def list_permissions(args: argparse.Namespace, api: Api) -> int:
    rows = api.get(f"/api/vhosts/{quote(api.vhost)}/permissions")
    fields = ["user", "configure", "write", "read"]
    return _emit(args, fields, rows, fields)


def list_user_permissions(args: argparse.Namespace, api: Api) -> int:
    rows = api.get(_user_path(args.user) + "/permissions")
    fields = ["vhost", "configure", "write", "read"]
    return _emit(args, fields, rows, fields)


def set_topic_permissions(args: argparse.Namespace, api: Api) -> int:
    body = {"exchange": args.exchange, "write": args.write, "read": args.read}
    api.request("PUT", _permissions_path(api, args.user, "topic-permissions"), body)
    print(
        f"set topic permissions of user '{args.user}' on exchange '{args.exchange}' "
        f"in vhost '{api.vhost}'"
    )
    return 0


def clear_topic_permissions(args: argparse.Namespace, api: Api) -> int:
    _delete_if_there(api, _permissions_path(api, args.user, "topic-permissions"))
    print(f"cleared topic permissions of user '{args.user}' in vhost '{api.vhost}'")
    return 0


def list_topic_permissions(args: argparse.Namespace, api: Api) -> int:
    rows = api.get(f"/api/vhosts/{quote(api.vhost)}/topic-permissions")
    fields = ["user", "exchange", "write", "read"]
    return _emit(args, fields, rows, fields)


# -- vhosts and limits ----------------------------------------------------------------------


def add_vhost(args: argparse.Namespace, api: Api) -> int:
    body = {"description": args.description, "tags": args.tags}
    api.request("PUT", f"/api/vhosts/{quote(args.name)}", body)
    print(f"added vhost '{args.name}'")
    return 0


def delete_vhost(args: argparse.Namespace, api: Api) -> int:
    try:
        api.request("DELETE", f"/api/vhosts/{quote(args.name)}")
    except CommandError as exc:
        if str(exc).startswith("404"):
            raise CommandError(f"no vhost '{args.name}'") from None
        raise
    print(f"deleted vhost '{args.name}'")
    return 0


def _limits(text: str) -> dict[str, Any]:
    try:
        limits = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"the limits are not JSON: {exc}") from None
    if not isinstance(limits, dict):
        raise UsageError("the limits are a JSON object, e.g. '{\"max-connections\": 10}'")
    return limits


def _current(api: Api, path: str) -> dict[str, Any]:
    rows = api.get(path)
    if isinstance(rows, list) and rows and isinstance(rows[0], dict):
        value = rows[0].get("value")
        return value if isinstance(value, dict) else {}
    return {}


def _replace_limits(api: Api, path: str, limits: dict[str, Any]) -> None:
    """PUT each limit given, DELETE those set and not given (rabbitmqctl replaces them)."""
    for name in _current(api, path):
        if name not in limits:
            api.request("DELETE", f"{path}/{quote(name)}")
    for name, value in limits.items():
        api.request("PUT", f"{path}/{quote(name)}", {"value": value})


def set_vhost_limits(args: argparse.Namespace, api: Api) -> int:
    _replace_limits(api, f"/api/vhost-limits/{quote(api.vhost)}", _limits(args.limits))
    print(f"set the limits of vhost '{api.vhost}'")
    return 0


def clear_vhost(args: argparse.Namespace, api: Api) -> int:
    _replace_limits(api, f"/api/vhost-limits/{quote(api.vhost)}", {})
    print(f"cleared the limits of vhost '{api.vhost}'")
    return 0


def list_vhost_limits(args: argparse.Namespace, api: Api) -> int:
    rows = api.get(f"/api/vhost-limits/{quote(api.vhost)}")
    return _emit(args, ["vhost", "limits"], rows, ["vhost", "value"])


def set_user_limits(args: argparse.Namespace, api: Api) -> int:
    _replace_limits(api, f"/api/user-limits/{quote(args.user)}", _limits(args.limits))
    print(f"set the limits of user '{args.user}'")
    return 0


def clear_user_limits(args: argparse.Namespace, api: Api) -> int:
    path = f"/api/user-limits/{quote(args.user)}"
    if args.name == "all":
        _replace_limits(api, path, {})
    else:
        api.request("DELETE", f"{path}/{quote(args.name)}")
    print(f"cleared the limits of user '{args.user}'")
    return 0


def list_user_limits(args: argparse.Namespace, api: Api) -> int:
    path = "/api/user-limits" + (f"/{quote(args.user)}" if args.user else "")
    return _emit(args, ["user", "limits"], api.get(path), ["user", "value"])
