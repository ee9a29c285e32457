"""The sink's Arrow batches as ``TQW1`` bodies, without a loop per row: value, key, partition
and headers columns, checked (keys are routing keys: UTF-8, at most 255 bytes).

Header values: the broker's headers are AMQP field tables, Kafka's are bytes. A value that is
UTF-8 text is sent as a string, other bytes as ``{"bytes": <base64>}`` (which reads back as the
same bytes, ``_arrow_read.py``).
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import numpy as np
import pyarrow as pa

from ..recordbatch import WRITE_MAGIC

MAX_KEY_BYTES = 255
_WRITE_HEAD = struct.Struct("<4sI")


def encode_write(
    values: pa.Array,
    keys: pa.Array | None = None,
    partitions: pa.Array | None = None,
    headers: pa.Array | None = None,
) -> bytes:
    """The rows as a ``TQW1`` body. ``values`` and ``keys`` are string or binary (null: empty;
    a null or empty key lets the topic choose by round robin), ``partitions`` integers (null or
    negative: the key decides), ``headers`` Kafka's ``array<struct<key, value>>``. Raises
    ``ValueError`` naming the column for a key that is not a routing key."""
    import pyarrow.compute as pc  # writing only: spares readers its import (~30 ms)

    count = len(values)
    parts = [_WRITE_HEAD.pack(WRITE_MAGIC, count)]
    if partitions is None:
        parts.append(np.full(count, -1, dtype="<i4").tobytes())
    else:
        filled = pc.fill_null(partitions.cast(pa.int64()), -1)
        chosen = filled.to_numpy(zero_copy_only=False)
        if len(chosen) and chosen.max() > np.iinfo(np.int32).max:
            raise ValueError(f"a partition number is out of range ({int(chosen.max())})")
        parts.append(np.where(chosen < 0, -1, chosen).astype("<i4").tobytes())
    if keys is None:
        parts.append(np.zeros(count + 1, dtype="<i4").tobytes())
    else:
        parts.extend(_binary_parts(_checked_keys(keys)))
    parts.extend(_binary_parts(values))
    if headers is None or headers.null_count == count:
        parts.append(np.zeros(count + 1, dtype="<i4").tobytes())
    else:
        parts.extend(_binary_parts(pa.array(_header_json(headers), pa.binary())))
    return b"".join(parts)


def value_sizes(values: pa.Array) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The byte length of each value (0 for null), to cut a batch into request-sized chunks."""
    import pyarrow.compute as pc

    lengths = pc.fill_null(pc.binary_length(values), 0)
    result: np.ndarray[Any, np.dtype[np.int64]] = lengths.to_numpy(zero_copy_only=False).astype(
        np.int64
    )
    return result


def _checked_keys(keys: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    if pa.types.is_binary(keys.type) or pa.types.is_large_binary(keys.type):
        try:
            keys.cast(pa.large_string())  # validates UTF-8
        except pa.ArrowInvalid:
            raise ValueError(
                "column 'key' must hold UTF-8 text (a key is an AMQP routing key)"
            ) from None
    if len(keys) and (pc.max(pc.binary_length(keys)).as_py() or 0) > MAX_KEY_BYTES:
        raise ValueError(
            f"column 'key': a key is at most {MAX_KEY_BYTES} bytes (an AMQP routing key)"
        )
    return keys


def _binary_parts(array: pa.Array) -> tuple[bytes, bytes]:
    """``i32 offsets[count + 1]`` (from 0) and the bytes of a string or binary column."""
    import pyarrow.compute as pc

    if not pa.types.is_binary(array.type):
        array = array.cast(pa.binary())  # string: a view; large types: 32-bit offsets
    if array.null_count:
        array = pc.fill_null(array, pa.scalar(b"", pa.binary()))
    count = len(array)
    _validity, offsets_buffer, data_buffer = array.buffers()
    if offsets_buffer is None:  # an empty array may have no buffers
        return np.zeros(count + 1, dtype="<i4").tobytes(), b""
    ends = np.frombuffer(offsets_buffer, dtype="<i4", count=count + 1, offset=4 * array.offset)
    start, stop = int(ends[0]), int(ends[-1])
    data = b"" if data_buffer is None else memoryview(data_buffer)[start:stop].tobytes()
    return (ends - start).astype("<i4").tobytes(), data


def _header_json(headers: pa.Array) -> list[bytes]:
    encoded = []
    for row in headers.to_pylist():
        table: dict[str, Any] = {}
        for entry in row or ():
            name, value = entry["key"], entry["value"]
            if name is None:
                raise ValueError("column 'headers': a header needs a key")
            table[name] = _header_json_value(value)
        encoded.append(json.dumps(table, separators=(",", ":")).encode() if table else b"")
    return encoded


def _header_json_value(value: bytes | str | None) -> Any:
    if value is None or isinstance(value, str):
        return value
    try:
        return value.decode()
    except UnicodeDecodeError:
        return {"bytes": base64.b64encode(value).decode()}
