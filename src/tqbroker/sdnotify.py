"""systemd's readiness protocol (``Type=notify``): ``READY=1`` once the broker listens,
``STOPPING=1`` when it shuts down, sent as a datagram to ``$NOTIFY_SOCKET``.

A few lines of socket code rather than the ``sdnotify`` package: the protocol is one datagram,
the package swallows every error silently (we log one line), and it is one dependency less.
A name starting with ``@`` is an abstract socket (a leading NUL byte), as systemd writes it.
Without ``$NOTIFY_SOCKET`` (not under systemd) nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str) -> bool:
    """Send ``state`` (``"READY=1"``, ``"STOPPING=1"``, newline-separated assignments) to the
    service manager; whether it was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    if not address.startswith(("/", "\0")):
        log.warning("cannot notify systemd: unsupported NOTIFY_SOCKET %r", address)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("cannot notify systemd through %s: %s", address.lstrip("\0"), exc)
        return False
    return True
