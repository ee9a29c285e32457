"""A published message's content-header properties: validated as the decoder would, decoded only
when needed.

Responsibilities:
- ``check_properties``: a publish's property block validated exactly as
  ``BasicProperties.decode`` would (the same ``DecodeError``), decoded only when that is cheap or
  needed (reply-to, expiration, headers);
- ``decode_properties``: ``BasicProperties.decode``, memoised for blocks without headers.

The memo (raw bytes -> decoded, or None: valid, not decoded yet) is process-wide on purpose: a
message's properties are decoded wherever it is routed or delivered, far from the connection that
checked them. It is a pure cache: a block without headers decodes to an immutable value (strings
and integers), equal whoever decodes it, and each dict operation is atomic, so connections and
brokers in threads may share it. Bounded: emptied when full; only blocks of at most
``_PROPERTIES_KEY_MAX`` bytes.
"""

from __future__ import annotations

import logging
from typing import Final

from .methods import (
    CONTINUATION_FLAG,
    EXPIRATION_FLAG,
    HEADERS_FLAG,
    PROPERTY_LAYOUT,
    REPLY_TO_FLAG,
    BasicProperties,
)

log = logging.getLogger(__name__)

_PROPERTIES: dict[bytes, BasicProperties | None] = {}
_PROPERTIES_MAX: Final = 1024
_PROPERTIES_KEY_MAX: Final = 256
_UNKNOWN: Final = BasicProperties()  # not in _PROPERTIES

# Properties a publish must look at (reply-to, expiration), or that need a full decode to be
# validated (headers: a field table), or that ``BasicProperties.decode`` refuses (continuation).
_DECODE_FLAGS: Final = HEADERS_FLAG | REPLY_TO_FLAG | EXPIRATION_FLAG | CONTINUATION_FLAG
# The width of a fixed-size property type; 0: a shortstr.
_WIDTHS: Final = {"octet": 1, "timestamp": 8, "shortstr": 0}
# The other properties in wire order: flag, width.
_PLAIN_PROPERTIES: Final = tuple(
    (flag, _WIDTHS[kind]) for _name, flag, kind in PROPERTY_LAYOUT if not flag & _DECODE_FLAGS
)
_PLAIN_FLAGS: Final = sum(flag for flag, _width in _PLAIN_PROPERTIES)


def _plans() -> dict[int, tuple[int, ...]]:
    """Every flags word without ``_DECODE_FLAGS`` -> the widths of its properties, in order."""
    plans: dict[int, tuple[int, ...]] = {0: ()}
    for flag, width in reversed(_PLAIN_PROPERTIES):  # the last property first: prepend
        plans |= {key | flag: (width, *plan) for key, plan in plans.items()}
    spare = 0xFFFF & ~_PLAIN_FLAGS & ~_DECODE_FLAGS  # bits no property uses: ignored
    for bit in (1 << i for i in range(16)):
        if spare & bit:
            plans |= {key | bit: plan for key, plan in plans.items()}
    return plans


# Computed once: immutable data, not a memo.
_PLANS: Final = _plans()


def decode_properties(raw: bytes) -> BasicProperties:
    """``BasicProperties.decode`` (same result, same ``DecodeError``), memoised for property
    blocks without headers."""
    if type(raw) is not bytes:  # a bytearray or memoryview from a backend: not a dict key
        return BasicProperties.decode(memoryview(raw))
    properties = _PROPERTIES.get(raw)
    if properties is None:
        properties = BasicProperties.decode(memoryview(raw))
        if properties.headers is None:
            _remember(raw, properties)
    return properties


def _remember(raw: bytes, properties: BasicProperties | None) -> None:
    if len(raw) <= _PROPERTIES_KEY_MAX:
        if len(_PROPERTIES) >= _PROPERTIES_MAX:
            _PROPERTIES.clear()
        _PROPERTIES[raw] = properties


def check_properties(raw: bytes) -> BasicProperties | None:
    """Validate a published property block as ``BasicProperties.decode`` does (the same
    ``DecodeError`` for a bad one), decoding it only when that is cheap or needed: the decoded
    properties when they are memoised or carry headers, reply-to or expiration; otherwise None,
    which means the block is valid and ``decode_properties`` will decode it whenever asked."""
    properties = _PROPERTIES.get(raw, _UNKNOWN)
    if properties is not _UNKNOWN:
        return properties
    if len(raw) >= 2:
        flags = raw[0] << 8 | raw[1]
        if not flags & _DECODE_FLAGS and _plain_properties_valid(raw, flags):
            _remember(raw, None)
            return None
    return decode_properties(raw)  # raises what the decoder says


def _plain_properties_valid(raw: bytes, flags: int) -> bool:
    """Whether ``BasicProperties.decode`` accepts ``raw``, whose flags announce none of
    ``_DECODE_FLAGS``, walking the bytes without building anything. Never True for a block the
    decoder refuses (False may be pessimistic: the caller decodes then)."""
    size = len(raw)
    off = 2
    for width in _PLANS[flags]:
        if width:
            off += width
            if off > size:
                return False
            continue
        if off >= size:
            return False
        end = off + 1 + raw[off]
        if end > size:
            return False
        text = raw[off + 1 : end]
        if not text.isascii():
            try:
                text.decode()
            except UnicodeDecodeError:
                return False
        off = end
    return True


__all__ = ["check_properties", "decode_properties"]
