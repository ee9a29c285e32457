"""Routing plugins: the ``ExchangeType`` protocol, its loader and the built-in exchange types."""
