"""TLS for the listeners (``[tls]``, RabbitMQ's ``ssl_options``), with the stdlib ``ssl`` module.

Responsibilities:
- ``server_context``: an ``ssl.SSLContext`` from ``TlsConfig``: the certificate chain and key,
  TLS 1.2 at least, the ``ssl`` module's default ciphers, client certificates checked against
  ``cacertfile`` when ``verify_peer`` (required with ``fail_if_no_peer_cert``); a file that is
  missing, unreadable or not PEM, or a key that does not match, is a ``TlsError`` naming the key;
- ``ServerTls``: the contexts of a running broker. ``reload()`` (SIGHUP) reads the files again:
  connections accepted afterwards get the new certificate, open ones keep theirs; a reload that
  fails is logged and the old certificate stays. The AMQP listener takes ``amqp`` for each
  connection (a new context per reload); hypercorn holds its context for its whole life, so the
  HTTP contexts get the new chain loaded in place (a changed ``cacertfile`` is added to the HTTP
  ports' trusted CAs, not substituted: restart to drop a CA there);
- ``accept``: the server side of one amqps connection's TLS handshake, within a deadline, and
  the username its certificate gives (``certinfo.username_from_certificate``).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import trio

from ..config import TlsConfig
from .certinfo import username_from_certificate

log = logging.getLogger(__name__)


class TlsError(ValueError):
    """A TLS setting that cannot be used: one line, naming the key (``tls.certfile: ...``)."""


def _no_password() -> bytes:
    return b""  # an encrypted key fails to load rather than prompting on the terminal


def _check_readable(key: str, path: Path) -> None:
    try:
        with open(path, "rb") as file:
            file.read(1)
    except OSError as exc:
        raise TlsError(f"tls.{key}: cannot read {path}: {exc.strerror or exc}") from None


def server_context(config: TlsConfig, alpn: list[str] | None = None) -> ssl.SSLContext:
    """The server context ``config`` describes (``config.enabled`` must be true)."""
    if config.certfile is None or config.keyfile is None:
        raise TlsError("tls.certfile: not set")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # the ssl module's default ciphers
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, config.certfile, config.keyfile)
    if config.cacertfile is not None:
        _check_readable("cacertfile", config.cacertfile)
        try:
            context.load_verify_locations(cafile=config.cacertfile)
        except ssl.SSLError as exc:
            raise TlsError(
                f"tls.cacertfile: no PEM certificate in {config.cacertfile} ({_reason(exc)})"
            ) from None
    elif config.verify_peer:
        context.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    if config.verify_peer:
        context.verify_mode = (
            ssl.CERT_REQUIRED if config.fail_if_no_peer_cert else ssl.CERT_OPTIONAL
        )
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


def _load_chain(context: ssl.SSLContext, certfile: Path, keyfile: Path) -> None:
    _check_readable("certfile", certfile)
    _check_readable("keyfile", keyfile)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except ssl.SSLError as exc:
        reason = _reason(exc)
        if "KEY_VALUES_MISMATCH" in str(exc) or "mismatch" in reason:
            raise TlsError(
                f"tls.keyfile: {keyfile} is not the key of the certificate in {certfile}"
            ) from None
        raise TlsError(
            f"tls.certfile: cannot load the certificate {certfile} with the key {keyfile} "
            f"(PEM files, the key unencrypted): {reason}"
        ) from None


def _reason(exc: ssl.SSLError) -> str:
    if exc.reason == "PEM_LIB":
        return "not in PEM form"
    return str(exc.reason or "invalid").lower().replace("_", " ")


class ServerTls:
    """The TLS contexts of a running broker, reloadable (``reload``)."""

    def __init__(self, config: TlsConfig) -> None:
        self.config = config
        self.amqp = server_context(config)
        self._http: list[ssl.SSLContext] = []

    def http_context(self, alpn: list[str]) -> ssl.SSLContext:
        """A context for one hypercorn server (kept, to be reloaded in place)."""
        context = server_context(self.config, alpn)
        self._http.append(context)
        return context

    def reload(self) -> bool:
        """Read the certificate, key and CA files again; False (logged, nothing changed) if
        they cannot be used."""
        try:
            fresh = server_context(self.config)
            for context in self._http:
                _load_chain(context, self.config.certfile, self.config.keyfile)  # type: ignore[arg-type]
                if self.config.cacertfile is not None:
                    context.load_verify_locations(cafile=self.config.cacertfile)
        except (TlsError, ssl.SSLError) as exc:
            log.error("TLS certificate reload failed, keeping the current one: %s", exc)
            return False
        self.amqp = fresh
        log.info("TLS certificate reloaded from %s", self.config.certfile)
        return True

    async def accept(
        self, stream: trio.SocketStream, deadline: float, peer: str
    ) -> tuple[trio.SSLStream[trio.SocketStream], str | None] | None:
        """The TLS handshake of an accepted amqps connection by ``deadline``: the TLS stream
        and the user its client certificate names (None without a verified certificate), or
        None (logged in one line; the socket closed) if the handshake failed or timed out."""
        tls = trio.SSLStream(stream, self.amqp, server_side=True)
        with trio.move_on_at(deadline):
            try:
                await tls.do_handshake()
            except trio.BrokenResourceError as exc:
                log.warning("TLS handshake with %s failed: %s", peer, _why(exc))
                await trio.aclose_forcefully(stream)
                return None
            config = self.config
            cert = tls.getpeercert() if config.verify_peer else None
            username = username_from_certificate(
                cert,
                config.ssl_cert_login_from,
                config.ssl_cert_login_san_type,
                config.ssl_cert_login_san_index,
            )
            return tls, username
        log.warning("TLS handshake with %s timed out", peer)
        await trio.aclose_forcefully(stream)
        return None


def _why(exc: BaseException) -> str:
    """The TLS error under trio's BrokenResourceError, in a few words."""
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, ssl.SSLCertVerificationError) and cause.verify_message:
        return f"certificate verify failed: {cause.verify_message}"
    if isinstance(cause, ssl.SSLError):
        return cause.reason.lower().replace("_", " ") if cause.reason else str(cause)
    return str(cause or exc) or "the client hung up"
