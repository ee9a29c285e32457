"""Kafka's primitive types on the wire (the protocol guide's "Protocol Primitive Types").

``Reader`` walks a buffer; ``Writer`` collects bytes. Fixed-width integers are big-endian;
``varint``/``varlong`` are zigzag-encoded (record fields), ``uvarint`` unsigned (the lengths of
the flexible versions' compact strings, bytes and arrays: length + 1, 0 for null). A read past
the end raises ``Truncated``; a length that makes no sense raises ``Malformed`` (both
``ValueError``: the request is refused, as Kafka refuses one it cannot parse).
"""

from __future__ import annotations

import struct
import uuid
from typing import Final

INT8: Final = struct.Struct(">b")
INT16: Final = struct.Struct(">h")
INT32: Final = struct.Struct(">i")
INT64: Final = struct.Struct(">q")
UINT16: Final = struct.Struct(">H")
UINT32: Final = struct.Struct(">I")
FLOAT64: Final = struct.Struct(">d")


class Malformed(ValueError):
    """Bytes that do not decode as the type says (a negative length, a varint too long)."""


class Truncated(Malformed):
    """The buffer ended inside a value."""


class Reader:
    """Reads primitives from ``data`` from ``offset`` on."""

    __slots__ = ("data", "offset")

    def __init__(self, data: bytes | memoryview, offset: int = 0) -> None:
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.offset = offset

    @property
    def remaining(self) -> int:
        return len(self.data) - self.offset

    def _fixed(self, layout: struct.Struct) -> int:
        offset = self.offset
        end = offset + layout.size
        if end > len(self.data):
            raise Truncated(f"{layout.size} bytes wanted at {offset}, {len(self.data)} in all")
        self.offset = end
        value: int = layout.unpack_from(self.data, offset)[0]
        return value

    def int8(self) -> int:
        return self._fixed(INT8)

    def int16(self) -> int:
        return self._fixed(INT16)

    def int32(self) -> int:
        return self._fixed(INT32)

    def int64(self) -> int:
        return self._fixed(INT64)

    def uint16(self) -> int:
        return self._fixed(UINT16)

    def uint32(self) -> int:
        return self._fixed(UINT32)

    def float64(self) -> float:
        offset = self.offset
        if offset + 8 > len(self.data):
            raise Truncated(f"8 bytes wanted at {offset}, {len(self.data)} in all")
        self.offset = offset + 8
        value: float = FLOAT64.unpack_from(self.data, offset)[0]
        return value

    def boolean(self) -> bool:
        return self._fixed(INT8) != 0

    def raw(self, size: int) -> bytes:
        if size < 0:
            raise Malformed(f"a negative size {size}")
        offset = self.offset
        end = offset + size
        if end > len(self.data):
            raise Truncated(f"{size} bytes wanted at {offset}, {len(self.data)} in all")
        self.offset = end
        return bytes(self.data[offset:end])

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16))

    def uvarint(self) -> int:
        value = shift = 0
        data, offset = self.data, self.offset
        while True:
            if offset >= len(data):
                raise Truncated("the buffer ended inside a varint")
            byte = data[offset]
            offset += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                self.offset = offset
                return value
            shift += 7
            if shift > 63:
                raise Malformed("a varint longer than 10 bytes")

    def varint(self) -> int:
        """A zigzag-encoded signed varint (``varint`` and ``varlong`` alike)."""
        value = self.uvarint()
        return (value >> 1) ^ -(value & 1)

    def length(self, *, compact: bool, wide: bool = False) -> int:
        """A string's, bytes' or array's length: -1 for null. Non-compact strings have an
        int16 length, bytes and arrays (``wide``) an int32 one; compact ones a uvarint of the
        length + 1."""
        if compact:
            return self.uvarint() - 1
        return self.int32() if wide else self.int16()


class Writer:
    """Collects the bytes of one message (``getvalue``)."""

    __slots__ = ("buffer",)

    def __init__(self) -> None:
        self.buffer = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self.buffer)

    def int8(self, value: int) -> None:
        self.buffer += INT8.pack(value)

    def int16(self, value: int) -> None:
        self.buffer += INT16.pack(value)

    def int32(self, value: int) -> None:
        self.buffer += INT32.pack(value)

    def int64(self, value: int) -> None:
        self.buffer += INT64.pack(value)

    def uint16(self, value: int) -> None:
        self.buffer += UINT16.pack(value)

    def uint32(self, value: int) -> None:
        self.buffer += UINT32.pack(value)

    def float64(self, value: float) -> None:
        self.buffer += FLOAT64.pack(value)

    def boolean(self, value: bool) -> None:
        self.buffer.append(1 if value else 0)

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buffer += data

    def uuid(self, value: uuid.UUID) -> None:
        self.buffer += value.bytes

    def uvarint(self, value: int) -> None:
        self.buffer += encode_uvarint(value)

    def varint(self, value: int) -> None:
        self.buffer += encode_uvarint((value << 1) ^ (value >> 63))

    def length(self, size: int, *, compact: bool, wide: bool = False) -> None:
        """The inverse of ``Reader.length`` (-1 for null)."""
        if compact:
            self.uvarint(size + 1)
        elif wide:
            self.int32(size)
        else:
            self.int16(size)


def encode_uvarint(value: int) -> bytes:
    if value < 0:
        raise ValueError(f"an unsigned varint cannot be {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
