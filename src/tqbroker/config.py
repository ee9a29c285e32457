"""Broker configuration with embedded defaults: no file is needed to start.

Responsibilities:
- ``BrokerConfig``: listen address, data directory, protocol limits, timeouts and the initial
  users and vhosts, each with the default a RabbitMQ user expects.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs


@attrs.frozen
class UserConfig:
    name: str
    password: str
    # Users that may only connect from a loopback address (RabbitMQ's ``loopback_users``).
    loopback_only: bool = False
    # The vhosts the user may open; None means every vhost.
    vhosts: tuple[str, ...] | None = None


@attrs.frozen
class BrokerConfig:
    host: str = "127.0.0.1"
    port: int = 5672  # 0 = an ephemeral port
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
