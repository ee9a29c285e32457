"""Shared test fixtures. The broker fixtures come from tqbroker's pytest plugin
(``tqbroker_broker`` for Trio tests, ``tqbroker_thread`` for synchronous clients)."""
