"""What the backend's log lines and errors may say: never a password.

- httpx logs each request at INFO with its whole URL: ``REQUEST_LINES``, a filter on the
  ``httpx`` logger, shows the query of a request to one of the service's paths (a GET's
  fields, the password among them) as ``?redacted``;
- ``scrub`` masks a query's password in any text (a client error, a deny reason);
- ``describe`` names an httpx error by its first cause that has words;
- ``subject`` says what was asked (``user 'alice'``, ``read access to queue 'q' ...``).
"""

from __future__ import annotations

import logging
from urllib.parse import quote, quote_plus

import httpx

from .contract import Query


class _HttpxRequestLines(logging.Filter):
    """httpx logs each request at INFO with its whole URL: for a GET to one of the service's
    paths the query (the password) is taken out of that line."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) > 1 and isinstance(args[1], httpx.URL):
            url = args[1]
            if url.query and str(url.copy_with(query=None)) in self.paths:
                record.args = (args[0], url.copy_with(query=b"redacted"), *args[2:])
        return True


REQUEST_LINES = _HttpxRequestLines()
logging.getLogger("httpx").addFilter(REQUEST_LINES)


def describe(exc: BaseException) -> str:
    """``ConnectError: <why>``; the words of the first cause that has some when the error has
    none (httpx on Trio wraps an ``ssl.SSLCertVerificationError`` in text-less errors)."""
    inner: BaseException | None = exc
    for _ in range(8):
        if inner is None or str(inner):
            break
        inner = inner.__cause__ or inner.__context__
    if inner is None or not str(inner):
        return type(exc).__name__
    if inner is exc:
        return f"{type(exc).__name__}: {exc}"
    return f"{type(exc).__name__}: {type(inner).__name__}: {inner}"


def subject(query: Query) -> str:
    fields = dict(query.fields)
    user = fields.get("username", "")[:200]
    if query.path == "user_path":
        return f"user '{user}'"
    if query.path == "vhost_path":
        return f"access to vhost '{fields['vhost']}' for user '{user}'"
    return (
        f"{fields['permission']} access to {fields['resource']} '{fields['name']}' in vhost "
        f"'{fields['vhost']}' for user '{user}'"
    )


def scrub(text: str, query: Query) -> str:
    """``text`` with the query's password (as sent, or percent-encoded) masked."""
    for key, value in query.fields:
        if key == "password" and value:
            forms = {value, quote_plus(value), quote(value), quote(value, safe="")}
            for form in sorted(forms, key=len, reverse=True):
                text = text.replace(form, "***")
    return text
