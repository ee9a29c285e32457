"""Generate ``src/tqbroker/protocol/methods.py`` from ``protocol/spec/amqp0-9-1.spec``.

Usage: ``python tools/gen_protocol.py`` rewrites the module; ``--check`` exits 1 when the
committed module differs from what the spec generates (tests run this).

Each AMQP method becomes a frozen attrs class with its wire layout unrolled into straight-line
``encode_arguments``/``decode_arguments`` code (no per-field metadata walk at run time), and the
basic content-header properties become ``BasicProperties``. The class ids (``BASIC_CLASS_ID``) and
the property flag bits (``HEADERS_FLAG``, and ``PROPERTY_LAYOUT``: name, flag, type in wire order)
become constants, so no other module retypes them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "src" / "tqbroker" / "protocol" / "spec" / "amqp0-9-1.spec"
OUTPUT = ROOT / "src" / "tqbroker" / "protocol" / "methods.py"

PY_TYPES = {
    "octet": "int",
    "short": "int",
    "long": "int",
    "longlong": "int",
    "timestamp": "int",
    "bit": "bool",
    "shortstr": "str",
    "longstr": "str",
    "table": "FieldTable",
}
STRUCTS = {"octet": "U8", "short": "U16", "long": "U32", "longlong": "U64", "timestamp": "U64"}
DEFAULTS = {"int": "0", "bool": "False", "str": '""'}


@dataclass
class Field:
    name: str
    type: str


@dataclass
class Method:
    class_name: str
    class_id: int
    name: str
    method_id: int
    content: bool
    fields: list[Field] = field(default_factory=list)

    @property
    def py_name(self) -> str:
        words = self.class_name.split("_") + self.name.rstrip("_").split("_")
        return "".join(w.capitalize() for w in words)

    @property
    def amqp_name(self) -> str:
        return f"{self.class_name}.{self.name.rstrip('_').replace('_', '-')}"


def parse_spec(text: str) -> tuple[list[Method], list[Field]]:
    methods: list[Method] = []
    properties: list[Field] = []
    class_name, class_id = "", 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        words = line.split()
        if words[0] == "class":
            class_name, class_id = words[1], int(words[2])
        elif words[0] == "method":
            content = words[3:] == ["content"]
            methods.append(Method(class_name, class_id, words[1], int(words[2]), content))
        elif words[0] == "property":
            properties.append(Field(words[1], words[2]))
        elif raw.startswith("  ") and len(words) == 2 and words[1] in PY_TYPES:
            methods[-1].fields.append(Field(words[0], words[1]))
        else:
            raise SystemExit(f"{SPEC.name}:{lineno}: cannot parse {raw!r}")
    return methods, properties


def _groups(fields: list[Field]) -> list[list[Field]]:
    """Split fields into runs: consecutive bits share one octet (up to 8 per octet)."""
    groups: list[list[Field]] = []
    for f in fields:
        if f.type == "bit" and groups and groups[-1][0].type == "bit" and len(groups[-1]) < 8:
            groups[-1].append(f)
        else:
            groups.append([f])
    return groups


def _encode_lines(fields: list[Field]) -> list[str]:
    lines: list[str] = []
    for group in _groups(fields):
        f = group[0]
        if f.type == "bit":
            parts = [
                f"(self.{b.name} << {i})" if i else f"self.{b.name}" for i, b in enumerate(group)
            ]
            lines.append(f"out.append({' | '.join(parts)})")
        elif f.type in STRUCTS:
            lines.append(f"out += {STRUCTS[f.type]}.pack(self.{f.name})")
        elif f.type == "shortstr":
            lines.append(f"write_shortstr(out, self.{f.name})")
        elif f.type == "longstr":
            lines.append(f"write_longstr(out, self.{f.name})")
        else:
            lines.append(f"write_table(out, self.{f.name})")
    return lines or ["pass"]


def _decode_lines(fields: list[Field]) -> list[str]:
    lines: list[str] = []
    for group in _groups(fields):
        f = group[0]
        if f.type == "bit":
            lines.append("bits = buf[off]")
            lines.append("off += 1")
            for i, b in enumerate(group):
                lines.append(f"{b.name} = bool(bits & {1 << i})")
        elif f.type in STRUCTS:
            s = STRUCTS[f.type]
            lines.append(f"({f.name},) = {s}.unpack_from(buf, off)")
            lines.append(f"off += {s}.size")
        elif f.type == "shortstr":
            lines.append(f"{f.name}, off = read_shortstr(buf, off)")
        elif f.type == "longstr":
            lines.append(f"{f.name}, off = read_longstr(buf, off)")
        else:
            lines.append(f"{f.name}, off = read_table(buf, off)")
    return lines


def render_method(m: Method) -> str:
    out = [
        "",
        "",
        "",
        "@attrs.frozen",
        f"class {m.py_name}(Method):",
        f'    """``{m.amqp_name}`` ({m.class_id}.{m.method_id})."""',
        "",
        f"    CLASS_ID: ClassVar[int] = {m.class_id}",
        f"    METHOD_ID: ClassVar[int] = {m.method_id}",
        f"    INDEX: ClassVar[int] = 0x{(m.class_id << 16) | m.method_id:08X}",
        f'    NAME: ClassVar[str] = "{m.amqp_name}"',
        f"    HAS_CONTENT: ClassVar[bool] = {m.content}",
    ]
    if m.fields:
        out.append("")
    for f in m.fields:
        py = PY_TYPES[f.type]
        default = "attrs.field(factory=dict)" if py == "FieldTable" else DEFAULTS[py]
        out.append(f"    {f.name}: {py} = {default}")
    out += ["", "    def encode_arguments(self, out: bytearray) -> None:"]
    out += [f"        {line}" for line in _encode_lines(m.fields)]
    out += [
        "",
        "    @classmethod",
        f"    def decode_arguments(cls, buf: memoryview, off: int) -> {m.py_name}:",
    ]
    out += [f"        {line}" for line in _decode_lines(m.fields)]
    # The arguments must fill the payload exactly, as RabbitMQ's generated decoder requires.
    out.append("        if off != len(buf):")
    out.append('            raise DecodeError(f"{len(buf) - off} bytes after the arguments")')
    args = ", ".join(f.name for f in m.fields)
    out.append(f"        return cls({args})")
    return "\n".join(out)


def render_constants(methods: list[Method], props: list[Field]) -> str:
    """Class id constants, property flag constants and the property layout."""
    out = ["", "", "# Class ids."]
    seen: set[str] = set()
    for m in methods:
        if m.class_name not in seen:
            seen.add(m.class_name)
            out.append(f"{m.class_name.upper()}_CLASS_ID: Final = {m.class_id}")
    out += [
        "",
        "# Basic content-header property flags: the first property is bit 15 of the flags word,",
        "# and bit 0 says another flags word follows.",
    ]
    for i, f in enumerate(props):
        out.append(f"{f.name.upper()}_FLAG: Final = 0x{1 << (15 - i):04X}")
    out += [
        "CONTINUATION_FLAG: Final = 0x0001",
        "",
        "# The properties in wire order: name, flag, AMQP type.",
        "PROPERTY_LAYOUT: Final[tuple[tuple[str, int, str], ...]] = (",
    ]
    out += [f'    ("{f.name}", {f.name.upper()}_FLAG, "{f.type}"),' for f in props]
    out.append(")")
    return "\n".join(out)


def render_properties(props: list[Field]) -> str:
    out = [
        "",
        "",
        "",
        "@attrs.frozen",
        "class BasicProperties:",
        '    """The basic class content-header properties; ``None`` means absent."""',
        "",
    ]
    for f in props:
        out.append(f"    {f.name}: {PY_TYPES[f.type]} | None = None")
    out += [
        "",
        "    def encode(self) -> bytes:",
        '        """Encode as the property-flags word followed by the present properties."""',
        "        flags = 0",
        "        out = bytearray(2)",
    ]
    for i, f in enumerate(props):
        bit = 1 << (15 - i)
        out.append(f"        if self.{f.name} is not None:")
        out.append(f"            flags |= 0x{bit:04X}")
        if f.type in STRUCTS:
            out.append(f"            out += {STRUCTS[f.type]}.pack(self.{f.name})")
        elif f.type == "shortstr":
            out.append(f"            write_shortstr(out, self.{f.name})")
        elif f.type == "longstr":
            out.append(f"            write_longstr(out, self.{f.name})")
        else:
            out.append(f"            write_table(out, self.{f.name})")
    out += [
        "        U16.pack_into(out, 0, flags)",
        "        return bytes(out)",
        "",
        "    @classmethod",
        "    def decode(cls, buf: memoryview) -> BasicProperties:",
        '        """Decode the property-flags word and the properties it announces."""',
        "        if len(buf) < 2:",
        '            raise DecodeError("content header properties past end of data")',
        "        (flags,) = U16.unpack_from(buf, 0)",
        "        if flags & 1:",
        '            raise DecodeError("unsupported continued property flags")',
        "        off = 2",
    ]
    for i, f in enumerate(props):
        bit = 1 << (15 - i)
        out.append(f"        {f.name}: {PY_TYPES[f.type]} | None = None")
        out.append(f"        if flags & 0x{bit:04X}:")
        if f.type in STRUCTS:
            s = STRUCTS[f.type]
            out.append(f"            if off + {s}.size > len(buf):")
            out.append('                raise DecodeError("property past end of data")')
            out.append(f"            ({f.name},) = {s}.unpack_from(buf, off)")
            out.append(f"            off += {s}.size")
        elif f.type == "shortstr":
            out.append(f"            {f.name}, off = read_shortstr(buf, off)")
        elif f.type == "longstr":
            out.append(f"            {f.name}, off = read_longstr(buf, off)")
        else:
            out.append(f"            {f.name}, off = read_table(buf, off)")
    args = ", ".join(f"{f.name}={f.name}" for f in props)
    out.append(f"        return cls({args})")
    return "\n".join(out)


HEADER = '''\
# AUTOGENERATED by tools/gen_protocol.py from spec/amqp0-9-1.spec -- do not edit by hand.
"""AMQP 0-9-1 method classes and basic content-header properties, generated from the spec.

Every method is a frozen attrs class with ``CLASS_ID``, ``METHOD_ID``, ``INDEX`` (class << 16 |
method), ``NAME`` and ``HAS_CONTENT``; ``encode_arguments`` appends its arguments to a bytearray and
``decode_arguments`` reads them from a memoryview, which they must fill exactly (raising
``struct.error``/``IndexError``/``DecodeError`` on bad bytes, which ``decode_method`` turns into a
``DecodeError`` naming the method). ``*_CLASS_ID`` are the class ids, ``*_FLAG`` the basic
content-header property flag bits and ``PROPERTY_LAYOUT`` the properties in wire order.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Final

import attrs

from .codec import (
    U8,
    U16,
    U32,
    U64,
    FieldTable,
    read_longstr,
    read_shortstr,
    read_table,
    write_longstr,
    write_shortstr,
    write_table,
)
from .errors import DecodeError, UnknownMethodError


class Method:
    """Base of every generated method class."""

    __slots__ = ()

    CLASS_ID: ClassVar[int]
    METHOD_ID: ClassVar[int]
    INDEX: ClassVar[int]
    NAME: ClassVar[str]
    HAS_CONTENT: ClassVar[bool]

    def encode_arguments(self, out: bytearray) -> None:
        raise NotImplementedError  # every generated subclass overrides this

    def encode(self) -> bytes:
        """The method frame payload: class id, method id, arguments."""
        out = bytearray(U32.pack((self.CLASS_ID << 16) | self.METHOD_ID))
        self.encode_arguments(out)
        return bytes(out)

    @classmethod
    def decode_arguments(cls, buf: memoryview, off: int) -> Method:
        raise NotImplementedError  # every generated subclass overrides this
'''

FOOTER = '''


METHODS: dict[int, type[Method]] = {{
{entries}
}}


def decode_method(payload: memoryview) -> Method:
    """Decode a method frame payload; unknown ids and malformed arguments raise ``DecodeError``."""
    if len(payload) < 4:
        raise DecodeError("method frame shorter than its class and method ids")
    index = U32.unpack_from(payload, 0)[0]
    method_class = METHODS.get(index)
    if method_class is None:
        raise UnknownMethodError(f"unknown method {{index >> 16}}.{{index & 0xFFFF}}")
    try:
        return method_class.decode_arguments(payload, 4)
    except (struct.error, IndexError, DecodeError) as exc:
        raise DecodeError(f"cannot decode {{method_class.NAME}}: {{exc}}") from None
'''


def render(text: str) -> str:
    """Generate the module text, formatted by ruff exactly as the rest of the code base."""
    methods, props = parse_spec(text)
    body = "".join(render_method(m) for m in methods)
    entries = "\n".join(f"    {m.py_name}.INDEX: {m.py_name}," for m in methods)
    source = (
        HEADER
        + render_constants(methods, props)
        + body
        + render_properties(props)
        + FOOTER.format(entries=entries)
    )
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(OUTPUT), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return formatted.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = parser.parse_args()
    generated = render(SPEC.read_text())
    if args.check:
        current = OUTPUT.read_text() if OUTPUT.exists() else ""
        if current != generated:
            print(f"{OUTPUT} is stale: run python tools/gen_protocol.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
