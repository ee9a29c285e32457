"""Broker state: virtual hosts, exchanges, bindings, queues and their actors, consumers."""
