"""tqbroker: an AMQP 0-9-1 message broker on Trio.

The public API::

    import trio, tqbroker

    async def main():
        async with trio.open_nursery() as nursery:
            listening = await nursery.start(
                tqbroker.serve, tqbroker.BrokerConfig(port=0, http_port=0)
            )
            host, port = listening.amqp[0]  # and the HTTP API at listening.http[0]
            ...

``port=0, http_port=0``: every port ephemeral (the metrics port follows ``http_port``). A data
directory (``data_dir``, ``./tqbroker-data`` by default) serves one broker at a time: on one in
use ``serve`` raises ``DataDirInUse``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .config import BrokerConfig as BrokerConfig
from .config import UserConfig as UserConfig
from .dirlock import DataDirInUse as DataDirInUse
from .model import Message as Message

if TYPE_CHECKING:
    from .server.listener import serve as serve

__all__ = ["BrokerConfig", "DataDirInUse", "Message", "UserConfig", "__version__", "serve"]


def __getattr__(name: str) -> Any:
    # ``serve`` pulls in trio and the server; importing it lazily keeps ``import
    # tqbroker.protocol`` free of trio (the protocol package is sans-IO).
    if name == "serve":
        from .server.listener import serve

        return serve
    raise AttributeError(f"module 'tqbroker' has no attribute {name!r}")
