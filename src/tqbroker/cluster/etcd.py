"""``EtcdClient``: the ``MetadataStore`` over etcd's v3 JSON gateway (``/v3/...``), on httpx.

httpx (on Trio through anyio) posts each call to one endpoint, from a pool of connections kept
alive; each watch has a connection of its own, closed with it. The gateway's
JSON has keys and values in base64, int64 fields as strings, and leaves out every field that
is zero, false or empty (a failed txn has no ``succeeded``; a put event no ``type``): a missing
field reads as its zero.

- **Failover.** A call goes to the endpoint that last answered; if it cannot be reached
  (connect error, timeout, broken connection, or etcd says it is unavailable) the next one is
  tried, and the one that answers is remembered. None answers: ``MetadataUnavailable``. A
  write whose reply was lost may have been applied before the next endpoint is tried: guard
  writes that must not happen twice with a compare.
- **Errors.** etcd's refusals map onto the protocol's: "requested lease not found" is
  ``LeaseLost``; "required revision has been compacted" ``Compacted`` (its revision is learnt
  from a watch from revision 1, which etcd cancels with the compact revision); malformed
  requests (too many operations, duplicate keys in a txn, an empty key, a future revision)
  ``InvalidRequest``. Compacting at or before the compact revision does nothing.
- **Leases.** One POST per keepalive (the gateway answers a streamed keepalive only when its
  request body ends); a reply without a TTL means the lease is gone.
- **Watches.** One streaming POST per watch: newline-separated
  ``{"result": ...}`` objects, the first ``created``. A watch from a compacted revision is
  cancelled with its ``compact_revision``; a stream that breaks or ends is
  ``MetadataUnavailable``. Leaving the watch closes its connection, which cancels it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Final

import httpx
import trio

from .metadata import (
    MAX_TXN_OPS,
    Compacted,
    Compare,
    Delete,
    Get,
    InvalidRequest,
    KeyValue,
    Lease,
    LeaseLost,
    MetadataError,
    MetadataUnavailable,
    Operation,
    Put,
    RangeResult,
    TxnResult,
    WatchEvent,
    prefix_end,
)

DEFAULT_TIMEOUT: Final = 5.0
# gRPC status codes in the gateway's error replies.
_INVALID_ARGUMENT: Final = 3
_DEADLINE_EXCEEDED: Final = 4
_NOT_FOUND: Final = 5
_OUT_OF_RANGE: Final = 11
_UNAVAILABLE: Final = 14
_COMPARE_TARGETS: Final = {
    "value": ("VALUE", "value"),
    "version": ("VERSION", "version"),
    "create": ("CREATE", "create_revision"),
    "mod": ("MOD", "mod_revision"),
    "lease": ("LEASE", "lease"),
}
_COMPARE_RESULTS: Final = {"=": "EQUAL", "!=": "NOT_EQUAL", "<": "LESS", ">": "GREATER"}

Json = dict[str, Any]


class _EndpointDown(Exception):
    """This endpoint did not answer (or said it cannot serve): try the next."""


class EtcdClient:
    """The ``MetadataStore`` on a real etcd (``endpoints``: base URLs such as
    ``http://127.0.0.1:2379``); ``timeout``: seconds for each request to one endpoint (a
    watch waits for events without limit)."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        if not endpoints:
            raise ValueError("EtcdClient needs at least one endpoint")
        for endpoint in endpoints:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {endpoint!r}: give a URL, http://host:port")
        self._endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self._current = 0
        self._timeout = timeout
        self._http = httpx.AsyncClient(timeout=timeout)
        # Watches hold their connections for as long as they last: their own pool, without a
        # limit (the calls' pool is never exhausted by them) or keep-alive (a connection is
        # closed with its watch).
        self._streams = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, read=None),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
        )

    async def get(self, key: str, *, prefix: bool = False, revision: int = 0) -> RangeResult:
        body = _range_body(key, prefix)
        if revision:
            body["revision"] = str(revision)
        try:
            reply = await self._call("/v3/kv/range", body)
        except Compacted:
            raise await self._compacted(key) from None
        return _range_result(reply, _revision(reply))

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        reply = await self._call("/v3/kv/put", _put_body(Put(key, value, lease)))
        return _revision(reply)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        reply = await self._call("/v3/kv/deleterange", _range_body(key, prefix))
        return int(reply.get("deleted", 0))

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Operation],
        failure: Sequence[Operation] = (),
    ) -> TxnResult:
        for branch in (compares, success, failure):
            if len(branch) > MAX_TXN_OPS:
                raise InvalidRequest(f"more than {MAX_TXN_OPS} operations in a transaction")
        body = {
            "compare": [_compare_body(compare) for compare in compares],
            "success": [_operation_body(op) for op in success],
            "failure": [_operation_body(op) for op in failure],
        }
        reply = await self._call("/v3/kv/txn", body)
        succeeded = bool(reply.get("succeeded", False))
        ran = success if succeeded else failure
        responses = [
            _operation_result(op, response)
            for op, response in zip(ran, reply.get("responses", []), strict=True)
        ]
        return TxnResult(succeeded, _revision(reply), responses)

    async def grant_lease(self, ttl: int) -> Lease:
        reply = await self._call("/v3/lease/grant", {"TTL": str(ttl)})
        if reply.get("error"):
            raise MetadataError(f"etcd refused the lease: {reply['error']}")
        return Lease(int(reply["ID"]), int(reply.get("TTL", 0)))

    async def keepalive(self, lease: int) -> int:
        reply = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result: Json = reply.get("result", {})
        ttl = int(result.get("TTL", 0))
        if ttl <= 0:
            raise LeaseLost(f"lease {lease:x} is gone")
        return ttl

    async def revoke(self, lease: int) -> None:
        with suppress(LeaseLost):  # gone already
            await self._call("/v3/lease/revoke", {"ID": str(lease)})

    async def compact(self, revision: int) -> None:
        with suppress(Compacted):  # compacted at or past it already
            await self._call("/v3/kv/compaction", {"revision": str(revision)})

    @asynccontextmanager
    async def watch(
        self, key: str, *, prefix: bool = False, start_revision: int = 0
    ) -> AsyncIterator[AsyncIterator[Sequence[WatchEvent]]]:
        create = _range_body(key, prefix)
        if start_revision:
            create["start_revision"] = str(start_revision)
        response = await self._open_stream("/v3/watch", {"create_request": create})
        try:
            lines = response.aiter_lines()
            first: Json | None = None
            with trio.move_on_after(self._timeout):
                first = await _next_result(lines)
            if first is None:
                raise MetadataUnavailable("etcd did not answer the watch in time")
            if not first.get("created"):
                _raise_canceled(first)
                raise MetadataError(f"etcd did not create the watch: {first}")
            yield _WatchStream(lines)
        finally:
            await response.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._streams.aclose()

    async def _call(self, path: str, body: Json) -> Json:
        """Post ``body`` to the first endpoint that answers; its reply, or the protocol's
        error for etcd's refusal."""
        for index in self._rotation():
            try:
                reply = await self._post(index, path, body)
            except _EndpointDown:
                continue
            return reply
        raise MetadataUnavailable(f"no etcd endpoint answered ({', '.join(self._endpoints)})")

    def _rotation(self) -> list[int]:
        """The endpoints' indexes, from the one that last answered."""
        count = len(self._endpoints)
        return [(self._current + offset) % count for offset in range(count)]

    async def _post(self, index: int, path: str, body: Json) -> Json:
        try:
            response = await self._http.post(self._endpoints[index] + path, json=body)
        except httpx.TransportError as exc:
            raise _EndpointDown from exc
        reply = _reply(response.status_code, response.content)
        self._current = index
        return reply

    async def _open_stream(self, path: str, body: Json) -> httpx.Response:
        """A streaming POST to the first endpoint that answers (its status checked)."""
        for index in self._rotation():
            request = self._streams.build_request("POST", self._endpoints[index] + path, json=body)
            try:
                response = await self._streams.send(request, stream=True)
            except httpx.TransportError:
                continue
            if response.status_code != 200:
                content = await response.aread()
                await response.aclose()
                try:
                    _reply(response.status_code, content)  # raises: not a 200
                except _EndpointDown:
                    continue
            self._current = index
            return response
        raise MetadataUnavailable(f"no etcd endpoint answered ({', '.join(self._endpoints)})")

    async def _compacted(self, key: str) -> Compacted:
        """The ``Compacted`` error for a read that etcd refused as compacted: a watch from
        revision 1 is cancelled with the compact revision (the range error does not say it)."""
        try:
            async with self.watch(key, start_revision=1) as events:
                async for _ in events:
                    break
        except Compacted as exc:
            return exc
        return Compacted(0)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _range_body(key: str, prefix: bool) -> Json:
    if not prefix:
        return {"key": _b64(key.encode())}
    # The empty prefix is every key: etcd spells that key "\0", range end "\0".
    return {"key": _b64(key.encode() or b"\0"), "range_end": _b64(prefix_end(key))}


def _put_body(put: Put) -> Json:
    body: Json = {"key": _b64(put.key.encode()), "value": _b64(put.value)}
    if put.lease:
        body["lease"] = str(put.lease)
    return body


def _compare_body(compare: Compare) -> Json:
    target, field = _COMPARE_TARGETS[compare.target]
    body: Json = {
        "key": _b64(compare.key.encode()),
        "target": target,
        "result": _COMPARE_RESULTS[compare.result],
    }
    if compare.target == "value":
        if not isinstance(compare.value, bytes):
            raise InvalidRequest(f"a value compare needs bytes, not {compare.value!r}")
        body[field] = _b64(compare.value)
    else:
        if not isinstance(compare.value, int):
            raise InvalidRequest(f"a {compare.target} compare needs an int: {compare.value!r}")
        body[field] = str(compare.value)
    return body


def _operation_body(op: Operation) -> Json:
    if isinstance(op, Put):
        return {"request_put": _put_body(op)}
    if isinstance(op, Delete):
        return {"request_delete_range": _range_body(op.key, op.prefix)}
    return {"request_range": _range_body(op.key, op.prefix)}


def _operation_result(op: Operation, response: Json) -> RangeResult | int | None:
    if isinstance(op, Get):
        inner: Json = response.get("response_range", {})
        return _range_result(inner, _revision(inner))
    if isinstance(op, Delete):
        return int(response.get("response_delete_range", {}).get("deleted", 0))
    return None


def _revision(reply: Mapping[str, Any]) -> int:
    return int(reply.get("header", {}).get("revision", 0))


def _key_value(kv: Json) -> KeyValue:
    return KeyValue(
        key=_unb64(kv.get("key")).decode(),
        value=_unb64(kv.get("value")),
        create_revision=int(kv.get("create_revision", 0)),
        mod_revision=int(kv.get("mod_revision", 0)),
        version=int(kv.get("version", 0)),
        lease=int(kv.get("lease", 0)),
    )


def _range_result(reply: Json, revision: int) -> RangeResult:
    return RangeResult([_key_value(kv) for kv in reply.get("kvs", [])], revision)


def _reply(status: int, content: bytes) -> Json:
    """The reply etcd gave; ``_EndpointDown`` if it could not serve the call (unavailable, no
    leader, timed out, or a proxy's error page instead of etcd's), the protocol's error for a
    refusal."""
    if status >= 500 and content.lstrip()[:1] != b"{":
        raise _EndpointDown
    reply = _decode(content)
    error = _error_of(reply, status)
    if error is not None:
        code, message = error
        if code in (_UNAVAILABLE, _DEADLINE_EXCEEDED):
            raise _EndpointDown
        raise _refusal(code, message)
    return reply


def _decode(content: bytes) -> Json:
    try:
        reply = json.loads(content)
    except ValueError as exc:
        raise MetadataError(f"etcd's reply is not JSON: {content[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise MetadataError(f"etcd's reply is not an object: {content[:200]!r}")
    return reply


def _error_of(reply: Json, status: int) -> tuple[int, str] | None:
    """The gRPC code and message of an error reply (a unary call's ``{"code", "message"}``,
    or a stream's ``{"error": {"grpc_code", "message"}}``), or None for a good reply."""
    error = reply.get("error")
    if isinstance(error, dict):
        return int(error.get("grpc_code", 0)), str(error.get("message", error))
    if status != 200 or "code" in reply:
        return int(reply.get("code", 0)), str(reply.get("message", reply))
    return None


def _refusal(code: int, message: str) -> MetadataError:
    if "lease not found" in message:
        return LeaseLost(message)
    if "has been compacted" in message:
        return Compacted(0)
    if code in (_INVALID_ARGUMENT, _OUT_OF_RANGE, _NOT_FOUND):
        return InvalidRequest(message)
    return MetadataError(f"etcd refused the request (code {code}): {message}")


async def _next_result(lines: AsyncIterator[str]) -> Json:
    """The next ``result`` object of a watch stream; ``MetadataUnavailable`` when the stream
    breaks or ends, the protocol's error for an error object."""
    try:
        async for line in lines:
            if not line.strip():
                continue
            message = _decode(line.encode())
            error = _error_of(message, 200)
            if error is not None:
                raise _refusal(*error)
            result: Json = message.get("result", {})
            return result
    except httpx.TransportError as exc:
        raise MetadataUnavailable(f"the watch broke off: {exc}") from exc
    raise MetadataUnavailable("etcd ended the watch")


def _raise_canceled(result: Json) -> None:
    if result.get("canceled"):
        compact_revision = int(result.get("compact_revision", 0))
        if compact_revision:
            raise Compacted(compact_revision)
        raise MetadataError(f"etcd cancelled the watch: {result.get('cancel_reason', '')}")


class _WatchStream:
    """A watch's batches of events (progress notifications skipped); raises the error that
    ended it."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines

    def __aiter__(self) -> _WatchStream:
        return self

    async def __anext__(self) -> Sequence[WatchEvent]:
        while True:
            result = await _next_result(self._lines)
            _raise_canceled(result)
            events = [_watch_event(event) for event in result.get("events", [])]
            if events:
                return events


def _watch_event(event: Json) -> WatchEvent:
    kv = _key_value(event.get("kv", {}))
    return WatchEvent("delete", kv) if event.get("type") == "DELETE" else WatchEvent("put", kv)
