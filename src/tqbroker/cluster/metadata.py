"""The cluster's metadata store: what tqbroker needs of etcd, as a narrow protocol.

Everything a cluster agrees on (nodes, the controller, partition leaders, epochs and in-sync
replica sets, definitions) lives in one key-value store with etcd v3's semantics: a global
revision that every write increments, keys with a create and a modification revision and a
version, transactions guarded by compares, leases that expire unless kept alive, and watches
from a revision. ``EtcdClient`` (``etcd.py``) speaks to a real etcd over its JSON gateway;
``FakeEtcd`` (``tqbroker.testing.fake_etcd``) keeps the same semantics in memory on Trio's
clock, for the cluster simulation. Both pass one conformance suite
(``tests/cluster/test_metadata_conformance.py``).

Keys are text (UTF-8 on the wire), values bytes. A prefix read or watch covers every key that
starts with the prefix. Nothing here retries: a caller that meets ``MetadataUnavailable`` decides
what to do (keep serving, stop renewing, try again later).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol, TypeAlias

import attrs

# etcd's default --max-txn-ops: a transaction with more operations is refused.
MAX_TXN_OPS = 128


class MetadataError(Exception):
    """The store refused a request, or could not be asked."""


class MetadataUnavailable(MetadataError):
    """No endpoint answered (every one refused the connection, timed out or broke off)."""


class LeaseLost(MetadataError):
    """The lease is gone: it expired or was revoked (a keepalive's reply had no TTL)."""


class Compacted(MetadataError):
    """The revision asked for was compacted away: list again at the current revision."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {compact_revision})")
        self.compact_revision = compact_revision


class InvalidRequest(MetadataError):
    """The store refused the request as malformed (too many operations in a transaction)."""


@attrs.frozen
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int = 0


@attrs.frozen
class RangeResult:
    """The keys found (in key order) and the store's revision when they were read."""

    kvs: list[KeyValue]
    revision: int


# What a compare looks at, and how.
Target: TypeAlias = Literal["value", "version", "create", "mod", "lease"]
Comparison: TypeAlias = Literal["=", "!=", "<", ">"]


@attrs.frozen
class Compare:
    """``key``'s ``target`` compared with ``value`` (a missing key has version, create and mod
    revision 0, lease 0; every compare of its value fails, ``!=`` too, as etcd's)."""

    key: str
    target: Target
    result: Comparison
    value: int | bytes

    @classmethod
    def absent(cls, key: str) -> Compare:
        return cls(key, "create", "=", 0)

    @classmethod
    def mod_revision(cls, key: str, revision: int) -> Compare:
        return cls(key, "mod", "=", revision)


@attrs.frozen
class Put:
    key: str
    value: bytes
    lease: int = 0


@attrs.frozen
class Delete:
    key: str
    prefix: bool = False


@attrs.frozen
class Get:
    key: str
    prefix: bool = False


Operation: TypeAlias = Put | Delete | Get


@attrs.frozen
class TxnResult:
    """Whether the compares held, the revision after the transaction, and one response per
    operation that ran: a ``RangeResult`` for a ``Get``, the number deleted for a ``Delete``,
    None for a ``Put``."""

    succeeded: bool
    revision: int
    responses: list[RangeResult | int | None]


@attrs.frozen
class Lease:
    id: int
    ttl: int  # seconds


@attrs.frozen
class WatchEvent:
    kind: Literal["put", "delete"]
    kv: KeyValue  # for a delete: the key, its deletion's mod revision, an empty value


class MetadataStore(Protocol):
    """etcd v3's key-value, lease and watch calls (see the module doc). Every call may raise
    ``MetadataUnavailable``; each says what else it raises."""

    async def get(self, key: str, *, prefix: bool = False, revision: int = 0) -> RangeResult:
        """The key (or every key under the prefix), at ``revision`` (0: the latest);
        ``Compacted`` if that revision is gone."""
        ...

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write the key (bound to ``lease`` if not 0); the revision of the write.
        ``LeaseLost`` if the lease does not exist."""
        ...

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete the key (or every key under the prefix); how many were deleted."""
        ...

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        """Run ``success`` if every compare holds, else ``failure``, atomically.
        ``InvalidRequest`` for more than ``MAX_TXN_OPS`` operations in a branch;
        ``LeaseLost`` if a put names a lease that does not exist."""
        ...

    async def grant_lease(self, ttl: int) -> Lease:
        """A new lease of ``ttl`` seconds."""
        ...

    async def keepalive(self, lease: int) -> int:
        """Renew the lease: its TTL, in seconds. ``LeaseLost`` if it is gone."""
        ...

    async def revoke(self, lease: int) -> None:
        """End the lease now; its keys are deleted. A lease already gone is no error."""
        ...

    async def compact(self, revision: int) -> None:
        """Forget history before ``revision`` (reads and watches from before it get
        ``Compacted``)."""
        ...

    def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AbstractAsyncContextManager[AsyncIterator[Sequence[WatchEvent]]]:
        """A watch of the key (or prefix) from ``start_revision`` (0: from now on): each item
        is the events of one revision or more, in revision order. The iterator raises
        ``Compacted`` when ``start_revision`` was compacted away, and ``MetadataUnavailable``
        when the store goes away mid-watch; it never ends otherwise. Leaving the context
        cancels the watch."""
        ...

    async def aclose(self) -> None:
        """Release connections; the store is not used after."""
        ...


def prefix_end(prefix: str) -> bytes:
    """The first key past every key that starts with ``prefix`` (etcd's range end): the
    prefix's UTF-8 bytes with the last byte below 0xff incremented (``b"\\0"``: the prefix is
    empty or all 0xff, every key)."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"
