"""What a stream's compaction key is: the broker's side of ``CompactionPolicy``.

A record's key is its routing key, or with ``x-stream-compaction-key-header`` the value of that
header (a string or a byte string, the same key either way); a record without that header (or
with a value of another type) has no key and is always kept.
"""

from __future__ import annotations

import attrs

from ...backends.streams import DEFAULT_TOMBSTONE_GRACE_MS, CompactionPolicy
from ...model import Message
from ...protocol.errors import DecodeError


@attrs.frozen
class CompactionKey:
    """A record's compaction key (equal for equal ``header``, so an unchanged policy is not
    re-planned)."""

    header: str | None = None

    def __call__(self, message: Message) -> bytes | None:
        if self.header is None:
            return message.routing_key.encode()
        try:
            headers = message.properties.headers
        except DecodeError:
            return None
        value = headers.get(self.header) if headers else None
        if isinstance(value, str):
            return value.encode("utf-8", "surrogateescape")
        return value if isinstance(value, bytes) else None


def compaction_policy(
    key_header: str | None = None, tombstone_grace_ms: int = DEFAULT_TOMBSTONE_GRACE_MS
) -> CompactionPolicy:
    """Keep the latest record per routing key (or per value of ``key_header``)."""
    return CompactionPolicy(CompactionKey(key_header), tombstone_grace_ms)
