"""RabbitMQ's vhost limits (``max-connections``, ``max-queues``) and user limits
(``max-connections``, ``max-channels``), and the counts they are checked against.

- ``check_limit``: a limit's name and value as RabbitMQ validates them (its texts); a negative
  value means no limit, 0 allows none;
- ``Limits``: the vhosts' limits (persisted with the definitions as RabbitMQ exports them: a
  ``parameters`` entry of component ``vhost-limits`` named ``limits``) and the users' (kept by
  the user database, in each user's ``limits`` as RabbitMQ exports users); the open connections
  per vhost and per user (``admit`` at ``connection.open``, ``release`` when it closes), each
  with its channel table, so a ``channel.open`` counts the user's channels;
- the refusals, in RabbitMQ's words: a connection over a limit gets 530 NOT_ALLOWED at
  ``connection.open``, a channel over the user's limit 530 too, a queue over the vhost's
  ``max-queues`` 406 PRECONDITION_FAILED.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Final

from ..protocol.errors import AMQPError, ReplyCode

VHOST_LIMITS: Final = ("max-connections", "max-queues")
USER_LIMITS: Final = ("max-connections", "max-channels")
COMPONENT: Final = "vhost-limits"  # the parameters entry vhost limits are exported as


class LimitError(ValueError):
    """A limit RabbitMQ would refuse (its text)."""


def _erlang(value: object) -> str:
    """A JSON value as RabbitMQ's validation message prints it (``<<"x">>`` for a string)."""
    if isinstance(value, str):
        return f"<<{json.dumps(value)}>>"
    if value is True or value is False:
        return str(value).lower()
    if value is None:
        return "null"
    return json.dumps(value)


def check_limit(name: str, value: object, known: Iterable[str], where: str) -> int:
    """``value`` for limit ``name`` of ``known`` (``where``: ``limits``, ``user-limits``);
    LimitError with RabbitMQ's text otherwise."""
    if name not in known:
        raise LimitError(
            f"Unrecognised terms [{{<<{json.dumps(name)}>>,{_erlang(value)}}}] in {where}"
        )
    if not isinstance(value, int) or isinstance(value, bool):
        raise LimitError(f"{name} should be a number, actually was {_erlang(value)}")
    return value


def _limited(limits: Mapping[str, int], name: str) -> int | None:
    """The limit ``name`` if one applies (absent or negative: none)."""
    value = limits.get(name, -1)
    return value if value >= 0 else None


class Limits:
    """The vhosts' limits, the users' (``users``: the user database's, by user), and the open
    connections they count."""

    def __init__(self, users: Mapping[str, Mapping[str, int]]) -> None:
        self.vhosts: dict[str, dict[str, int]] = {}
        self._users = users
        self._by_vhost: dict[str, set[object]] = {}
        self._by_user: dict[str, dict[object, Sized]] = {}
        self._admitted: dict[object, tuple[str, str]] = {}

    # -- vhost limits -------------------------------------------------------------------------

    def set_vhost(self, vhost: str, name: str, value: int) -> None:
        self.vhosts.setdefault(vhost, {})[name] = value

    def clear_vhost(self, vhost: str, name: str | None = None) -> None:
        """Clear one limit of ``vhost``, or all (the vhost was deleted)."""
        found = self.vhosts.get(vhost, {})
        if name is None:
            found.clear()
        else:
            found.pop(name, None)
        if not found:
            self.vhosts.pop(vhost, None)

    def max_queues(self, vhost: str) -> int | None:
        return _limited(self.vhosts.get(vhost, {}), "max-queues")

    def parameters(self, vhost: str | None = None) -> list[dict[str, Any]]:
        """The vhost limits as RabbitMQ's definitions hold them (``parameters`` entries)."""
        return [
            {"value": dict(value), "vhost": name, "component": COMPONENT, "name": "limits"}
            for name, value in sorted(self.vhosts.items())
            if value and (vhost is None or name == vhost)
        ]

    def load_parameters(
        self, entries: object, vhosts: Iterable[str] | None = None, vhost: str | None = None
    ) -> int:
        """Apply the ``vhost-limits`` entries of a definitions document's ``parameters``
        (others are not limits; malformed ones are skipped); ``vhost``: a vhost's import, every
        entry is that vhost's. How many entries were applied."""
        known = None if vhosts is None else set(vhosts)
        applied = 0
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or entry.get("component") != COMPONENT:
                continue
            name, value = vhost or entry.get("vhost", "/"), entry.get("value")
            if not isinstance(name, str) or not isinstance(value, dict):
                continue
            if known is not None and name not in known:
                continue
            applied += 1
            for limit, number in value.items():
                try:
                    self.set_vhost(name, limit, check_limit(limit, number, VHOST_LIMITS, "limits"))
                except LimitError:
                    continue
        return applied

    # -- connections and channels -------------------------------------------------------------

    def admit(self, key: object, user: str, vhost: str, channels: Sized) -> None:
        """Count a connection opening ``vhost`` as ``user`` (``channels``: its channel table),
        or refuse it (530) when the vhost or the user has its connection limit."""
        vhost_limit = _limited(self.vhosts.get(vhost, {}), "max-connections")
        if vhost_limit is not None and len(self._by_vhost.get(vhost, ())) >= vhost_limit:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED,
                f"access to vhost '{vhost}' refused for user '{user}': "
                f"connection limit ({vhost_limit}) is reached",
                hard=True,
            )
        user_limit = _limited(self._users.get(user, {}), "max-connections")
        if user_limit is not None and len(self._by_user.get(user, ())) >= user_limit:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED,
                f"connection refused for user '{user}': "
                f"user connection limit ({user_limit}) is reached",
                hard=True,
            )
        self._by_vhost.setdefault(vhost, set()).add(key)
        self._by_user.setdefault(user, {})[key] = channels
        self._admitted[key] = (user, vhost)

    def release(self, key: object) -> None:
        """The connection ``key`` closed (nothing if it was never admitted)."""
        found = self._admitted.pop(key, None)
        if found is None:
            return
        user, vhost = found
        self._by_vhost.get(vhost, set()).discard(key)
        if not self._by_vhost.get(vhost, True):
            del self._by_vhost[vhost]
        self._by_user.get(user, {}).pop(key, None)
        if not self._by_user.get(user, True):
            del self._by_user[user]

    def check_channel(self, user: str) -> None:
        """Before a ``channel.open`` of ``user``: 530 when the user's channels (across its
        connections) are at its ``max-channels``."""
        limit = _limited(self._users.get(user, {}), "max-channels")
        if limit is None:
            return
        if sum(len(table) for table in self._by_user.get(user, {}).values()) >= limit:
            raise AMQPError(
                ReplyCode.NOT_ALLOWED,
                f"number of channels opened for user '{user}' has reached the maximum "
                f"allowed user limit of ({limit})",
                hard=True,
            )


def queue_limit_error(queue: str, vhost: str, limit: int) -> AMQPError:
    """RabbitMQ's refusal of a ``queue.declare`` over the vhost's ``max-queues``."""
    return AMQPError(
        ReplyCode.PRECONDITION_FAILED,
        f"cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is reached",
    )


def is_vhost_limits(entry: object) -> bool:
    """Whether a ``parameters`` entry holds vhost limits (tqbroker models those)."""
    return isinstance(entry, dict) and entry.get("component") == COMPONENT


def vhost_metadata(description: object, tags: object) -> dict[str, Any]:
    """A vhost's description and tags as stored (only what is set)."""
    found: dict[str, Any] = {}
    if isinstance(description, str) and description:
        found["description"] = description
    if isinstance(tags, list) and tags and all(isinstance(t, str) for t in tags):
        found["tags"] = list(tags)
    return found


def vhost_settings(document: object) -> dict[str, Any]:
    """What of a stored definitions document is not topology: the ``parameters`` (the vhost
    limits among them) and each vhost's description and tags."""
    if not isinstance(document, dict):
        return {}
    metadata = {}
    for entry in document.get("vhosts") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            found = vhost_metadata(entry.get("description"), entry.get("tags"))
            if found:
                metadata[entry["name"]] = found
    parameters = document.get("parameters")
    return {
        "parameters": parameters if isinstance(parameters, list) else [],
        "vhost_metadata": metadata,
    }
