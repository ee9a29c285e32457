"""Kafka's topic config names over a stream topic's queue arguments, both ways: what the Kafka
listener's CreateTopics, DescribeConfigs and IncrementalAlterConfigs, the HTTP topic routes
(``PUT``/``PATCH /topics/{topic}``) and ``tqbroker-ctl topics create|alter --config`` take
and show.

| Kafka config | stream argument | value |
|---|---|---|
| ``retention.ms`` | ``x-max-age`` | ms, whole seconds (``"86400s"``); -1: none (the default) |
| ``retention.bytes`` | ``x-max-length-bytes`` | bytes; -1: none (the default) |
| ``segment.bytes`` | ``x-stream-max-segment-size-bytes`` | at least 1 MiB; 64 MiB by default |
| ``cleanup.policy`` | ``x-stream-cleanup-policy`` | ``delete`` (the default), ``compact``, both |
| ``max.message.bytes`` | ``x-stream-max-message-bytes`` | a Kafka producer's largest record |
| ``compression.type`` | ``x-stream-compression-type`` | ``producer`` (the default), ... |

A config set is its argument present; a config at its default is its argument absent (so
DescribeConfigs says DEFAULT_CONFIG or DYNAMIC_TOPIC_CONFIG by that). The defaults are what a
stream does without the argument, which is not always Kafka's (Kafka keeps 7 days and 1 MiB
records by default; a stream keeps everything and takes the broker's ``max_message_size``).

A name that is not one of these, or a value out of range, is ``InvalidConfig`` with Kafka's
words (``LogConfig.validateNames``: "Unknown topic config name: ...";
``ConfigDef``: "Invalid value ... for configuration ...: ..."), never stored and ignored; so is
a Kafka name given as a stream argument (``check_arguments``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

from ...protocol.codec import FieldTable, FieldValue
from ..arguments import COMPRESSION_TYPES, STREAM_ARGUMENT_NAMES, parse_interval
from .topics import InvalidRequest

# IncrementalAlterConfigs' operations (``AlterConfigOp.OpType``).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
LEAST_SEGMENT_BYTES: Final = 1024 * 1024  # the x-stream-max-segment-size-bytes check's
DEFAULT_SEGMENT_BYTES: Final = 64 * 1024 * 1024  # the built-in log's
CLEANUP_POLICIES: Final = ("delete", "compact")


class InvalidConfig(InvalidRequest):
    """An unknown config name or a value out of range (Kafka's ``INVALID_CONFIG``)."""


@attrs.frozen
class TopicConfig:
    """One Kafka topic config: its stream argument, its value when the argument is absent,
    and the conversions (``to_argument`` raises ``ValueError`` with the reason; None: the
    default, the argument left out)."""

    name: str
    argument: str
    default: str
    to_argument: Callable[[str], FieldValue]
    from_argument: Callable[[FieldValue], str]
    is_list: bool = False


@attrs.frozen
class ConfigValue:
    name: str
    value: str
    is_default: bool


def _long(value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ValueError("Not a number of type LONG") from None


def _retention_ms(value: str) -> FieldValue:
    ms = _long(value)
    if ms == -1:
        return None
    if ms < 1000 or ms % 1000:
        raise ValueError("-1 (no limit) or whole seconds (a stream's x-max-age counts seconds)")
    return f"{ms // 1000}s"


def _interval_ms(value: FieldValue) -> str:
    found = parse_interval(value) if isinstance(value, str) else None
    return str(found) if found is not None else "-1"


def _retention_bytes(value: str) -> FieldValue:
    found = _long(value)
    if found < -1:
        raise ValueError("Value must be at least -1")
    return None if found == -1 else found


def _segment_bytes(value: str) -> FieldValue:
    found = _long(value)
    if found < LEAST_SEGMENT_BYTES:
        raise ValueError(f"Value must be at least {LEAST_SEGMENT_BYTES}")
    return found


def _max_message_bytes(value: str) -> FieldValue:
    found = _long(value)
    if found < 0:
        raise ValueError("Value must be at least 0")
    return found


def _cleanup_policy(value: str) -> FieldValue:
    policies = _policies(value)
    for policy in policies:
        if policy not in CLEANUP_POLICIES:
            raise ValueError(f"String must be one of: {', '.join(CLEANUP_POLICIES)}")
    if not policies:
        raise ValueError("an empty list (delete, compact or both)")
    return ",".join(sorted(set(policies)))  # "compact", "delete" or "compact,delete"


def _policies(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _compression_type(value: str) -> FieldValue:
    if value not in COMPRESSION_TYPES:
        raise ValueError(f"String must be one of: {', '.join(COMPRESSION_TYPES)}")
    return value


def _text(value: FieldValue) -> str:
    return str(value)


CONFIGS: Final = (
    TopicConfig("retention.ms", "x-max-age", "-1", _retention_ms, _interval_ms),
    TopicConfig("retention.bytes", "x-max-length-bytes", "-1", _retention_bytes, _text),
    TopicConfig(
        "segment.bytes",
        "x-stream-max-segment-size-bytes",
        str(DEFAULT_SEGMENT_BYTES),
        _segment_bytes,
        _text,
    ),
    TopicConfig(
        "cleanup.policy", "x-stream-cleanup-policy", "delete", _cleanup_policy, _text, True
    ),
    TopicConfig("max.message.bytes", "x-stream-max-message-bytes", "", _max_message_bytes, _text),
    TopicConfig(
        "compression.type", "x-stream-compression-type", "producer", _compression_type, _text
    ),
)
BY_NAME: Final = {config.name: config for config in CONFIGS}
BY_ARGUMENT: Final = {config.argument: config for config in CONFIGS}


def config(name: str) -> TopicConfig:
    found = BY_NAME.get(name)
    if found is None:
        raise InvalidConfig(
            f"Unknown topic config name: {name} (known: {', '.join(sorted(BY_NAME))})"
        )
    return found


def _converted(found: TopicConfig, value: str) -> FieldValue:
    try:
        return found.to_argument(value)
    except ValueError as exc:
        raise InvalidConfig(
            f"Invalid value {value} for configuration {found.name}: {exc}"
        ) from None


def arguments_for(configs: Mapping[str, str | None]) -> FieldTable:
    """The stream arguments of a new topic's configs (None or a default: no argument)."""
    table: FieldTable = {}
    for name, value in configs.items():
        found = config(name)
        if value is None:
            continue
        converted = _converted(found, value)
        if converted is not None:
            table[found.argument] = converted
    return table


def altered(arguments: FieldTable, changes: Iterable[tuple[str, int, str | None]]) -> FieldTable:
    """``arguments`` with each (name, operation, value) applied, in order: SET, DELETE (back to
    the default), APPEND and SUBTRACT (list configs only: ``cleanup.policy``), as Kafka's
    ``ConfigAdminManager.prepareIncrementalConfigs``."""
    table = dict(arguments)
    for name, operation, value in changes:
        found = config(name)
        if operation == DELETE:
            table.pop(found.argument, None)
            continue
        if operation not in (SET, APPEND, SUBTRACT):
            raise InvalidRequest(f"Unknown operations type {operation}")
        if value is None:
            raise InvalidRequest(f"Null value not supported for : {name}")
        if operation != SET:
            if not found.is_list:
                verb = "append" if operation == APPEND else "subtract"
                raise InvalidConfig(f"Config value {verb} is not allowed for config key: {name}")
            current = _policies(str(table.get(found.argument, found.default)))
            given = _policies(value)
            if operation == APPEND:
                value = ",".join(current + [p for p in given if p not in current])
            else:
                value = ",".join(p for p in current if p not in given)
        converted = _converted(found, value)
        if converted is None:
            table.pop(found.argument, None)
        else:
            table[found.argument] = converted
    return table


def described(arguments: FieldTable, *, max_message_bytes: int) -> list[ConfigValue]:
    """Every config's value for a topic with ``arguments`` (``max_message_bytes``: the
    broker's limit, a stream's default)."""
    found = []
    for topic_config in CONFIGS:
        value = arguments.get(topic_config.argument)
        if value is None:
            default = topic_config.default or str(max_message_bytes)
            found.append(ConfigValue(topic_config.name, default, True))
        else:
            found.append(ConfigValue(topic_config.name, topic_config.from_argument(value), False))
    return found


def check_arguments(arguments: FieldTable) -> None:
    """Refuse what is not a stream argument (``InvalidConfig``): a Kafka config name (say
    which argument it is, and how to give it) or an unknown name."""
    for name in arguments:
        if name in STREAM_ARGUMENT_NAMES:
            continue
        if name in BY_NAME:
            raise InvalidConfig(
                f"'{name}' is a Kafka topic config, not a stream argument: give it as a config "
                f'("configs" in the body, tqbroker-ctl --config {name}=...), or as the stream '
                f"argument {BY_NAME[name].argument}"
            )
        raise InvalidConfig(
            f"unknown stream argument '{name}' (stream arguments: "
            f"{', '.join(sorted(STREAM_ARGUMENT_NAMES))}; Kafka configs: "
            f"{', '.join(sorted(BY_NAME))})"
        )
