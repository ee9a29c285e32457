"""Kafka messages by their schemas: ``decode`` a request or response body of one version into a
dict, ``encode`` a dict into one.

The schemas (``schemas.py``) are generated from Kafka's JSON message schemas by
``tools/gen_kafka.py``: per message its valid and flexible versions, per field its type, the
versions it exists in, the versions it may be null in, its tag (a tagged field of the flexible
versions) and its default. Field names are Kafka's in snake case (``ThrottleTimeMs`` is
``throttle_time_ms``). A field absent from a version decodes as its default and is not
encoded; a tagged field is written only when it differs from its default (as Kafka's
generated code does), and unknown tags are skipped. Flexible versions use the compact
encodings (``wire.Reader.length``) and end every struct with its tagged fields.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from .wire import Malformed, Reader, Writer

Range = tuple[int, int]  # inclusive; "N+" is (N, 32767)
ANY_VERSION = 32767
NULL = "null"  # the default of an array or struct whose default is null (else empty)


class Field(NamedTuple):
    name: str
    type: str  # a primitive ("int32", "string", "records", ...) or "struct"
    array: bool
    versions: Range
    nullable: Range | None = None
    tag: int | None = None
    tagged: Range | None = None
    default: Any = None
    fields: tuple[Field, ...] = ()  # a struct's (or a struct array element's)
    compact: bool = True  # False: never the compact encoding (the request header's ClientId)


class Schema(NamedTuple):
    name: str
    api_key: int  # -1 for the headers
    valid: Range
    flexible: Range | None
    fields: tuple[Field, ...]

    def is_flexible(self, version: int) -> bool:
        return self.flexible is not None and _within(self.flexible, version)


def _within(versions: Range | None, version: int) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def decode(schema: Schema, version: int, reader: Reader) -> dict[str, Any]:
    """The message at ``reader`` (ValueError when it does not decode)."""
    if not _within(schema.valid, version):
        raise Malformed(f"{schema.name} has no version {version}")
    return _decode_struct(schema.fields, version, schema.is_flexible(version), reader)


def encode(schema: Schema, version: int, value: Mapping[str, Any], writer: Writer) -> None:
    """Write ``value`` as the message (a field it lacks takes its default)."""
    if not _within(schema.valid, version):
        raise ValueError(f"{schema.name} has no version {version}")
    _encode_struct(schema.fields, version, schema.is_flexible(version), value, writer)


def defaults(fields: tuple[Field, ...], version: int) -> dict[str, Any]:
    """Every field of a struct at its default."""
    return {field.name: _default(field, version) for field in fields}


def _default(field: Field, version: int) -> Any:
    if field.array or field.type == "struct":
        if field.default == NULL and _within(field.nullable, version):
            return None
        return [] if field.array else defaults(field.fields, version)
    return field.default


# -- decoding --------------------------------------------------------------------------------


def _decode_struct(
    fields: tuple[Field, ...], version: int, flexible: bool, reader: Reader
) -> dict[str, Any]:
    value: dict[str, Any] = {}
    tagged: dict[int, Field] = {}
    for field in fields:
        if field.tag is not None and flexible and _within(field.tagged, version):
            tagged[field.tag] = field
            value[field.name] = _default(field, version)
        elif _within(field.versions, version):
            value[field.name] = _decode_field(field, version, flexible, reader)
        else:
            value[field.name] = _default(field, version)
    if flexible:
        for _ in range(reader.uvarint()):
            tag, size = reader.uvarint(), reader.uvarint()
            field_of_tag = tagged.get(tag)
            if field_of_tag is None:
                reader.raw(size)  # a tag of a later version: skipped
                continue
            inner = Reader(reader.raw(size))
            value[field_of_tag.name] = _decode_field(field_of_tag, version, flexible, inner)
    return value


def _decode_field(field: Field, version: int, flexible: bool, reader: Reader) -> Any:
    compact = flexible and field.compact
    nullable = _within(field.nullable, version)
    if field.array:
        count = reader.length(compact=compact, wide=True)
        if count < 0:
            if not nullable:
                raise Malformed(f"{field.name}: a null array where none may be")
            return None
        if count > reader.remaining:
            raise Malformed(f"{field.name}: {count} elements in {reader.remaining} bytes")
        return [_decode_one(field, version, flexible, compact, False, reader) for _ in range(count)]
    return _decode_one(field, version, flexible, compact, nullable, reader)


def _decode_one(
    field: Field, version: int, flexible: bool, compact: bool, nullable: bool, reader: Reader
) -> Any:
    kind = field.type
    if kind == "struct":
        if nullable and reader.int8() < 0:
            return None
        return _decode_struct(field.fields, version, flexible, reader)
    if kind in ("string", "bytes", "records"):
        size = reader.length(compact=compact, wide=kind != "string")
        if size < 0:
            if not nullable:
                raise Malformed(f"{field.name}: null where it may not be")
            return None
        data = reader.raw(size)
        if kind == "string":
            try:
                return data.decode()
            except UnicodeDecodeError as exc:
                raise Malformed(f"{field.name}: not UTF-8") from exc
        return data
    read = _READERS.get(kind)
    if read is None:
        raise Malformed(f"{field.name}: unknown type {kind}")
    return read(reader)


_READERS: dict[str, Callable[[Reader], Any]] = {
    "int8": Reader.int8,
    "int16": Reader.int16,
    "int32": Reader.int32,
    "int64": Reader.int64,
    "uint16": Reader.uint16,
    "uint32": Reader.uint32,
    "float64": Reader.float64,
    "bool": Reader.boolean,
    "uuid": Reader.uuid,
}


# -- encoding --------------------------------------------------------------------------------


def _encode_struct(
    fields: tuple[Field, ...],
    version: int,
    flexible: bool,
    value: Mapping[str, Any],
    writer: Writer,
) -> None:
    tagged: list[tuple[int, bytes]] = []
    for field in fields:
        if field.tag is not None and flexible and _within(field.tagged, version):
            item = value.get(field.name, _default(field, version))
            if item != _default(field, version):
                inner = Writer()
                _encode_field(field, version, flexible, item, inner)
                tagged.append((field.tag, inner.getvalue()))
        elif _within(field.versions, version):
            item = value.get(field.name, _default(field, version))
            _encode_field(field, version, flexible, item, writer)
    if flexible:
        writer.uvarint(len(tagged))
        for tag, data in sorted(tagged):
            writer.uvarint(tag)
            writer.uvarint(len(data))
            writer.raw(data)


def _encode_field(field: Field, version: int, flexible: bool, item: Any, writer: Writer) -> None:
    compact = flexible and field.compact
    nullable = _within(field.nullable, version)
    if field.array:
        if item is None:
            if not nullable:
                raise ValueError(f"{field.name} may not be null in version {version}")
            writer.length(-1, compact=compact, wide=True)
            return
        writer.length(len(item), compact=compact, wide=True)
        for element in item:
            _encode_one(field, version, flexible, compact, False, element, writer)
        return
    _encode_one(field, version, flexible, compact, nullable, item, writer)


def _encode_one(
    field: Field,
    version: int,
    flexible: bool,
    compact: bool,
    nullable: bool,
    item: Any,
    writer: Writer,
) -> None:
    kind = field.type
    if kind == "struct":
        if nullable:
            writer.int8(-1 if item is None else 1)
            if item is None:
                return
        _encode_struct(field.fields, version, flexible, item, writer)
        return
    if kind in ("string", "bytes", "records"):
        if item is None:
            if not nullable:
                raise ValueError(f"{field.name} may not be null in version {version}")
            writer.length(-1, compact=compact, wide=kind != "string")
            return
        data = item.encode() if kind == "string" else item
        writer.length(len(data), compact=compact, wide=kind != "string")
        writer.raw(data)
        return
    write = _WRITERS.get(kind)
    if write is None:
        raise ValueError(f"{field.name}: unknown type {kind}")
    write(writer, item)


_WRITERS: dict[str, Callable[[Writer, Any], None]] = {
    "int8": Writer.int8,
    "int16": Writer.int16,
    "int32": Writer.int32,
    "int64": Writer.int64,
    "uint16": Writer.uint16,
    "uint32": Writer.uint32,
    "float64": Writer.float64,
    "bool": Writer.boolean,
    "uuid": Writer.uuid,
}
