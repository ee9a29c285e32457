"""Hypothesis strategies and helpers shared by the protocol tests.

The wire type of every method field comes from the spec file itself (parsed with the generator's
own parser), so the strategies follow the spec rather than the generated Python annotations.
"""

from __future__ import annotations

import datetime
import decimal
import importlib.util
import math
import struct
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
from hypothesis import strategies as st

from tqbroker.protocol import methods
from tqbroker.protocol.codec import FieldValue

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "tools" / "gen_protocol.py"


def load_generator() -> ModuleType:
    """Import ``tools/gen_protocol.py`` (not a package) as a module."""
    name = "_tqbroker_gen_protocol"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, GENERATOR)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_gen = load_generator()
SPEC_METHODS, SPEC_PROPERTIES = _gen.parse_spec(_gen.SPEC.read_text())

# method class -> [(field name, wire type)], straight from the spec
WIRE_FIELDS: dict[type[methods.Method], list[tuple[str, str]]] = {
    methods.METHODS[(m.class_id << 16) | m.method_id]: [(f.name, f.type) for f in m.fields]
    for m in SPEC_METHODS
}
PROPERTY_FIELDS: list[tuple[str, str]] = [(f.name, f.type) for f in SPEC_PROPERTIES]
ALL_METHOD_CLASSES = sorted(methods.METHODS.values(), key=lambda c: c.INDEX)

UTC = datetime.UTC
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=UTC)

# -- primitives -----------------------------------------------------------------------------------


def _cut_utf8(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes on a character boundary."""
    return text.encode()[:limit].decode("utf-8", "ignore")


# Any text whose UTF-8 form fits a shortstr (up to the 255-byte boundary).
shortstrs = st.one_of(
    st.text(max_size=40),
    st.text(min_size=200, max_size=255).map(lambda s: _cut_utf8(s, 255)),
    st.just("x" * 255),
    st.just("\u00e9" * 127),  # 254 bytes of two-byte characters
)
longstrs = st.text(max_size=300)

INT_RANGES = {
    "octet": (0, 2**8 - 1),
    "short": (0, 2**16 - 1),
    "long": (0, 2**32 - 1),
    "longlong": (0, 2**64 - 1),
    "timestamp": (0, 2**64 - 1),
}


def _ints(wire: str) -> st.SearchStrategy[int]:
    lo, hi = INT_RANGES[wire]
    return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi]))


# -- field tables (the canonical Python value domain of codec.py) ---------------------------------

table_keys = st.text(max_size=20)


def _decimal_fits(value: decimal.Decimal) -> bool:
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    scale = max(0, -exponent)
    return scale <= 255 and -(2**31) <= int(value.scaleb(scale)) < 2**31


decimals = st.builds(
    lambda unscaled, exp: decimal.Decimal(unscaled).scaleb(exp),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-255, 5),
).filter(_decimal_fits)

utc_datetimes = st.datetimes(
    min_value=datetime.datetime(1970, 1, 1),
    max_value=datetime.datetime(9999, 12, 31, 23, 59, 59),
    timezones=st.just(UTC),
).map(lambda d: d.replace(microsecond=0))

scalar_values: st.SearchStrategy[FieldValue] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([-(2**63), -(2**31) - 1, -(2**31), 2**31 - 1, 2**31, 2**63 - 1]),
    st.floats(allow_nan=False),
    decimals,
    st.text(max_size=50),
    st.binary(max_size=50),
    utc_datetimes,
)


def _containers(children: st.SearchStrategy[FieldValue]) -> st.SearchStrategy[FieldValue]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(table_keys, children, max_size=4),
    )


field_values: st.SearchStrategy[FieldValue] = st.recursive(
    scalar_values, _containers, max_leaves=12
)
field_tables = st.dictionaries(table_keys, field_values, max_size=5)


def canonical(value: Any) -> Any:
    """A type-strict form of a field value for equality checks (``True`` is not ``1``, ``-0.0``
    is not ``0.0``, ``bytearray`` counts as ``bytes``)."""
    if value is None or isinstance(value, bool | int | str):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", struct.pack(">d", value))
    if isinstance(value, bytes | bytearray):
        return ("bytes", bytes(value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", value)
    if isinstance(value, datetime.datetime):
        assert value.tzinfo is not None
        return ("datetime", value)
    if isinstance(value, dict):
        return ("dict", {key: canonical(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return ("list", [canonical(item) for item in value])
    raise TypeError(f"not a field value: {value!r}")


# -- methods and properties -----------------------------------------------------------------------


def wire_strategy(wire: str) -> st.SearchStrategy[Any]:
    if wire in INT_RANGES:
        return _ints(wire)
    if wire == "bit":
        return st.booleans()
    if wire == "shortstr":
        return shortstrs
    if wire == "longstr":
        return longstrs
    if wire == "table":
        return field_tables
    raise AssertionError(f"unknown wire type {wire}")


def method_instances(cls: type[methods.Method]) -> st.SearchStrategy[methods.Method]:
    kwargs = {name: wire_strategy(wire) for name, wire in WIRE_FIELDS[cls]}
    return st.fixed_dictionaries(kwargs).map(lambda kw: cls(**kw))


any_method = st.sampled_from(ALL_METHOD_CLASSES).flatmap(method_instances)


def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


basic_properties = st.fixed_dictionaries(
    {name: _optional(wire_strategy(wire)) for name, wire in PROPERTY_FIELDS}
).map(lambda kw: methods.BasicProperties(**kw))


def method_fields(method: object) -> dict[str, Any]:
    return attrs.asdict(method, recurse=False)  # type: ignore[arg-type]


def float32_exact(value: float) -> bool:
    return math.isinf(value) or struct.unpack(">f", struct.pack(">f", value))[0] == value


__all__ = [
    "ALL_METHOD_CLASSES",
    "EPOCH",
    "PROPERTY_FIELDS",
    "UTC",
    "WIRE_FIELDS",
    "any_method",
    "basic_properties",
    "canonical",
    "decimals",
    "field_tables",
    "field_values",
    "float32_exact",
    "load_generator",
    "method_fields",
    "method_instances",
    "scalar_values",
    "shortstrs",
    "utc_datetimes",
    "wire_strategy",
]
