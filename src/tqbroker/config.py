"""Broker configuration with embedded defaults: no file is needed to start.

Responsibilities:
- ``BrokerConfig``: listen address, data directory, protocol limits, timeouts, storage, logging,
  users (``[[users]]``, applied at every start), authentication and vhosts, each with the
  default a RabbitMQ user expects; every value is
  range-checked by an attrs validator (``SettingError`` names the key), so ``BrokerConfig(...)``
  in Python refuses nonsense as the command line does;
- ``TlsConfig``: the ``[tls]`` table (RabbitMQ's ``ssl_options`` names: certfile, keyfile,
  cacertfile, verify_peer, fail_if_no_peer_cert; the amqps port; ``ssl_cert_login_from``);
- ``load_config``: read a TOML file (keys as the attribute names, ``[[users]]`` tables,
  ``[backend_options.log]`` sections, a ``[tls]`` table) into a ``BrokerConfig``, with clear
  errors for unknown keys and wrong types (cattrs does the structuring). Ports that can be
  turned off (and ``consumer_timeout_ms``) take ``"off"`` or ``false`` in a file, as TOML has
  no null.
  Environment variables and flags are layered on top in ``settings.py``.

Over 400 lines as one job: one ``BrokerConfig`` class whose every key has its default,
validator and docstring together; splitting it would spread one table over files.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs
from cattrs.v import format_exception

from .auth.model import compile_pattern
from .auth.passwords import DEFAULT_ALGORITHM, HashError, validate_hash
from .auth.sasl import DEFAULT_MECHANISMS, MECHANISMS
from .resources import parse_limit

MAX_PORT = 65535
DEFAULT_METRICS_PORT = 15692  # RabbitMQ's (rabbitmq_prometheus)
# RabbitMQ's limits: the smallest frame_max (FRAME_MIN_SIZE in the spec), the largest message.
FRAME_MIN_SIZE = 4096
MAX_FRAME_MAX = 2**32 - 1
MAX_MESSAGE_SIZE = 512 * 1024 * 1024
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")
PLACEMENTS = ("spread", "colocate")  # tqbroker.cluster.placement's policies
# The keys whose "off" form (None in Python; "off" or false in a file) disables something.
OFF_KEYS = ("http_port", "metrics_port", "kafka_port", "kafka_tls_port", "consumer_timeout_ms")


class SettingError(ValueError):
    """A setting's value out of its range: ``key`` names it (a flag or an environment variable
    can re-word the key), ``reason`` says what is allowed."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key, self.reason = key, reason


def _between(low: int | float, high: int | float | None = None) -> Any:
    """A validator: an int (or float) in ``low..high``; None passes (an optional setting)."""

    def check(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SettingError(attribute.name, f"must be a number (got {value!r})")
        if value != value or value in (float("inf"), float("-inf")):
            raise SettingError(attribute.name, f"must be a finite number (got {value})")
        if high is None and value < low:
            raise SettingError(attribute.name, f"must be at least {low} (got {value})")
        if high is not None and not low <= value <= high:
            off = ', or "off"' if attribute.name in OFF_KEYS else ""
            raise SettingError(
                attribute.name, f"must be between {low} and {high}{off} (got {value})"
            )

    return check


def _host_port(_instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    """A validator: "host:port" (an IPv6 host in brackets), or None."""
    if value is None:
        return
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise SettingError(attribute.name, f"must be host:port (got {value!r})")


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(_instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            raise SettingError(
                attribute.name, f"must be one of {', '.join(choices)} (got {value!r})"
            )

    return check


def _not_empty(_instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not value:
        raise SettingError(attribute.name, "must not be empty")


def _some(_instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        raise SettingError(attribute.name, "must name at least one")


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


_port = _between(0, MAX_PORT)


def _frame_max(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    _between(0, MAX_FRAME_MAX)(instance, attribute, value)
    if 0 < value < FRAME_MIN_SIZE:
        raise SettingError(
            attribute.name,
            f"must be 0 (no limit) or between {FRAME_MIN_SIZE} and {MAX_FRAME_MAX} (got {value})",
        )


def _permission_pattern(_instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    try:
        compile_pattern(value)
    except ValueError as exc:
        raise SettingError(attribute.name, str(exc)) from None


@attrs.frozen
class PermissionConfig:
    """A user's configure/write/read patterns on one vhost (RabbitMQ's ``set_permissions``)."""

    configure: str = attrs.field(default=".*", validator=_permission_pattern)
    write: str = attrs.field(default=".*", validator=_permission_pattern)
    read: str = attrs.field(default=".*", validator=_permission_pattern)


def _user_config(instance: UserConfig, _attribute: object, _value: object) -> None:
    where = f"users: user '{instance.name}'"
    if instance.password is not None and instance.password_hash is not None:
        raise SettingError(where, "give password or password_hash, not both")
    try:
        validate_hash(instance.password_hash or "", instance.hashing_algorithm)
    except HashError as exc:
        raise SettingError(where, str(exc)) from None


@attrs.frozen
class UserConfig:
    """A ``[[users]]`` entry: applied on every start, as RabbitMQ's ``load_definitions``
    (created, or its password, tags and permissions overwritten). ``password`` (plain text, for
    development: hashed in memory at load) or ``password_hash`` + ``hashing_algorithm``
    (RabbitMQ's format, ``python -m tqbroker hash-password``); neither: no password (only
    EXTERNAL logs the user in). ``permissions``: vhost -> patterns."""

    name: str = attrs.field(validator=_not_empty)
    password: str | None = attrs.field(default=None, repr=False)
    password_hash: str | None = attrs.field(default=None, repr=False)
    hashing_algorithm: str = attrs.field(default=DEFAULT_ALGORITHM, validator=_user_config)
    tags: tuple[str, ...] = ()
    permissions: Mapping[str, PermissionConfig] = attrs.field(factory=dict)


# RabbitMQ's default user: guest/guest, administrator, everything on "/", loopback only
# (``loopback_users``).
DEFAULT_USERS = (
    UserConfig("guest", "guest", tags=("administrator",), permissions={"/": PermissionConfig()}),
)


def _mechanisms(_instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    unknown = [m for m in value if m not in MECHANISMS]
    if unknown or not value:
        raise SettingError(
            attribute.name, f"must be some of {', '.join(MECHANISMS)} (got {', '.join(value)})"
        )


LOGIN_FROM = ("common_name", "distinguished_name", "subject_alternative_name")
SAN_TYPES = ("dns", "ip", "email", "uri", "other_name")


@attrs.frozen
class TlsConfig:
    """The ``[tls]`` table: the amqps listener runs when ``certfile`` and ``keyfile`` are set."""

    port: int = attrs.field(default=5671, validator=_port)  # 0 = an ephemeral port
    certfile: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    keyfile: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    # The CAs client certificates are checked against (the system's when not set).
    cacertfile: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    # Check a client certificate if one is sent; with fail_if_no_peer_cert, require one.
    verify_peer: bool = False
    fail_if_no_peer_cert: bool = False
    # No plaintext AMQP listener; ``http``: the HTTP API and metrics ports serve HTTPS.
    only: bool = False
    http: bool = False
    # EXTERNAL: the username from the client certificate (rabbitmq_auth_mechanism_ssl).
    ssl_cert_login_from: str = attrs.field(default="common_name", validator=_one_of(LOGIN_FROM))
    ssl_cert_login_san_type: str = attrs.field(default="dns", validator=_one_of(SAN_TYPES))
    ssl_cert_login_san_index: int = attrs.field(default=0, validator=_between(0, 1000))

    def __attrs_post_init__(self) -> None:
        if (self.certfile is None) != (self.keyfile is None):
            missing = "keyfile" if self.keyfile is None else "certfile"
            raise SettingError(f"tls.{missing}", "certfile and keyfile go together: set both")
        for key in ("only", "http", "verify_peer"):
            if getattr(self, key) and self.certfile is None:
                raise SettingError(f"tls.{key}", "needs tls.certfile and tls.keyfile")
        if self.fail_if_no_peer_cert and not self.verify_peer:
            raise SettingError("tls.fail_if_no_peer_cert", "needs tls.verify_peer")

    @property
    def enabled(self) -> bool:
        return self.certfile is not None


def _memory_limit(_instance: object, _attribute: object, value: float | str) -> None:
    limit = parse_limit(value, "memory_high_watermark")
    if limit.fraction is not None and limit.fraction > 1:
        raise SettingError("memory_high_watermark", f"a fraction of memory up to 1.0, not {value}")


def _disk_limit(_instance: object, _attribute: object, value: float | str) -> None:
    parse_limit(value, "disk_free_limit")


DEFAULT_KAFKA_PORT = 9092
DEFAULT_KAFKA_TLS_PORT = 9093


def _follow_amqp_port(config: BrokerConfig) -> int | None:
    """The Kafka listener's port when none is given: ephemeral when the AMQP port is, else
    Kafka's 9092."""
    return 0 if config.port == 0 else DEFAULT_KAFKA_PORT


def _follow_amqp_port_tls(config: BrokerConfig) -> int | None:
    """The Kafka TLS listener's port when none is given: ephemeral when the AMQP port is,
    else 9093."""
    return 0 if config.port == 0 else DEFAULT_KAFKA_TLS_PORT


def _follow_http_port(config: BrokerConfig) -> int | None:
    """The metrics port when none is given: the HTTP API's "off" or "ephemeral", or 15692."""
    return config.http_port if config.http_port in (None, 0) else DEFAULT_METRICS_PORT


@attrs.frozen
class BrokerConfig:
    """The broker's settings, each with its default (``docs/operations.md`` has their ranges).

    Ports: 0 is an ephemeral port, None (``http_port``, ``metrics_port``) none at all. The
    metrics port, unless given, follows ``http_port``: off when it is off, ephemeral when it is
    ephemeral, 15692 otherwise; so ``BrokerConfig(port=0, http_port=0)`` (or ``http_port=None``)
    binds no fixed port, and ``python -m tqbroker`` binds 5672, 15672 and 15692. It is chosen
    at construction: ``attrs.evolve(config, http_port=0)`` keeps the metrics port ``config``
    had."""

    host: str = attrs.field(default="127.0.0.1", validator=_not_empty)
    port: int = attrs.field(default=5672, validator=_port)  # 0 = an ephemeral port
    # The HTTP API (topics, health): on the same host; 0 = an ephemeral port, None = off.
    http_port: int | None = attrs.field(default=15672, validator=_port)
    data_dir: Path = attrs.field(default=Path("tqbroker-data"), converter=Path)
    vhosts: tuple[str, ...] = ("/",)
    users: tuple[UserConfig, ...] = DEFAULT_USERS
    # Users that may log in from a loopback peer address only (RabbitMQ's loopback_users).
    loopback_users: tuple[str, ...] = ("guest",)
    # SASL mechanisms offered (RabbitMQ's auth_mechanisms); EXTERNAL only to connections with a
    # verified client certificate.
    auth_mechanisms: tuple[str, ...] = attrs.field(
        default=DEFAULT_MECHANISMS, validator=_mechanisms
    )
    # The authentication/authorization backends, in order (RabbitMQ's auth_backends): names in
    # the entry-point group tqbroker.auth_backends; "internal" is the user database.
    auth_backends: tuple[str, ...] = attrs.field(default=("internal",), validator=_some)
    # Constructor options per auth backend name, e.g. {"http": {"user_path": "..."}}.
    auth_backend_options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    # Failed logins per source address: a burst, then a rate per second; over it a login is
    # refused before any password check.
    auth_failure_burst: int = attrs.field(default=10, validator=_between(1))
    auth_failure_rate: float = attrs.field(default=1.0, validator=_between(0.001))
    # Offered in connection.tune (RabbitMQ's defaults and limits).
    channel_max: int = attrs.field(default=2047, validator=_between(0, MAX_PORT))
    # 0 = no limit (the spec's, as RabbitMQ's frame_max = 0).
    frame_max: int = attrs.field(default=131072, validator=_frame_max)
    heartbeat: int = attrs.field(default=60, validator=_between(0, MAX_PORT))
    max_message_size: int = attrs.field(
        default=16 * 1024 * 1024, validator=_between(1, MAX_MESSAGE_SIZE)
    )
    # Seconds a client has from TCP accept to connection.open-ok.
    handshake_timeout: float = attrs.field(default=10.0, validator=_between(0.001))
    # Connections one source address may have between TCP accept and connection.open-ok; more
    # are closed at once (0 = no limit).
    max_pending_handshakes_per_address: int = attrs.field(default=100, validator=_between(0))
    # Seconds open connections get to finish on shutdown before they are cut.
    shutdown_timeout: float = attrs.field(default=5.0, validator=_between(0))
    # Seconds to wait before answering a failed login (slows down password guessing).
    auth_failure_delay: float = attrs.field(default=1.0, validator=_between(0))
    # The backend of durable queues ("log" or any installed backend); transient queues use
    # "memory". A queue's x-queue-backend argument overrides.
    durable_backend: str = attrs.field(default="log", validator=_not_empty)
    # Constructor options per backend name, e.g. {"log": {"fsync": "never"}}.
    backend_options: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict)
    # Milliseconds a delivery may stay unacknowledged before its channel is closed with 406
    # (RabbitMQ's consumer_timeout, 30 minutes by default); a queue's x-consumer-timeout
    # overrides; None disables.
    consumer_timeout_ms: int | None = attrs.field(default=30 * 60 * 1000, validator=_between(1))
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
    max_incomplete_body_per_connection: int = attrs.field(
        default=64 * 1024 * 1024, validator=_between(1)
    )
    # Prometheus metrics (/metrics, /metrics/per-object) on a port of their own, on the same
    # host; 0 = an ephemeral port, None = off. The HTTP API serves them too. Unless given, it
    # follows ``http_port``: off when the HTTP API is off, ephemeral when it is ephemeral
    # (``BrokerConfig(port=0, http_port=0)`` binds no fixed port), RabbitMQ's 15692 otherwise.
    metrics_port: int | None = attrs.field(
        default=attrs.Factory(_follow_http_port, takes_self=True),
        validator=_port,
    )
    # The Kafka listener (Kafka clients on the same streams): on the same host; 0 = an
    # ephemeral port, None = off. Unless given, ephemeral when ``port`` is, else 9092.
    kafka_port: int | None = attrs.field(
        default=attrs.Factory(_follow_amqp_port, takes_self=True),
        validator=_port,
    )
    # The Kafka listener over TLS (Kafka's SSL and SASL_SSL), with the ``[tls]`` certificate,
    # when there is one: 0 = an ephemeral port, None = off. Unless given, ephemeral when
    # ``port`` is, else 9093.
    kafka_tls_port: int | None = attrs.field(
        default=attrs.Factory(_follow_amqp_port_tls, takes_self=True),
        validator=_port,
    )
    # The largest Kafka request (its size prefix; Kafka's socket.request.max.bytes): a larger
    # one closes the connection.
    kafka_max_request_bytes: int = attrs.field(default=100 * 1024 * 1024, validator=_between(1024))
    # The address the Kafka listener gives clients in Metadata and FindCoordinator, "host:port"
    # (Kafka's advertised.listeners: behind a proxy or NAT); None: the address each client
    # connected to.
    kafka_advertised_address: str | None = attrs.field(default=None, validator=_host_port)
    # A definitions file (RabbitMQ's JSON schema) imported at boot, as RabbitMQ's
    # load_definitions: what it declares is created if missing.
    load_definitions: Path | None = attrs.field(
        default=None, converter=attrs.converters.optional(Path)
    )
    # Logging (logsetup.py): the level (any case), "text" or "json" lines, stderr or a file
    # (reopened when logrotate moves it; or rotated by the broker when log_max_bytes > 0, keeping
    # log_backups old files), and the HTTP API's access log (off by default).
    log_level: str = attrs.field(default="INFO", converter=_upper, validator=_one_of(LOG_LEVELS))
    log_format: str = attrs.field(default="text", validator=_one_of(LOG_FORMATS))
    log_file: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    log_max_bytes: int = attrs.field(default=0, validator=_between(0))
    log_backups: int = attrs.field(default=5, validator=_between(0, 1000))
    http_access_log: bool = False
    # TLS (amqps, HTTPS): the ``[tls]`` table.
    tls: TlsConfig = attrs.field(factory=TlsConfig)
    # The HTTP server's limits (server/http/limits.py): open connections (over it, 503 and
    # closed), seconds to send a complete request head (after connecting or after a response),
    # seconds for a request body (plus one per 64 KiB received; then 408).
    http_max_connections: int = attrs.field(default=1000, validator=_between(1))
    http_idle_timeout: float = attrs.field(default=5.0, validator=_between(0.001))
    http_body_timeout: float = attrs.field(default=30.0, validator=_between(0.001))
    # A cluster (docs/cluster.md): etcd's client URLs (none: one node on its own), this node's
    # id (None: the data directory's, new on first start), the host other nodes and clients
    # reach it on (None: ``host``), the node-to-node link's port (RabbitMQ's 25672; 0 =
    # ephemeral) and the port other nodes reach it on (None: the same; another when a proxy
    # or NAT is in between, Kafka's advertised listener), the cluster's key prefix in etcd and
    # the node's lease TTL in seconds.
    cluster_etcd: tuple[str, ...] = ()
    node_id: str | None = None
    advertise: str | None = None
    peer_port: int = attrs.field(default=25672, validator=_port)
    advertise_peer_port: int | None = attrs.field(
        default=None, validator=attrs.validators.optional(_port)
    )
    cluster_prefix: str = attrs.field(default="/tqbroker", validator=_not_empty)
    cluster_lease_ttl: int = attrs.field(default=10, validator=_between(2, 3600))
    # Where the controller puts new partitions' leaders: ``spread`` over the nodes, or
    # ``colocate`` on one (the controller's setting applies: give every node the same).
    cluster_placement: str = attrs.field(default="spread", validator=_one_of(PLACEMENTS))
    # Every this many seconds the controller gives leadership back to preferred replicas
    # (Kafka's automatic preferred leader election; 0: never).
    cluster_leader_rebalance_interval: int = attrs.field(default=300, validator=_between(0))


class ConfigError(Exception):
    """A configuration file that cannot be used; the message says where and why."""


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(Path, lambda value, _type: Path(value))
_converter.register_structure_hook(float | str, lambda value, _type: _limit_value(value))
_converter.register_structure_hook(int, lambda value, _type: _number(value, int))
_converter.register_structure_hook(float, lambda value, _type: _number(value, float))
_converter.register_structure_hook(bool, lambda value, _type: _boolean(value))


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _number(value: object, type_: type[Any]) -> Any:
    """An int or float as the file writes it: no strings, booleans, or floats for ints."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected {type_.__name__}, got {value!r}")
    if type_ is int and not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return type_(value)


def off_form(key: str, value: object) -> object:
    """The file's (or an environment variable's) "off" for the keys that have one: None."""
    if key in OFF_KEYS and (value is False or (isinstance(value, str) and value.lower() == "off")):
        return None
    return value


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
    raw = {key: off_form(key, value) for key, value in raw.items()}
    tls = overrides.pop("tls", None)
    raw.update(overrides)
    if isinstance(tls, Mapping):  # flags and variables over the file's [tls] keys
        table = raw.get("tls")
        raw["tls"] = {**(table if isinstance(table, Mapping) else {}), **tls}
    if "users" in raw:
        raw["users"] = tuple(raw["users"])
    try:
        return _converter.structure(raw, BrokerConfig)
    except (cattrs.BaseValidationError, ValueError, TypeError) as exc:
        raise ConfigError(f"invalid configuration in {path}: {describe(exc)}") from None


def describe(exc: Exception) -> str:
    """One line from cattrs' error tree (every problem, with where) or a plain error."""
    if isinstance(exc, cattrs.BaseValidationError):
        return "; ".join(
            line.removesuffix(" @ $")
            for line in cattrs.transform_error(exc, format_exception=_format_exception)
        )
    return str(exc)


def _format_exception(exc: BaseException, type_: type | None) -> str:
    """A validator's message as it is (it names the key); cattrs' wording for the others."""
    if isinstance(exc, SettingError):
        return str(exc)
    return format_exception(exc, type_)
