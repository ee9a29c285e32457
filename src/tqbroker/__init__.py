"""tqbroker: an AMQP 0-9-1 message broker on Trio.

The public API::

    import trio, tqbroker

    async def main():
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(tqbroker.serve, tqbroker.BrokerConfig(port=0))
            ...
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import BrokerConfig as BrokerConfig
from .config import UserConfig as UserConfig
from .model import Message as Message
from .server.listener import serve as serve

__all__ = ["BrokerConfig", "Message", "UserConfig", "__version__", "serve"]
