"""The options of ``[auth_backend_options.http]`` checked, each error one line naming the
option (the broker prints it and does not start), and the TLS context of ``ssl_options``."""

from __future__ import annotations

import math
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import certifi

from .contract import redact_url


def number_option(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    """``value`` as a float at least (``strict``: over) ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{name} must be a number, not {value!r}")
    if value < minimum or (strict and value == minimum):
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be {relation} {minimum:g}, not {value!r}")
    return float(value)


def url_option(name: str, value: Any) -> str:
    """``value``, an http:// or https:// URL with a host."""
    if not isinstance(value, str) or urlsplit(value).scheme not in ("http", "https"):
        raise ValueError(f"{name} must be an http:// or https:// URL, not {value!r}")
    if not urlsplit(value).hostname:
        raise ValueError(f"{name} has no host: {redact_url(value)!r}")
    return value


SSL_OPTIONS = frozenset({"cacertfile", "certfile", "keyfile"})


def tls_context(options: Any) -> ssl.SSLContext:
    """The client TLS context of RabbitMQ's ``ssl_options`` (``cacertfile``: the CAs that sign
    the service's certificate, certifi's bundle by default; ``certfile`` and ``keyfile``: a
    client certificate). The service's certificate and host name are always verified."""
    if not isinstance(options, Mapping) or not set(options) <= SSL_OPTIONS:
        known = ", ".join(sorted(SSL_OPTIONS))
        raise ValueError(f"ssl_options must be a table of {known}, not {options!r}")
    for key, value in options.items():
        if not isinstance(value, str):
            raise ValueError(f"ssl_options.{key} must be a file name, not {value!r}")
    if "keyfile" in options and "certfile" not in options:
        raise ValueError("ssl_options.keyfile needs ssl_options.certfile")
    try:
        context = ssl.create_default_context(cafile=options.get("cacertfile", certifi.where()))
        if "certfile" in options:
            context.load_cert_chain(options["certfile"], options.get("keyfile"))
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl_options: {exc}") from None
    return context
