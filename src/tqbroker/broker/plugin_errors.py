"""Failures of third-party code (exchange types, storage backends) as AMQP errors.

Every call the broker makes into a plugin (a router's ``route``/``bind``/``unbind``, an exchange
type's ``validate``/``create_router``, a backend's ``open_*``/``delete_queue``) is wrapped: an
unexpected exception is logged with its traceback and becomes a 541 INTERNAL_ERROR that closes the
channel that caused the call, naming the plugin and the distribution that installs it. The
connection, the broker and every other client go on.
"""

from __future__ import annotations

import logging

from ..plugins.loader import BACKENDS_GROUP, EXCHANGE_TYPES_GROUP, distributions
from ..protocol.errors import AMQPError, ReplyCode

log = logging.getLogger(__name__)


def exchange_type_failed(
    exc: Exception, *, type_name: str, call: str, exchange: str, vhost: str
) -> AMQPError:
    """Log a failure of exchange type ``type_name`` in ``call``; the error for the client."""
    return _failed(
        exc,
        f"exchange type {type_name!r}",
        distributions(EXCHANGE_TYPES_GROUP).get(type_name, "unknown"),
        f"{call} for exchange '{exchange}' in vhost '{vhost}'",
    )


def backend_failed(exc: Exception, *, backend: str, call: str, queue: str, vhost: str) -> AMQPError:
    """Log a failure of storage backend ``backend`` in ``call``; the error for the client."""
    return _failed(
        exc,
        f"storage backend {backend!r}",
        distributions(BACKENDS_GROUP).get(backend, "unknown"),
        f"{call} for queue '{queue}' in vhost '{vhost}'",
    )


def _failed(exc: Exception, plugin: str, distribution: str, doing: str) -> AMQPError:
    log.error(
        "%s (from %s) failed in %s",
        plugin,
        distribution,
        doing,
        exc_info=(type(exc), exc, exc.__traceback__),
    )
    return AMQPError(
        ReplyCode.INTERNAL_ERROR,
        f"{plugin} (from {distribution}) failed in {doing}: {type(exc).__name__}: {exc}",
        hard=False,  # the channel that made the call closes; its connection goes on
    )
