"""Exchanges made by their exchange-type plugins.

Responsibilities:
- ``new_exchange``: an exchange of an installed type, without the AMQP checks and not yet
  registered: the type validates the arguments (406 for what it refuses) and creates the router;
  a router that holds messages (``HoldingRouter``) makes a ``HoldingExchange`` with its context
  (``plugins.spec.ExchangeContext``), opened here (406 for what it refuses, 506 when its storage
  cannot open).

Every call into an exchange type for a new exchange is made here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..plugins.spec import HoldingRouter
from ..protocol.codec import FieldTable
from ..protocol.errors import AMQPError, ReplyCode
from .exchange import Exchange
from .holding import BrokerExchangeContext, HoldingExchange
from .plugin_errors import exchange_type_failed

if TYPE_CHECKING:
    from .vhost import VirtualHost

log = logging.getLogger(__name__)


def new_exchange(
    vhost: VirtualHost,
    name: str,
    type_name: str,
    *,
    durable: bool,
    auto_delete: bool,
    internal: bool,
    arguments: FieldTable,
    store_backend: str | None = None,
    restoring: bool = False,
) -> Exchange:
    """A new exchange of ``vhost`` (``store_backend`` and ``restoring``: a holding exchange
    reopened at startup, where its store was)."""
    exchange_type = vhost.exchange_types[type_name]

    def failed(call: str, exc: Exception) -> AMQPError:
        return exchange_type_failed(
            exc, type_name=type_name, call=call, exchange=name, vhost=vhost.name
        )

    try:
        exchange_type.validate(arguments)
        router = exchange_type.create_router(arguments)
    except ValueError as exc:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED, str(exc)) from None
    except Exception as exc:
        raise failed("declare", exc) from exc
    holding = isinstance(router, HoldingRouter)
    exchange = (HoldingExchange if holding else Exchange)(
        name,
        type_name,
        router,
        vhost=vhost.name,
        durable=durable,
        auto_delete=auto_delete,
        internal=internal,
        arguments=arguments,
    )
    if not isinstance(exchange, HoldingExchange) or not isinstance(router, HoldingRouter):
        return exchange
    # An exchange type that holds messages: its router gets a context (plugins.spec).
    exchange.context = BrokerExchangeContext(
        vhost, exchange, spawn=vhost.spawn, store_backend=store_backend, restoring=restoring
    )
    try:
        router.open(exchange.context)
    except ValueError as exc:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED, str(exc)) from None
    except OSError as exc:
        raise AMQPError(
            ReplyCode.RESOURCE_ERROR,
            f"cannot open the storage of exchange '{name}' in vhost '{vhost.name}': {exc}",
        ) from None
    except Exception as exc:
        raise failed("open", exc) from exc
    return exchange
