"""Finding, loading and validating plugins from entry points.

Phases, as flake8 and pluggy do it: find the entry points of a group, load each (an import error
names the plugin and its distribution), then validate that what loaded implements the protocol.
A plugin that fails to load or validate is logged and skipped; it never stops the broker.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from ..backends.base import Backend
from .spec import ExchangeType

log = logging.getLogger(__name__)

EXCHANGE_TYPES_GROUP = "tqbroker.exchange_types"
BACKENDS_GROUP = "tqbroker.backends"

T = TypeVar("T")


class PluginError(Exception):
    """A plugin could not be loaded or does not implement its protocol."""


def _describe(ep: EntryPoint) -> str:
    dist = ep.dist.name if ep.dist is not None else "unknown distribution"
    return f"{ep.group} plugin {ep.name!r} ({ep.value}, from {dist})"


def load_entry_point(ep: EntryPoint, options: Mapping[str, Any] | None = None) -> object:
    """Import an entry point; instantiate it (with ``options``) when it names a class."""
    try:
        obj = ep.load()
    except Exception as exc:
        raise PluginError(f"cannot load {_describe(ep)}: {exc!r}") from exc
    if isinstance(obj, type):
        try:
            obj = obj(**(options or {}))
        except Exception as exc:
            raise PluginError(f"cannot instantiate {_describe(ep)}: {exc!r}") from exc
    return obj


def load_plugins(
    group: str, protocol: type[T], options: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, T]:
    """Every installed plugin of ``group`` that implements ``protocol`` (a runtime-checkable
    Protocol), by entry-point name; classes are instantiated with ``options[name]``."""
    found: dict[str, T] = {}
    for ep in entry_points(group=group):
        try:
            plugin = load_entry_point(ep, (options or {}).get(ep.name))
            if not isinstance(plugin, protocol):
                raise PluginError(f"{_describe(ep)} does not implement {protocol.__name__}")
        except PluginError as exc:
            log.error("%s; skipping it", exc)
            continue
        if ep.name in found:
            log.error(
                "%s: a plugin named %r is already loaded; skipping it", _describe(ep), ep.name
            )
            continue
        found[ep.name] = plugin
    return found


@functools.cache
def distributions(group: str) -> Mapping[str, str]:
    """The distribution (and version) that installs each plugin of ``group``, by name, whether
    or not it loads: error messages say what to reinstall or fix. Read once per process."""
    return {
        ep.name: f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown"
        for ep in entry_points(group=group)
    }


def load_exchange_types() -> dict[str, ExchangeType]:
    """Every installed exchange type, by name."""
    return load_plugins(EXCHANGE_TYPES_GROUP, ExchangeType)  # type: ignore[type-abstract]


def load_backends(options: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Backend]:
    """Every installed storage backend, by name, constructed with ``options[name]``."""
    return load_plugins(BACKENDS_GROUP, Backend, options)  # type: ignore[type-abstract]
