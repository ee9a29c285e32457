"""Logging as the operator chose it (``log_level``, ``log_format``, ``log_file``).

- ``text``: ``2026-11-26 22:38:58,948 INFO tqbroker.server.connection: accepting AMQP
  connection ...``, as the broker always printed;
- ``json``: one object per line (python-json-logger) with ``time``, ``level``, ``logger``,
  ``message`` and the structured fields a line carries (``extra=``: ``user``, ``vhost``,
  ``peer``...), for log shippers;
- a file: a ``WatchedFileHandler`` by default. logrotate (or any tool) renames the file and
  the broker reopens it on its next line: no ``copytruncate`` (which loses lines), no signal to
  send, no two rotators fighting over one file. With ``log_max_bytes`` > 0 the broker rotates
  the file itself instead (``RotatingFileHandler``, ``log_backups`` old files), for hosts
  without logrotate. SIGHUP (a ``postrotate`` habit) reopens the file rather than stopping
  the broker.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys

from .config import BrokerConfig

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# hypercorn's access-log atoms: client, request line, status, bytes, seconds, user agent.
ACCESS_LOG_FORMAT = '%(h)s "%(r)s" %(s)s %(b)s %(L)ss "%(a)s"'
ACCESS_LOGGER = "tqbroker.http.access"
# Libraries whose INFO lines are per request (the etcd client's httpx: several a second).
CHATTY = ("httpx", "httpcore")


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        from pythonjsonlogger.json import JsonFormatter  # imported only when wanted

        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )
    return logging.Formatter(TEXT_FORMAT)


def handler(config: BrokerConfig) -> logging.Handler:
    """Where the lines go: stderr, or ``log_file`` (``OSError`` if it cannot be opened)."""
    if config.log_file is None:
        return logging.StreamHandler(sys.stderr)
    if config.log_max_bytes > 0:
        return logging.handlers.RotatingFileHandler(
            config.log_file,
            maxBytes=config.log_max_bytes,
            backupCount=config.log_backups,
            encoding="utf-8",
        )
    return logging.handlers.WatchedFileHandler(config.log_file, encoding="utf-8")


def configure_logging(config: BrokerConfig) -> None:
    """Replace the root logger's handlers with the one ``config`` asks for."""
    chosen = handler(config)
    chosen.setFormatter(formatter(config.log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(chosen)
    root.setLevel(config.log_level)
    quiet = max(logging.WARNING, root.level)
    for name in CHATTY:
        logging.getLogger(name).setLevel(quiet)


def reopen_log_file() -> None:
    """SIGHUP: reopen the log file now (a ``postrotate`` script may send it; the watched file
    is reopened on the next line anyway) and say so."""
    for chosen in logging.getLogger().handlers:
        if isinstance(chosen, logging.handlers.WatchedFileHandler):
            chosen.reopenIfNeeded()
    logging.getLogger("tqbroker").info("received SIGHUP: log file reopened")
