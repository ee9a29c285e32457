"""Broker configuration with embedded defaults: no file is needed to start.

Responsibilities:
- ``BrokerConfig``: listen address, data directory, protocol limits, timeouts, storage and the
  initial users and vhosts, each with the default a RabbitMQ user expects;
- ``load_config``: read a TOML file (keys as the attribute names, ``[[users]]`` tables,
  ``[backend_options.log]`` sections) into a ``BrokerConfig``, with clear errors for unknown keys
  and wrong types (cattrs does the structuring).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs

from .resources import parse_limit


@attrs.frozen
class UserConfig:
    name: str
    password: str
    # Users that may only connect from a loopback address (RabbitMQ's ``loopback_users``).
    loopback_only: bool = False
    # The vhosts the user may open; None means every vhost.
    vhosts: tuple[str, ...] | None = None


def _memory_limit(_instance: object, _attribute: object, value: float | str) -> None:
    limit = parse_limit(value, "memory_high_watermark")
    if limit.fraction is not None and limit.fraction > 1:
        raise ValueError(f"memory_high_watermark: a fraction of memory up to 1.0, not {value}")


def _disk_limit(_instance: object, _attribute: object, value: float | str) -> None:
    parse_limit(value, "disk_free_limit")


@attrs.frozen
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 5672  # 0 = an ephemeral port
    # The HTTP API (topics, health): on the same host; 0 = an ephemeral port, None = off.
    http_port: int | None = 15672
    data_dir: Path = attrs.field(default=Path("tqbroker-data"), converter=Path)
    vhosts: tuple[str, ...] = ("/",)
    users: tuple[UserConfig, ...] = (UserConfig("guest", "guest", loopback_only=True),)
    # Offered in connection.tune (RabbitMQ's defaults).
    channel_max: int = 2047
    frame_max: int = 131072
    heartbeat: int = 60
    max_message_size: int = 16 * 1024 * 1024
    # Seconds a client has from TCP accept to connection.open-ok.
    handshake_timeout: float = 10.0
    # Seconds open connections get to finish on shutdown before they are cut.
    shutdown_timeout: float = 5.0
    # Seconds to wait before answering a failed login (slows down password guessing).
    auth_failure_delay: float = 1.0
    # The backend of durable queues ("log" or any installed backend); transient queues use
    # "memory". A queue's x-queue-backend argument overrides.
    durable_backend: str = "log"
    # Constructor options per backend name, e.g. {"log": {"fsync": "never"}}.
    backend_options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    # Milliseconds a delivery may stay unacknowledged before its channel is closed with 406
    # (RabbitMQ's consumer_timeout, 30 minutes by default); a queue's x-consumer-timeout
    # overrides; None disables.
    consumer_timeout_ms: int | None = 30 * 60 * 1000
    # A stored exchange whose type does not load, or a stored queue whose arguments no longer
    # validate, stops the start; True keeps it dormant instead (written back unchanged).
    keep_unloadable_definitions: bool = False
    # Resource alarms (RabbitMQ's vm_memory_high_watermark and disk_free_limit): over the memory
    # watermark (a fraction of RAM or of the cgroup limit, or a size such as "512MiB"), or under
    # the free disk limit (a size such as "50MB", or a multiple of RAM such as 1.0), connections
    # that publish are blocked until the alarm clears.
    memory_high_watermark: float | str = attrs.field(default=0.4, validator=_memory_limit)
    disk_free_limit: float | str = attrs.field(default="50MB", validator=_disk_limit)
    # Bytes of message bodies one connection may have announced and not yet completed, across
    # its channels; a content header beyond it is refused with 406 (and across all connections,
    # at most a tenth of the memory high watermark).
    max_incomplete_body_per_connection: int = 64 * 1024 * 1024
    # Prometheus metrics (/metrics, /metrics/per-object) on a port of their own, on the same
    # host (RabbitMQ's 15692); 0 = an ephemeral port, None = off. The HTTP API serves them too.
    metrics_port: int | None = 15692
    # A definitions file (RabbitMQ's JSON schema) imported at boot, as RabbitMQ's
    # load_definitions: what it declares is created if missing.
    load_definitions: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )


class ConfigError(Exception):
    """A configuration file that cannot be used; the message says where and why."""


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(Path, lambda value, _type: Path(value))
_converter.register_structure_hook(float | str, lambda value, _type: _limit_value(value))


def _limit_value(value: object) -> float | str:
    """A limit as the file writes it: a number (a fraction, or bytes) or a size string."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"a fraction such as 0.4 or a size such as 512MiB, not {value!r}")
    return value


def load_config(path: Path, **overrides: Any) -> BrokerConfig:
    """The configuration in the TOML file ``path``, with ``overrides`` (e.g. from command-line
    flags) taking precedence."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    raw.update(overrides)
    if "users" in raw:
        raw["users"] = tuple(raw["users"])
    try:
        return _converter.structure(raw, BrokerConfig)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        details = (
            "; ".join(cattrs.transform_error(exc))
            if isinstance(exc, cattrs.BaseValidationError)
            else str(exc)
        )
        raise ConfigError(f"invalid configuration in {path}: {details}") from None
