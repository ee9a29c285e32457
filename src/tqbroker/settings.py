"""Where the effective configuration comes from, and what it looks like.

Responsibilities:
- layers, lowest first: the embedded defaults, the TOML file, ``TQBROKER_<KEY>`` environment
  variables (the attribute name in upper case: ``TQBROKER_PORT``, ``TQBROKER_HTTP_PORT=off``), the
  command-line flags. A value from an environment variable or a flag is parsed from text and
  range-checked on its own, so its error names where it came from (``--port: ...``,
  ``TQBROKER_PORT: ...``); ``users`` and ``backend_options`` (tables) come from the file only;
  the ``[tls]`` table's keys are ``tls_<key>`` settings (``TQBROKER_TLS_PORT``, ``--tls-port``),
  each over the file's key of the same name;
- backend options checked at configuration time by constructing the backend's class with them:
  ``fsync = "sometimes"`` in ``[backend_options.log]`` is a configuration error naming
  ``backend_options.log.fsync``, not a plugin that failed to load;
- ``to_toml``: the effective configuration as TOML (``--print-config``), passwords redacted.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, cast

import attrs

from .config import OFF_KEYS, BrokerConfig, ConfigError, SettingError, TlsConfig, load_config

ENV_PREFIX = "TQBROKER_"
# Tables: from the file only.
FILE_ONLY = ("users", "backend_options", "auth_backend_options")
# The [tls] table's keys, as settings: ``tls_port`` is ``port`` in [tls].
TLS_PREFIX = "tls_"
REDACTED = "<redacted>"
_SECRET = re.compile(r"password|secret|token", re.IGNORECASE)
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/:@\s]*:)[^/@\s]*@", re.IGNORECASE)
_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


@functools.cache
def _fields() -> dict[str, attrs.Attribute[Any]]:
    attrs.resolve_types(BrokerConfig)
    attrs.resolve_types(TlsConfig)
    found = {a.name: a for a in attrs.fields(BrokerConfig) if a.name not in (*FILE_ONLY, "tls")}
    found.update({TLS_PREFIX + a.name: a for a in attrs.fields(TlsConfig)})
    return found


def parse_setting(key: str, text: str, source: str) -> object:
    """The value of setting ``key`` written as ``text`` (an environment variable, a flag),
    converted and range-checked; a ``SettingError`` names ``source``."""
    field = _fields()[key]
    try:
        value = _parse(key, field.type, text.strip())
        if field.converter is not None and value is not None:
            value = cast(Callable[[object], object], field.converter)(value)
        if field.validator is not None:
            field.validator(None, field, value)
    except ValueError as exc:
        reason = exc.reason if isinstance(exc, SettingError) else str(exc)
        raise SettingError(source, reason.removeprefix(f"{key}: ")) from None
    return value


def _parse(key: str, type_: object, text: str) -> object:
    if key in OFF_KEYS and text.lower() == "off":
        return None
    if type_ == Path | None and not text:
        return None  # TQBROKER_LOG_FILE= : not set
    if type_ in (int, int | None):
        try:
            return int(text, 10)
        except ValueError:
            off = ' or "off"' if key in OFF_KEYS else ""
            raise ValueError(f"must be an integer{off} (got {text!r})") from None
    if type_ is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"must be a number (got {text!r})") from None
    if type_ is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"must be true or false (got {text!r})")
    if type_ == tuple[str, ...]:
        return tuple(part.strip() for part in text.split(",") if part.strip())
    return text  # str, Path, a limit (float | str): the converter or validator reads it


def environment_settings(environ: Mapping[str, str]) -> dict[str, object]:
    """The settings given as ``TQBROKER_<KEY>`` variables (other ``TQBROKER_*`` variables, such
    as the test suite's, are not settings and are left alone)."""
    for key in FILE_ONLY:
        if ENV_PREFIX + key.upper() in environ:
            raise SettingError(ENV_PREFIX + key.upper(), f"{key} come from the config file only")
    return {
        key: parse_setting(key, environ[ENV_PREFIX + key.upper()], ENV_PREFIX + key.upper())
        for key in _fields()
        if ENV_PREFIX + key.upper() in environ
    }


def resolve(
    path: Path | None,
    environ: Mapping[str, str],
    flags: Mapping[str, object],
    backend_flags: Mapping[str, Mapping[str, object]] | None = None,
) -> BrokerConfig:
    """The effective configuration: ``flags`` (already parsed) over ``environ`` over the file
    over the defaults; ``backend_flags`` over the file's options of each backend (``--fsync``).
    Raises ``SettingError`` (a bad variable or flag) or ``ConfigError``."""
    overrides: dict[str, Any] = {**environment_settings(environ), **flags}
    tls = {
        key.removeprefix(TLS_PREFIX): overrides.pop(key)
        for key in list(overrides)
        if key.startswith(TLS_PREFIX)
    }
    if path:
        config = load_config(path, **overrides, **({"tls": tls} if tls else {}))
    else:
        config = BrokerConfig(**overrides, tls=TlsConfig(**tls))
    if backend_flags:
        options = {name: dict(values) for name, values in config.backend_options.items()}
        for name, values in backend_flags.items():
            options.setdefault(name, {}).update(values)
        config = attrs.evolve(config, backend_options=options)
    check_backend_options(config.backend_options)
    return config


def check_backend_options(options: Mapping[str, object]) -> None:
    """Construct each installed backend's class with its options, so a bad option is a
    configuration error naming ``backend_options.<backend>.<option>``. A backend that is not
    installed, or does not import, is left to the broker's start (which says so)."""
    installed = {ep.name: ep for ep in entry_points(group="tqbroker.backends")}
    for name, values in options.items():
        where = f"backend_options.{name}"
        if not isinstance(values, Mapping):
            raise ConfigError(f"{where}: must be a table of options (got {values!r})")
        if name not in installed:
            continue
        try:
            backend = installed[name].load()
        except Exception:  # the broker's start reports a backend that does not load
            continue
        if isinstance(backend, type):
            _construct(backend, where, dict(values))


def _construct(backend: type, where: str, values: dict[str, Any]) -> None:
    try:
        backend(**values)
    except (TypeError, ValueError) as exc:
        error: Exception = exc
    else:
        return
    known = _parameters(backend)
    for key in values:
        if known is not None and key not in known:
            takes = ", ".join(known) or "no options"
            raise ConfigError(f"{where}.{key}: unknown option (the backend takes {takes})")
    for key, value in values.items():
        try:
            backend(**{key: value})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}.{key}: {exc}") from None
    raise ConfigError(f"{where}: {error}")


def _parameters(backend: type) -> list[str] | None:
    """The keyword options ``backend`` takes (None if it takes any: ``**kwargs``)."""
    try:
        parameters = inspect.signature(backend).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def to_toml(config: BrokerConfig) -> str:
    """``config`` as a TOML file ``load_config`` reads back to the same configuration, except
    that passwords (and options named like secrets) are redacted. None is ``"off"`` for the
    keys that have an off form, and left out (a comment) for the others."""
    lines = ["# tqbroker: the effective configuration (file, TQBROKER_* variables, flags)"]
    for field in attrs.fields(BrokerConfig):
        value = getattr(config, field.name)
        if field.name in (*FILE_ONLY, "tls"):
            continue
        if value is None and field.name not in OFF_KEYS:
            lines.append(f"# {field.name}: not set")
            continue
        lines.append(f"{field.name} = {_value('off' if value is None else value)}")
    lines += ["", "[tls]"]
    for field in attrs.fields(TlsConfig):
        value = getattr(config.tls, field.name)
        lines.append(
            f"# {field.name}: not set" if value is None else f"{field.name} = {_value(value)}"
        )
    for user in config.users:
        lines += ["", "[[users]]"]
        for field in attrs.fields(type(user)):
            value = getattr(user, field.name)
            if field.name == "permissions":
                value = {vhost: attrs.asdict(p) for vhost, p in value.items()}
            if value is not None:
                shown = REDACTED if field.name in ("password", "password_hash") else value
                lines.append(f"{field.name} = {_value(shown)}")
    for section in ("backend_options", "auth_backend_options"):
        for name, options in getattr(config, section).items():
            lines += ["", f"[{section}.{_key(name)}]"]
            lines += [f"{_key(k)} = {_value(_redact(k, v))}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def _redact(key: str, value: object) -> object:
    """A secret-named option's value redacted, and the password of a URL (``http://u:p@h``)."""
    if _SECRET.search(key):
        return REDACTED
    if isinstance(value, str):
        return _URL_PASSWORD.sub(rf"\1{REDACTED}@", value)
    return value


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = (f"{_key(k)} = {_value(_redact(k, v))}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    return json.dumps(str(value))
