"""The data source's options, parsed and checked before anything runs (pure Python, no Spark).

Responsibilities:
- the connection options every part shares (``tqbroker.url``, ``tqbroker.user``,
  ``tqbroker.password``, ``tqbroker.vhost``, ``tqbroker.timeout``);
- the source options, with the names and the offset JSON of Spark's Kafka source: exactly one
  of ``subscribe`` and ``assign``; ``startingOffsets`` / ``endingOffsets`` (``earliest``,
  ``latest`` or ``{"topic": {"0": 23, "1": -2}}``), ``startingTimestamp`` /
  ``startingOffsetsByTimestamp`` (and the ending ones, batch only),
  ``startingOffsetsByTimestampStrategy``, ``maxOffsetsPerTrigger``, ``minPartitions``,
  ``maxRecordsPerPartition``, ``failOnDataLoss``, ``includeHeaders``, ``fetchMaxBytes``;
- the sink options (``topic``, ``sinkId``, ``idempotent``, ``writeChunkBytes``).

Every problem is an ``OptionError`` (a ``ValueError``) whose message names the option and says
what it accepts. Option names are case-insensitive, as Spark's are.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

DEFAULT_URL = "http://127.0.0.1:15672"
EARLIEST = -2  # Kafka's markers in offset JSON
LATEST = -1
MAX_FETCH_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_RECORDS_PER_PARTITION = 1_000_000  # larger ranges are split across Spark tasks


class OptionError(ValueError):
    """A data source option is missing, malformed or not allowed here."""


@dataclass(frozen=True)
class Connection:
    """Where the broker's HTTP API is and how to log in (hashable: it keys the client cache)."""

    url: str  # scheme://host:port[/prefix], no trailing slash; a cluster's: several, by commas
    user: str = "guest"
    password: str = "guest"
    vhost: str = "/"
    timeout: float = 60.0

    def __repr__(self) -> str:  # never print the password
        return f"Connection(url={self.url!r}, user={self.user!r}, vhost={self.vhost!r})"


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends, before it is resolved against the broker's offsets.

    ``kind``: ``earliest``, ``latest``, ``offsets`` (``per_partition`` holds offsets, -2/-1 as
    markers), ``timestamp`` (``timestamp`` for every partition) or ``timestamps``
    (``per_partition`` holds timestamps)."""

    kind: Literal["earliest", "latest", "offsets", "timestamp", "timestamps"]
    option: str  # the option it came from, for messages
    per_partition: Mapping[str, Mapping[int, int]] | None = None
    timestamp: int | None = None


@dataclass(frozen=True)
class SourceOptions:
    connection: Connection
    topics: tuple[str, ...]
    assign: Mapping[str, tuple[int, ...]] | None  # None: every partition of ``topics``
    starting: OffsetSpec
    ending: OffsetSpec | None  # batch only
    timestamp_strategy: Literal["error", "latest"]
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int
    fail_on_data_loss: bool
    include_headers: bool
    fetch_max_bytes: int


@dataclass(frozen=True)
class SinkOptions:
    connection: Connection
    topic: str | None  # the option; None: the ``topic`` column
    sink_id: str | None
    idempotent: bool
    chunk_bytes: int


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    """Spark hands options as a case-insensitive dict; plain dicts (tests) are normalised."""
    return {str(k).lower(): str(v) for k, v in options.items()}


def connection(options: Mapping[str, str]) -> Connection:
    opts = lower_keys(options)
    for name in opts:
        if name.startswith("kafka."):
            raise OptionError(
                f"option '{name}': tqbroker takes 'tqbroker.url' (the broker's HTTP API, "
                f"default {DEFAULT_URL}), 'tqbroker.user' and 'tqbroker.password' instead of "
                "kafka.* options"
            )
    urls = [
        _checked_url(part.strip().rstrip("/"))
        for part in opts.get("tqbroker.url", DEFAULT_URL).split(",")
        if part.strip()
    ]
    if not urls:
        raise OptionError(f"option 'tqbroker.url' names no broker (such as {DEFAULT_URL})")
    url = ",".join(urls)
    timeout = _positive_float(opts, "tqbroker.timeout", 60.0)
    return Connection(
        url,
        opts.get("tqbroker.user", "guest"),
        opts.get("tqbroker.password", "guest"),
        opts.get("tqbroker.vhost", "/"),
        timeout,
    )


def _checked_url(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OptionError(
            f"option 'tqbroker.url' must be the broker's HTTP API address such as {DEFAULT_URL} "
            f"(got {url!r})"
        )
    try:
        parts.port  # noqa: B018  (raises for a malformed port)
    except ValueError:
        raise OptionError(f"option 'tqbroker.url' has a malformed port (got {url!r})") from None
    if parts.query or parts.fragment:
        raise OptionError(f"option 'tqbroker.url' takes no query or fragment (got {url!r})")
    return url


def source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    opts = lower_keys(options)
    conn = connection(opts)
    if "subscribepattern" in opts:
        raise OptionError(
            "option 'subscribePattern' is not supported (the broker's HTTP API does not list "
            "topics): name the topics with 'subscribe'"
        )
    has_subscribe, has_assign = "subscribe" in opts, "assign" in opts
    if has_subscribe == has_assign:
        raise OptionError(
            "give exactly one of the options 'subscribe' (a comma-separated list of topics) "
            "and 'assign' (JSON such as {\"orders\": [0, 1]})"
        )
    assign: dict[str, tuple[int, ...]] | None = None
    if has_subscribe:
        topics = tuple(t.strip() for t in opts["subscribe"].split(","))
        if not all(topics):
            raise OptionError(
                f"option 'subscribe' must be a comma-separated list of topic names "
                f"(got {opts['subscribe']!r})"
            )
    else:
        assign = _assign(opts["assign"])
        topics = tuple(assign)
    if len(set(topics)) != len(topics):
        raise OptionError(f"option 'subscribe' names a topic twice ({', '.join(topics)})")
    starting = _starting(opts, streaming=streaming)
    ending = _ending(opts, streaming=streaming)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            "option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest' "
            f"(got {strategy!r})"
        )
    max_per_trigger = _positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    if max_per_trigger is not None and not streaming:
        raise OptionError("option 'maxOffsetsPerTrigger' applies to streaming queries only")
    for unsupported in ("minoffsetspertrigger", "maxtriggerdelay"):
        if unsupported in opts:
            raise OptionError(
                f"option '{unsupported}' is not supported by the tqbroker source (yet); "
                "use maxOffsetsPerTrigger and a processing-time trigger"
            )
    fetch = _positive_int(opts, "fetchmaxbytes", "fetchMaxBytes") or 4 * 1024 * 1024
    if fetch > MAX_FETCH_BYTES:
        raise OptionError(f"option 'fetchMaxBytes' is at most {MAX_FETCH_BYTES} (got {fetch})")
    return SourceOptions(
        connection=conn,
        topics=topics,
        assign=assign,
        starting=starting,
        ending=ending,
        timestamp_strategy="latest" if strategy == "latest" else "error",
        max_offsets_per_trigger=max_per_trigger,
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions"),
        max_records_per_partition=_positive_int(
            opts, "maxrecordsperpartition", "maxRecordsPerPartition"
        )
        or DEFAULT_MAX_RECORDS_PER_PARTITION,
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", True),
        include_headers=_boolean(opts, "includeheaders", "includeHeaders", False),
        fetch_max_bytes=fetch,
    )


def sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = lower_keys(options)
    conn = connection(opts)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("option 'topic' must be a topic name")
    chunk = _positive_int(opts, "writechunkbytes", "writeChunkBytes") or 1024 * 1024
    if chunk > MAX_FETCH_BYTES // 2:
        raise OptionError(
            f"option 'writeChunkBytes' is at most {MAX_FETCH_BYTES // 2} (got {chunk})"
        )
    return SinkOptions(
        connection=conn,
        topic=topic,
        sink_id=opts.get("sinkid") or None,
        idempotent=_boolean(opts, "idempotent", "idempotent", True),
        chunk_bytes=chunk,
    )


def _by_timestamp(opts: Mapping[str, str], prefix: str) -> OffsetSpec | None:
    """``{prefix}Timestamp`` (one time for every partition), else ``{prefix}OffsetsByTimestamp``
    (per partition), in Kafka's precedence; None when neither is given."""
    name = f"{prefix}Timestamp"
    if name.lower() in opts:
        return OffsetSpec("timestamp", name, timestamp=_timestamp(opts[name.lower()], name))
    name = f"{prefix}OffsetsByTimestamp"
    if name.lower() in opts:
        per_partition = _partition_json(opts[name.lower()], name, minimum=0)
        return OffsetSpec("timestamps", name, per_partition=per_partition)
    return None


def _starting(opts: Mapping[str, str], *, streaming: bool) -> OffsetSpec:
    # Kafka's precedence: startingTimestamp > startingOffsetsByTimestamp > startingOffsets.
    by_time = _by_timestamp(opts, "starting")
    if by_time is not None:
        return by_time
    raw = opts.get("startingoffsets", "latest" if streaming else "earliest").strip()
    if raw.lower() == "earliest":
        return OffsetSpec("earliest", "startingOffsets")
    if raw.lower() == "latest":
        if not streaming:
            raise OptionError(
                "option 'startingOffsets' cannot be 'latest' for a batch query (it would read "
                "nothing): use 'earliest' or per-partition JSON"
            )
        return OffsetSpec("latest", "startingOffsets")
    per_partition = _partition_json(raw, "startingOffsets", minimum=EARLIEST)
    if not streaming and any(o == LATEST for p in per_partition.values() for o in p.values()):
        raise OptionError("option 'startingOffsets': -1 (latest) is not allowed for a batch query")
    return OffsetSpec("offsets", "startingOffsets", per_partition=per_partition)


def _ending(opts: Mapping[str, str], *, streaming: bool) -> OffsetSpec | None:
    names = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
    given = [name for name in names if name.lower() in opts]
    if streaming:
        if given:
            raise OptionError(
                f"option '{given[0]}' applies to batch queries only (a stream has no end)"
            )
        return None
    by_time = _by_timestamp(opts, "ending")
    if by_time is not None:
        return by_time
    raw = opts.get("endingoffsets", "latest").strip()
    if raw.lower() == "latest":
        return OffsetSpec("latest", "endingOffsets")
    if raw.lower() == "earliest":
        raise OptionError("option 'endingOffsets' cannot be 'earliest': use 'latest' or JSON")
    per_partition = _partition_json(raw, "endingOffsets", minimum=LATEST)
    return OffsetSpec("offsets", "endingOffsets", per_partition=per_partition)


def _partition_json(raw: str, option: str, *, minimum: int) -> dict[str, dict[int, int]]:
    """``{"topic": {"0": 23, "1": -2}}``, checked: partitions are numbers >= 0, values integers
    >= ``minimum``."""
    example = '{"orders": {"0": 23, "1": -2}}'
    try:
        parsed = json.loads(raw)
    except ValueError:
        raise OptionError(
            f"option '{option}' must be 'earliest', 'latest' or JSON such as {example} "
            f"(got {raw!r})"
        ) from None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option '{option}' must be a JSON object such as {example}")
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise OptionError(
                f"option '{option}': topic '{topic}' must map partition numbers to values, "
                f"as in {example}"
            )
        per: dict[int, int] = {}
        for partition, value in partitions.items():
            if not str(partition).isdigit():
                raise OptionError(
                    f"option '{option}': '{partition}' (topic '{topic}') is not a partition number"
                )
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                allowed = {
                    EARLIEST: "an offset >= 0, -2 (earliest) or -1 (latest)",
                    LATEST: "an offset >= 0 or -1 (latest)",
                    0: "milliseconds since the epoch (>= 0)",
                }[minimum]
                raise OptionError(
                    f"option '{option}': the value for {topic}/{partition} must be {allowed} "
                    f"(got {value!r})"
                )
            per[int(partition)] = value
        result[topic] = per
    return result


def _assign(raw: str) -> dict[str, tuple[int, ...]]:
    example = '{"orders": [0, 1]}'
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not parsed:
        raise OptionError(f"option 'assign' must be JSON such as {example} (got {raw!r})")
    result: dict[str, tuple[int, ...]] = {}
    for topic, partitions in parsed.items():
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            )
            or len(set(partitions)) != len(partitions)
        ):
            raise OptionError(
                f"option 'assign': topic '{topic}' needs a list of distinct partition numbers, "
                f"as in {example}"
            )
        result[topic] = tuple(sorted(partitions))
    return result


def _timestamp(raw: str, option: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(
            f"option '{option}' must be a timestamp in milliseconds since the epoch (got {raw!r})"
        )
    return value


def _positive_int(opts: Mapping[str, str], key: str, option: str) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value <= 0:
        raise OptionError(f"option '{option}' must be a positive integer (got {raw!r})")
    return value


def _positive_float(opts: Mapping[str, str], key: str, default: float) -> float:
    raw = opts.get(key)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = 0.0
    if not value > 0:
        raise OptionError(f"option '{key}' must be a positive number of seconds (got {raw!r})")
    return value


def _boolean(opts: Mapping[str, str], key: str, option: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    raise OptionError(f"option '{option}' must be 'true' or 'false' (got {raw!r})")
