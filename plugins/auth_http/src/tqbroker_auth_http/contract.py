"""The sans-IO half of the HTTP auth backend: RabbitMQ's ``rabbitmq_auth_backend_http`` contract
and the answer cache. No sockets here.

- ``Query``: one question to the service (which path, which form fields, in RabbitMQ's order);
- ``parse_answer``: the body of a 200/201 answer as an ``Answer`` (``allow`` [tags] or ``deny``
  [reason]); anything else raises ``BadAnswer`` (the backend then has no answer: refused);
- ``AnswerCache``: answers by an HMAC of the whole query under a per-process key (a password is
  never a cache key in clear), allows for ``ttl`` seconds, denies for ``deny_ttl``, at most
  ``size`` entries (least recently used dropped first).
"""

from __future__ import annotations

import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

import attrs

PathName = Literal["user_path", "vhost_path", "resource_path", "topic_path"]
PATH_NAMES: tuple[PathName, ...] = ("user_path", "vhost_path", "resource_path", "topic_path")
# RabbitMQ treats both as an answer; every other status is an error (no answer).
SUCCESSFUL_STATUSES = frozenset({200, 201})
MAX_REASON = 200  # characters of a deny reason that reach the log


class BadAnswer(Exception):
    """A 200 body that is neither ``allow`` nor ``deny``."""


@attrs.frozen
class Query:
    """One request to the service: the path option it goes to and its form fields."""

    path: PathName
    fields: tuple[tuple[str, str], ...]

    @property
    def has_secret(self) -> bool:
        return any(key == "password" for key, _ in self.fields)


@attrs.frozen
class Answer:
    """The service's answer: allowed (with tags, for ``user_path``) or denied (with the
    service's reason, if it gave one)."""

    allowed: bool
    tags: frozenset[str] = frozenset()
    reason: str = ""


def _tags(tags: Iterable[str]) -> str:
    return " ".join(sorted(tags))


def user_query(username: str, password: str | None) -> Query:
    """``user_path``: ``username`` and ``password`` (absent for EXTERNAL: a certificate login
    sends the user name only, as RabbitMQ does)."""
    fields = [("username", username)]
    if password is not None:
        fields.append(("password", password))
    return Query("user_path", tuple(fields))


def vhost_query(username: str, tags: Iterable[str], vhost: str, ip: str) -> Query:
    """``vhost_path``: ``username``, ``vhost``, ``ip`` (the client's address) and ``tags``."""
    fields = (("username", username), ("vhost", vhost), ("ip", ip), ("tags", _tags(tags)))
    return Query("vhost_path", fields)


def resource_query(
    username: str, tags: Iterable[str], vhost: str, kind: str, name: str, permission: str
) -> Query:
    """``resource_path``: ``resource`` is ``queue``, ``exchange`` or ``topic``; ``permission``
    ``configure``, ``write`` or ``read``; the default exchange is named ``amq.default``."""
    fields = (
        ("username", username),
        ("vhost", vhost),
        ("resource", kind),
        ("name", name),
        ("permission", permission),
        ("tags", _tags(tags)),
    )
    return Query("resource_path", fields)


def topic_query(
    username: str,
    tags: Iterable[str],
    vhost: str,
    exchange: str,
    routing_key: str,
    permission: str,
    variables: Mapping[str, str],
) -> Query:
    """``topic_path``: as ``resource_path`` with ``resource=topic`` and the exchange's name,
    plus ``routing_key`` and the pattern variables as ``variable_map.<name>`` (RabbitMQ's
    flattening of its context map)."""
    fields = [
        ("username", username),
        ("vhost", vhost),
        ("resource", "topic"),
        ("name", exchange),
        ("permission", permission),
        ("tags", _tags(tags)),
        ("routing_key", routing_key),
    ]
    fields += [(f"variable_map.{key}", value) for key, value in sorted(variables.items())]
    return Query("topic_path", tuple(fields))


def parse_answer(path: PathName, body: str) -> Answer:
    """The answer in a successful response's body, read as RabbitMQ reads it: surrounding
    blanks ignored, case-insensitive; ``deny`` or ``deny <reason>``; ``allow``, and for
    ``user_path`` ``allow <tag> <tag>...`` (the user's tags). BadAnswer for anything else."""
    text = body.strip()
    word, _, rest = text.partition(" ")
    word = word.lower()
    if word == "deny":
        return Answer(False, reason=_printable(rest.strip())[:MAX_REASON])
    if word == "allow" and (path == "user_path" or not rest.strip()):
        return Answer(True, frozenset(rest.lower().split()))
    raise BadAnswer(f"unexpected answer ({len(body)} characters, expected allow or deny)")


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def redact_url(url: str) -> str:
    """``url`` without the user information (``http://user:secret@host/p`` is
    ``http://host/p``) and without its query: what a log line may show."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class AnswerCache:
    """Answers of the service by query, allows for ``ttl`` seconds and denies for ``deny_ttl``
    (0: not kept); no answer (an error) is never kept. Keys are HMAC-SHA256 digests of the
    query under a key made at start, so no password is held in clear (or recoverable by
    hashing guesses offline)."""

    def __init__(
        self,
        ttl: float,
        deny_ttl: float,
        size: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl, self.deny_ttl, self.size, self._clock = ttl, deny_ttl, size, clock
        self._key = os.urandom(32)
        self._answers: OrderedDict[bytes, tuple[Answer, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def key(self, query: Query) -> bytes:
        # Each part length-prefixed, so no two different queries encode alike.
        parts = [query.path, *(part for field in query.fields for part in field)]
        data = b"".join(
            len(raw).to_bytes(4, "big") + raw
            for raw in (part.encode("utf-8", "surrogatepass") for part in parts)
        )
        return hmac.digest(self._key, data, "sha256")

    def get(self, key: bytes) -> Answer | None:
        entry = self._answers.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._answers[key]
            return None
        self._answers.move_to_end(key)
        return entry[0]

    def put(self, key: bytes, answer: Answer) -> None:
        ttl = self.ttl if answer.allowed else self.deny_ttl
        if ttl <= 0 or self.size <= 0:
            return
        self._answers[key] = (answer, self._clock() + ttl)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)
