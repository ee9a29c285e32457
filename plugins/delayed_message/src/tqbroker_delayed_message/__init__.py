"""Delayed delivery for tqbroker: the ``x-delayed-message`` exchange type, compatible with
RabbitMQ's rabbitmq-delayed-message-exchange plugin.

Registered under the entry-point group ``tqbroker.exchange_types`` as ``x-delayed-message``.
Declare an exchange of that type with the argument ``x-delayed-type`` (the routing it has:
``direct``, ``topic``, ...) and publish with the header ``x-delay`` (milliseconds).
``exchange.py`` has the details and what is mirrored from RabbitMQ.
"""

from __future__ import annotations

from .exchange import DelayedMessageExchange, DelayedMessages, DelayedRouter, parse_delay

__all__ = ["DelayedMessageExchange", "DelayedMessages", "DelayedRouter", "parse_delay"]
