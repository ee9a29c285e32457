"""Consistent-hash routing for tqbroker: the ``x-consistent-hash`` exchange type, compatible with
RabbitMQ's ``rabbitmq_consistent_hash_exchange`` plugin.

Responsibilities:
- ``hash_source``: the exchange arguments, checked as RabbitMQ checks them (``hash-header`` and
  ``hash-property`` mutually exclusive; only ``message_id``, ``correlation_id`` and ``timestamp``
  properties), in its words;
- ``parse_weight``: a binding key is the destination's weight, an integer >= 1 read as Erlang's
  ``list_to_integer`` reads it, refused in RabbitMQ's words (``erlang_binary`` prints the key as
  Erlang's ``~tp`` does);
- ``hash_input``, ``key_hash``, ``choose``: weighted rendezvous hashing of what a message is routed
  on (its routing key, the ``hash-header`` header or the ``hash-property`` property) over the
  bound destinations;
- ``ConsistentHashRouter``: each destination's weight, and the one destination of a message (a
  ``PropertyRouter``: the broker gives it the message's properties).

Placement. RabbitMQ picks a bucket with Lamping and Veach's jump consistent hash over
``sum(weights)`` buckets, seeded from ``erlang:phash2`` of the key term and drawing from Erlang's
``exs1024`` generator, and numbers the buckets in bind order (shifting later ones down when a
binding goes). Its exact placement therefore depends on Erlang term hashing and on the order
bindings were made (RabbitMQ documents that it may change across a restart), and it cannot keep
consistent hashing's promise when a binding other than the last goes: the buckets above it are
renumbered, so other destinations' keys move too (unbinding the middle of three weight-1 queues
moves about half of all keys, not a third). So placement here is not RabbitMQ's but keeps its
contract: a key's destination is the one with the lowest ``-ln(u) / weight``, where ``u`` in (0, 1)
comes from the 64-bit BLAKE2b hash of the key mixed (splitmix64) with a seed per destination
(BLAKE2b of its name). Each destination gets ``weight / sum(weights)`` of the keys; a key's
destination depends only on the key and the bound (name, weight) pairs, not on bind order, so it
is stable across restarts; binding a destination only moves keys to it and unbinding one only
moves its own keys.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Iterable, Mapping
from hashlib import blake2b
from typing import Final, NamedTuple, TypeVar, cast

from tqbroker.plugins import BasicProperties, FieldTable, FieldValue, encode_table

PROPERTIES: Final = ("correlation_id", "message_id", "timestamp")
MAX_WEIGHT: Final = 2**63 - 1

_MASK64: Final = (1 << 64) - 1
_TWO_POW_M53: Final = 2.0**-53
_INTEGER = re.compile(r"[+-]?[0-9]+")
_PERSON: Final = b"tqbroker-chx"  # BLAKE2b personalisation of destination seeds

D = TypeVar("D", bound=Hashable)


# -- exchange arguments and binding keys ---------------------------------------------------------


def hash_source(arguments: FieldTable) -> tuple[str | None, str | None]:
    """What an exchange hashes on: ``(header, property)``, both ``None`` for the routing key;
    ``ValueError`` (406) for arguments RabbitMQ refuses, in its words."""
    header = _string_argument(arguments, "hash-header")
    prop = _string_argument(arguments, "hash-property")
    if header is not None and prop is not None:
        raise ValueError("hash-header and hash-property are mutually exclusive")
    if prop is not None and prop not in PROPERTIES:
        raise ValueError(f"Unsupported property: {prop}")
    return header, prop


def _string_argument(arguments: FieldTable, name: str) -> str | None:
    value = arguments.get(name)
    if value is not None and not isinstance(value, str):  # RabbitMQ only reads longstr ones
        raise ValueError(f"{name} must be a string, not {type(value).__name__}")
    return value


def parse_weight(binding_key: str) -> int:
    """A binding key's weight, as RabbitMQ reads it: a decimal integer (optional sign, ASCII
    digits, nothing else) of at least 1."""
    if not _INTEGER.fullmatch(binding_key):
        shown = erlang_binary(binding_key.encode("utf-8", "surrogateescape"))
        raise ValueError(f"The binding key must be an integer: {shown}")
    weight = int(binding_key)
    if weight < 1:
        raise ValueError("The binding key must be greater than 0")
    if weight > MAX_WEIGHT:  # RabbitMQ would try to allocate that many buckets
        raise ValueError(f"The binding key must be at most {MAX_WEIGHT}")
    return weight


_ESCAPES: Final = {
    ord('"'): '\\"',
    ord("\\"): "\\\\",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
    ord("\v"): "\\v",
    ord("\b"): "\\b",
    ord("\f"): "\\f",
    0x1B: "\\e",
}


def _printable(code: int) -> bool:
    """Erlang's ``io_lib:printable_latin1_list`` test for one character (``+pc latin1``)."""
    return 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF or code in _ESCAPES


def erlang_binary(data: bytes) -> str:
    """``data`` as Erlang's ``io_lib:format("~tp", [Binary])`` prints it (on one line): valid
    UTF-8 of printable characters as ``<<"text">>`` (``<<"text"/utf8>>`` if not ASCII), other
    printable Latin-1 bytes as ``<<"text">>``, anything else as ``<<1,2,3>>``."""
    if not data:
        return "<<>>"
    try:
        text = data.decode("utf-8")
        suffix = "" if text.isascii() else "/utf8"
    except UnicodeDecodeError:
        text, suffix = data.decode("latin-1"), ""
    if not all(_printable(ord(c)) for c in text):
        return "<<" + ",".join(str(b) for b in data) + ">>"
    return '<<"' + text.translate(_ESCAPES) + '"' + suffix + ">>"


# -- hashing -------------------------------------------------------------------------------------


def hash_input(value: FieldValue) -> bytes | None:
    """The bytes a routing key or header value hashes as: a string's UTF-8, bytes as they are,
    any other field value its AMQP field-table encoding (type letter included). ``None`` for a
    void value, like a missing one."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return value
    try:
        return encode_table({"": value})
    except ValueError:  # not encodable: cannot have come off the wire
        return None


def key_hash(data: bytes | None) -> int:
    """The 64-bit hash of what a message is routed on: BLAKE2b with an 8-byte digest, read
    big-endian. A missing value (RabbitMQ's ``undefined``) hashes to 0: all such messages go to
    the same destination, as in RabbitMQ."""
    if data is None:
        return 0
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "big")


def destination_seed(ident: str) -> int:
    """A destination's 64-bit seed: BLAKE2b (8-byte digest, personalised) of its name."""
    raw = ident.encode("utf-8", "surrogateescape")
    return int.from_bytes(blake2b(raw, digest_size=8, person=_PERSON).digest(), "big")


def mix64(x: int) -> int:
    """The splitmix64 finaliser: a 64-bit bijection with full avalanche."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def score(key: int, seed: int, weight: float) -> float:
    """A destination's score for a key (the lowest wins): ``-ln(u) / weight``, with ``u`` the top
    53 bits of ``mix64(key ^ seed)`` as a float strictly between 0 and 1. Scores are exponentially
    distributed with rate ``weight``, so a destination wins ``weight / sum(weights)`` of keys."""
    u = ((mix64(key ^ seed) >> 11) + 0.5) * _TWO_POW_M53
    return -math.log(u) / weight


class Member(NamedTuple):
    """A bound destination as routing sees it."""

    ident: str
    seed: int
    weight: float
    destination: Hashable


def members(weights: Mapping[D, int]) -> tuple[Member, ...]:
    """The members for destinations and their weights, in ``ident`` order (ties on a score, which
    need equal 53-bit draws, go to the first)."""
    named = [(_name(destination), destination) for destination in weights]
    seen: dict[str, int] = {}
    for name, _ in named:
        seen[name] = seen.get(name, 0) + 1
    found = []
    for name, destination in named:
        # A queue and an exchange of the same name bound here are told apart by their kind.
        ident = name if seen[name] == 1 else f"{name}\0{type(destination).__qualname__}"
        weight = weights[destination]
        found.append(Member(ident, destination_seed(ident), float(weight), destination))
    found.sort(key=lambda member: member.ident)
    return tuple(found)


def _name(destination: Hashable) -> str:
    if isinstance(destination, str):
        return destination
    name = getattr(destination, "name", None)  # queues and exchanges
    return name if isinstance(name, str) else repr(destination)


def pick(key: int, candidates: Iterable[Member]) -> Member | None:
    """The member with the lowest score for ``key`` (``None`` if there is none)."""
    best: Member | None = None
    best_score = math.inf
    for member in candidates:
        u = ((mix64(key ^ member.seed) >> 11) + 0.5) * _TWO_POW_M53
        s = -math.log(u) / member.weight  # score(), inlined: this runs on every publish
        if s < best_score:
            best, best_score = member, s
    return best


def choose(data: bytes | None, weights: Mapping[D, int]) -> D | None:
    """Where a message routed on ``data`` goes, among destinations with these weights."""
    member = pick(key_hash(data), members(weights))
    return None if member is None else cast(D, member.destination)


# -- the exchange type ---------------------------------------------------------------------------


class ConsistentHashRouter:
    """One destination per message, chosen by consistent hashing of its routing key, of its
    ``hash-header`` header or of its ``hash-property`` property."""

    def __init__(self, header: str | None = None, prop: str | None = None) -> None:
        self.header = header
        self.prop = prop
        # Hashing the routing key, the destination depends only on it and the bindings: the
        # vhost may memoise it (plugins.spec). Not when hashing a header or a property.
        self.cacheable = header is None and prop is None
        # Each destination's weights in bind order; the first one counts. RabbitMQ likewise keeps
        # only the first binding between the exchange and a destination.
        self._weights: dict[Hashable, list[int]] = {}
        self._members: tuple[Member, ...] = ()

    @property
    def weights(self) -> dict[Hashable, int]:
        """The weight in effect for each bound destination."""
        return {destination: weights[0] for destination, weights in self._weights.items()}

    def bind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        self._weights.setdefault(destination, []).append(parse_weight(binding_key))
        self._members = members(self.weights)

    def unbind(self, destination: Hashable, binding_key: str, arguments: FieldTable) -> None:
        weights = self._weights.get(destination)
        try:
            weight = parse_weight(binding_key)
        except ValueError:  # never bound: bind refused it
            return
        if not weights or weight not in weights:
            return
        weights.remove(weight)
        if not weights:
            del self._weights[destination]
        self._members = members(self.weights)

    def route(self, routing_key: str, headers: FieldTable | None) -> Iterable[Hashable]:
        return self.route_message(routing_key, BasicProperties(headers=headers))

    def route_message(self, routing_key: str, properties: BasicProperties) -> Iterable[Hashable]:
        candidates = self._members
        if len(candidates) <= 1:
            return tuple(member.destination for member in candidates)
        data: bytes | None
        if self.prop is not None:  # a missing property routes like a missing header
            data = hash_input(getattr(properties, self.prop))
        elif self.header is not None:
            headers = properties.headers
            data = hash_input(headers.get(self.header) if headers else None)
        else:
            data = routing_key.encode("utf-8", "surrogateescape")
        member = pick(key_hash(data), candidates)
        assert member is not None
        return (member.destination,)


class ConsistentHashExchange:
    def validate(self, arguments: FieldTable) -> None:
        hash_source(arguments)

    def create_router(self, arguments: FieldTable) -> ConsistentHashRouter:
        return ConsistentHashRouter(*hash_source(arguments))


__all__ = [
    "ConsistentHashExchange",
    "ConsistentHashRouter",
    "Member",
    "choose",
    "destination_seed",
    "erlang_binary",
    "hash_input",
    "hash_source",
    "key_hash",
    "members",
    "mix64",
    "parse_weight",
    "pick",
    "score",
]
