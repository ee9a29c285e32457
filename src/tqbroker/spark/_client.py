"""A small blocking client of the broker's HTTP API, for Spark's Python workers (which run
outside Trio: plain sockets, one request at a time).

Responsibilities:
- one keep-alive connection per broker address per worker thread, kept between tasks (Spark
  reuses its Python workers) and reopened once when the broker closed an idle one;
- HTTP Basic authentication from the options; the ``vhost`` on every request;
- the calls the data source needs: each partition's earliest and latest offsets, the first
  offset at or after a timestamp, a bulk fetch (``TQR1`` body) and a bulk, optionally
  idempotent, write (``TQW1`` body);
- errors that say what to fix: ``BrokerError`` carries the status and the broker's message,
  with a hint for the usual causes (unreachable broker, refused login, unknown topic).
"""

from __future__ import annotations

import base64
import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from ._options import Connection

RECORDS_MEDIA_TYPE = "application/x-tqbroker-records"


class BrokerError(Exception):
    """The broker refused a request or could not be reached (``status`` 0)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class PartitionInfo:
    topic: str
    partition: int
    earliest: int  # the first offset still there (retention moves it)
    latest: int  # the next offset to be written (the log end)


class Client:
    """Requests to one broker over one keep-alive connection (not thread-safe: one per thread,
    see ``client_for``)."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._urls = connection.url.split(",")  # a cluster's nodes: the next when one fails
        self._current = 0
        self._use(self._urls[0])
        credentials = f"{connection.user}:{connection.password}".encode()
        self._auth = "Basic " + base64.b64encode(credentials).decode()
        self._conn: http.client.HTTPConnection | None = None

    def _use(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self._url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the calls ------------------------------------------------------------------------------

    def partitions(self, topic: str) -> list[PartitionInfo]:
        """Every partition of ``topic`` with its earliest and latest offsets, in order."""
        body = self._json("GET", f"/topics/{_quote(topic)}/offsets", {}, topic=topic)
        return [
            PartitionInfo(topic, int(p["partition"]), int(p["earliest"]), int(p["latest"]))
            for p in body["partitions"]
        ]

    def offsets_for_timestamp(self, topic: str, timestamp_ms: int) -> dict[int, int | None]:
        """Per partition, the first offset whose timestamp is at or after ``timestamp_ms``
        (None: there is none yet)."""
        body = self._json(
            "GET", f"/topics/{_quote(topic)}/offsets", {"timestamp": timestamp_ms}, topic=topic
        )
        return {
            int(p["partition"]): None if p["timestamp"] is None else int(p["timestamp"])
            for p in body["partitions"]
        }

    def fetch(
        self, topic: str, partition: int, offset: int, end: int, max_bytes: int, headers: bool
    ) -> bytes:
        """The records of ``[offset, end)`` (from the earliest if ``offset`` is gone), about
        ``max_bytes`` of them, at least one record if there is any: as the log's frames
        (``TQF1``, whose first and last frames may hold records outside the range), or with
        ``headers`` as columns (``TQR1``: the broker decodes the headers)."""
        query: dict[str, Any] = {"offset": offset, "end": end, "max_bytes": max_bytes}
        if headers:
            query["headers"] = "true"
        else:
            query["format"] = "frames"
        path = f"/topics/{_quote(topic)}/partitions/{partition}/records"
        status, body = self._request("GET", path, query)
        if status != 200:
            raise self._error(status, body, topic)
        return body

    def produce(
        self, topic: str, body: bytes, producer: tuple[str, int] | None = None
    ) -> int | None:
        """Write a ``TQW1`` body; once durable, return how many of its records were written.
        With ``producer`` (id, sequence of the first record), records that producer already
        wrote are skipped; None if all were."""
        headers = {"content-type": RECORDS_MEDIA_TYPE}
        if producer is not None:
            headers["x-producer-id"] = producer[0]
            headers["x-producer-sequence"] = str(producer[1])
        status, raw = self._request("POST", f"/topics/{_quote(topic)}/records", {}, body, headers)
        if status not in (200, 201):
            raise self._error(status, raw, topic)
        answer = json.loads(raw)
        if answer.get("duplicate"):
            return None
        return int(answer["count"])

    # -- plumbing -------------------------------------------------------------------------------

    def _json(self, method: str, path: str, query: dict[str, Any], *, topic: str) -> Any:
        status, body = self._request(method, path, query)
        if status != 200:
            raise self._error(status, body, topic)
        return json.loads(body)

    def _request(
        self,
        method: str,
        path: str,
        query: dict[str, Any],
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        query = {"vhost": self.connection.vhost, **query}
        sent = {"authorization": self._auth, **(headers or {})}
        failures: list[str] = []
        for _node in self._urls:  # each node of the list once, from the one in use
            try:
                return self._request_here(method, path, query, body, sent)
            except _Unreachable as exc:
                failures.append(f"{self._url}: {exc}")
                self._current = (self._current + 1) % len(self._urls)
                self._use(self._urls[self._current])
        raise BrokerError(
            0, f"cannot reach tqbroker (option 'tqbroker.url'): {'; '.join(failures)}"
        )

    def _request_here(
        self,
        method: str,
        path: str,
        query: dict[str, Any],
        body: bytes | None,
        sent: dict[str, str],
    ) -> tuple[int, bytes]:
        target = f"{self._prefix}{path}?{urllib.parse.urlencode(query)}"
        for attempt in (1, 2):
            reused = self._conn is not None
            conn = self._conn or self._connect()
            try:
                conn.request(method, target, body=body, headers=sent)
                response = conn.getresponse()
                data = response.read()
            except (ConnectionError, http.client.HTTPException, TimeoutError, OSError) as exc:
                self.close()
                # A kept-alive connection the broker has closed meanwhile: once more, afresh.
                # Writes are safe to repeat too: idempotent with a producer id, and at least
                # once without one (as Kafka's sink); so is another node of a cluster.
                if reused and attempt == 1 and not isinstance(exc, TimeoutError):
                    continue
                raise _Unreachable(f"{type(exc).__name__}: {exc}") from exc
            if response.will_close:
                self.close()
            return response.status, data
        raise AssertionError("unreachable")

    def _connect(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        self._conn = cls(self._host, self._port, timeout=self.connection.timeout)
        return self._conn

    def _error(self, status: int, body: bytes, topic: str) -> BrokerError:
        try:
            message = str(json.loads(body).get("message", ""))
        except (ValueError, AttributeError):
            message = body[:200].decode("utf-8", "replace")
        where = f"tqbroker at {self._url}"
        if status == 401:
            hint = "check the options 'tqbroker.user' and 'tqbroker.password'"
        elif status == 403:
            hint = (
                f"the user may not use vhost '{self.connection.vhost}' (option "
                "'tqbroker.vhost'), or lacks the read or write permission the message names"
            )
        elif status == 404:
            hint = f"is topic '{topic}' declared (PUT /topics/{topic})?"
        else:
            hint = ""
        return BrokerError(
            status, f"{where} answered {status}: {message}" + (f" ({hint})" if hint else "")
        )


class _Unreachable(Exception):
    """The node in use did not answer (the client tries the next one of the list)."""


_local = threading.local()


def client_for(connection: Connection) -> Client:
    """This thread's client for ``connection`` (kept for the life of the worker process)."""
    clients: dict[Connection, Client] | None = getattr(_local, "clients", None)
    if clients is None:
        clients = _local.clients = {}
    client = clients.get(connection)
    if client is None:
        client = clients[connection] = Client(connection)
    return client


def _quote(name: str) -> str:
    return urllib.parse.quote(name, safe="")
