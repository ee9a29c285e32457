"""Authentication and authorization by an HTTP service for tqbroker: RabbitMQ's
``rabbitmq_auth_backend_http`` contract (``user_path``, ``vhost_path``, ``resource_path``,
``topic_path``; plain-text ``allow [tags]`` / ``deny`` answers) with a cache of answers.

Registered under the entry-point group ``tqbroker.auth_backends`` as ``http``: list it in the
broker's ``auth_backends`` and give its options in ``[auth_backend_options.http]``.
``contract.py`` is the sans-IO half (requests, answers, cache); ``backend.py`` the client;
``options.py`` checks the options; ``logtext.py`` keeps passwords out of log lines and errors.
"""

from __future__ import annotations

from .backend import HttpAuthBackend
from .contract import Answer, AnswerCache, BadAnswer, Query, parse_answer

__all__ = ["Answer", "AnswerCache", "BadAnswer", "HttpAuthBackend", "Query", "parse_answer"]
