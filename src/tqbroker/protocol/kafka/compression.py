"""Kafka's record batch codecs (attributes bits 0-2), sans-IO, through cramjam.

- gzip (1): RFC 1952;
- snappy (2): Kafka's Java client writes xerial's framing (``SnappyOutputStream``: an 8-byte
  magic, two 4-byte versions, then blocks, each a 4-byte length and a raw snappy block);
  librdkafka writes a raw snappy block; both are read, xerial's is written (what every client
  reads: ``SnappyInputStream`` reads a raw block too, librdkafka and kafka-python both);
- lz4 (3): the LZ4 frame format (KIP-57);
- zstd (4): a zstd frame (KIP-110).

``decompress`` raises ``CompressionError`` for bytes that do not decode, or that decode to more
than ``max_size`` bytes (a decompression bomb costs one request, not the broker's memory:
the size is checked once decoded, a bound on what one batch may hold).
"""

from __future__ import annotations

import struct
from typing import Final

import cramjam

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
BY_NAME: Final = {name: codec for codec, name in NAMES.items()}

XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEAD: Final = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK: Final = 32 * 1024  # what kafka-python and Kafka's Java client write
_U32: Final = struct.Struct(">I")


class CompressionError(ValueError):
    """Bytes that the batch's codec cannot decode (Kafka's ``CORRUPT_MESSAGE``), or a codec
    that is not one of Kafka's (``UNSUPPORTED_COMPRESSION_TYPE``: ``UnknownCodec``)."""


class UnknownCodec(CompressionError):
    pass


def decompress(codec: int, data: bytes | memoryview, max_size: int) -> bytes:
    """The records of a batch compressed with ``codec``."""
    try:
        if codec == GZIP:
            out = bytes(cramjam.gzip.decompress(data))
        elif codec == SNAPPY:
            out = _snappy_decompress(bytes(data))
        elif codec == LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        elif codec == ZSTD:
            out = bytes(cramjam.zstd.decompress(data))
        else:
            raise UnknownCodec(f"compression type {codec}")
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"{NAMES[codec]} data that does not decode: {exc}") from None
    if len(out) > max_size:
        raise CompressionError(f"a batch that decompresses to over {max_size} bytes")
    return out


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed with ``codec``, as Kafka's clients write it."""
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == SNAPPY:
        return _snappy_compress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise UnknownCodec(f"compression type {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    if len(data) < len(_XERIAL_HEAD):
        raise CompressionError("a xerial snappy stream cut short")
    blocks = []
    position = len(_XERIAL_HEAD)
    while position < len(data):
        if len(data) - position < 4:
            raise CompressionError("a xerial snappy block length cut short")
        (size,) = _U32.unpack_from(data, position)
        position += 4
        if size > len(data) - position:
            raise CompressionError("a xerial snappy block cut short")
        blocks.append(bytes(cramjam.snappy.decompress_raw(data[position : position + size])))
        position += size
    return b"".join(blocks)


def _snappy_compress(data: bytes) -> bytes:
    parts = [_XERIAL_HEAD]
    for start in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK]))
        parts += (_U32.pack(len(block)), block)
    return b"".join(parts)
