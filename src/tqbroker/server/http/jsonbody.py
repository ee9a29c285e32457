"""JSON request bodies, parsed with bounds: at most ``MAX_JSON_VALUES`` values (413, counted
before parsing), at most ``MAX_JSON_DEPTH`` levels (400), NaN and the infinities refused.

The C parser holds the GIL (a worker thread would not let the event loop run either), so a
large body is parsed a piece at a time on the event loop (``parse_json_paced``): the first two
levels of arrays and objects element by element, each element by the C parser, with a
checkpoint whenever a time slice is used up; other clients run in between.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from ...broker.pacing import Pacer
from .errors import RequestError

# ~0.1-1 us a value: one body's parse is bounded; each piece of a paced one far more so.
MAX_JSON_VALUES = 100_000
MAX_JSON_DEPTH = 64
# Bodies at least this long are parsed piecewise (``parse_json_paced``).
PACED_BYTES = 64 * 1024
# A body opening with more nested arrays or objects than that (so it is refused as too deep
# even when it is also too big to parse).
_DEEP_START = re.compile(rb'(?:\s*(?:"(?:[^"\\]|\\.)*"\s*:\s*)?[\[{]){%d}' % (MAX_JSON_DEPTH + 1))
_SPACE = re.compile(r"[ \t\n\r]*")
# Levels parsed element by element (``{"records": [<each record>]}``: two).
_PACED_LEVELS = 2


def no_constants(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and the infinities are not JSON numbers."""
    raise ValueError(f"{name} is not a JSON number")


_DECODER = json.JSONDecoder(parse_constant=no_constants)
# The decoder's C scanner (one value at a position) and string scanner (not in the stubs).
_scan_once: Callable[[str, int], tuple[Any, int]] = _DECODER.scan_once  # type: ignore[attr-defined]
scanstring: Callable[[str, int], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _counted(raw: bytes, what: str, max_values: int = MAX_JSON_VALUES) -> int:
    """The brackets in ``raw``, once its values (an upper bound: commas, colons, brackets) are
    within ``max_values`` (413; 400 for a body that opens too deep)."""
    brackets = raw.count(b"[") + raw.count(b"{")
    if brackets + raw.count(b",") + raw.count(b":") + 1 > max_values:
        if _DEEP_START.match(raw):
            raise _too_deep(what)
        raise RequestError(413, f"{what} holds more than {max_values} JSON values")
    return brackets


def _too_deep(what: str) -> RequestError:
    return RequestError(400, f"{what} is nested too deep (over {MAX_JSON_DEPTH} levels)")


def parse_json(raw: bytes, what: str = "the request body") -> Any:
    """``raw`` as JSON, in one go (for small bodies: under ``PACED_BYTES``, so within every
    bound of values). ``ValueError`` (not JSON) is the caller's to word; ``RequestError`` for
    the bounds."""
    brackets = _counted(raw, what)
    try:
        body = json.loads(raw, parse_constant=no_constants)
    except RecursionError:
        raise _too_deep(what) from None
    if brackets > MAX_JSON_DEPTH and depth(body) > MAX_JSON_DEPTH:
        raise _too_deep(what)
    return body


async def parse_json_paced(
    raw: bytes, what: str = "the request body", max_values: int = MAX_JSON_VALUES
) -> Any:
    """``parse_json``, giving way to other clients while a large body is parsed
    (``max_values``: a larger bound for a body known to be big, a definitions import)."""
    if len(raw) < PACED_BYTES:
        return parse_json(raw, what)
    _counted(raw, what, max_values)
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")
    pacer = Pacer()
    try:
        value, end = await _value(text, _SPACE.match(text, 0).end(), 1, pacer, what)  # type: ignore[union-attr]
    except RecursionError:
        raise _too_deep(what) from None
    if _SPACE.match(text, end).end() != len(text):  # type: ignore[union-attr]
        raise ValueError(f"extra data at character {end}")
    return value


async def _value(text: str, at: int, level: int, pacer: Pacer, what: str) -> tuple[Any, int]:
    """The JSON value at ``at`` (no leading space) and where it ends."""
    opening = text[at : at + 1]
    if level > _PACED_LEVELS or opening not in ("[", "{"):
        try:
            value, end = _scan_once(text, at)
        except StopIteration:  # the C scanner's "no value here"
            raise ValueError(f"expecting a value at character {at}") from None
        if depth(value) + level - 1 > MAX_JSON_DEPTH:
            raise _too_deep(what)
        await pacer.step()
        return value, end
    closing = "]" if opening == "[" else "}"
    items: list[Any] = []
    members: dict[str, Any] = {}
    at = _space(text, at + 1)
    if text[at : at + 1] == closing:
        return (items if opening == "[" else members), at + 1
    while True:
        if opening == "{":
            if text[at : at + 1] != '"':
                raise ValueError(f"expecting a property name at character {at}")
            key, at = scanstring(text, at + 1)
            at = _space(text, at)
            if text[at : at + 1] != ":":
                raise ValueError(f"expecting ':' at character {at}")
            at = _space(text, at + 1)
        value, at = await _value(text, at, level + 1, pacer, what)
        if opening == "{":
            members[key] = value
        else:
            items.append(value)
        at = _space(text, at)
        follows = text[at : at + 1]
        if follows == closing:
            return (items if opening == "[" else members), at + 1
        if follows != ",":
            raise ValueError(f"expecting ',' or {closing!r} at character {at}")
        at = _space(text, at + 1)


def _space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]


def depth(value: Any) -> int:
    """How deep JSON arrays and objects nest in ``value`` (iterative: no recursion limit)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:
            pending.extend((v, level + 1) for v in item if isinstance(v, dict | list))
    return deepest
