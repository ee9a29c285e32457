"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side, sans-IO, as Kafka
speaks it (KIP-84): no channel binding (a ``n,,`` or ``n,a=authzid,`` GS2 header), user names
escaped as SASLnames (``=2C`` for a comma, ``=3D`` for ``=``), extensions after the nonce
(``tokenauth=true`` asks for a delegation token, which tqbroker does not issue; others are
ignored, as Kafka's ``ScramSaslServer`` ignores them).

- ``ScramCredential``: what the broker keeps of a password for one mechanism (salt, iteration
  count, StoredKey, ServerKey; never the password), made by ``credentials_for`` when a password
  is set through tqbroker, in JSON as a user's ``scram_credentials``;
- ``ScramServer``: one login's exchange. ``receive_client_first`` parses the client's first
  message and gives the user name; the caller looks up that user's credential and passes it to
  ``server_first``; ``receive_client_final`` checks the proof and answers the server-final
  message. A failure is a ``ScramError`` whose text a client may see (it never tells an
  unknown user from a wrong password).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
HASHES: Final = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}
# Kafka's default and its minimum for both mechanisms (``ScramMechanism``).
ITERATIONS: Final = 4096
SALT_BYTES: Final = 32
NONCE_BYTES: Final = 24

_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"  # RFC 5802's printable: no comma
_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\U0010ffff]|=2C|=3D)+"  # UTF-8, no , or =
_EXTENSIONS = r"(?:,[A-Za-z]+=[\x01-\x2b\x2d-\x7f]*)*"
_CLIENT_FIRST = re.compile(
    rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)"
    rf"(?P<bare>n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))"
)
_CLIENT_FINAL = re.compile(
    rf"(?P<without_proof>c=(?P<binding>[A-Za-z0-9+/=]*),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS})"
    r",p=(?P<proof>[A-Za-z0-9+/=]+)"
)


class ScramError(ValueError):
    """A refused SCRAM exchange; the text is for the client (it names no secret)."""


@attrs.frozen
class ScramCredential:
    """One mechanism's credential of a user (RFC 5802 section 3)."""

    mechanism: str
    salt: bytes = attrs.field(repr=False)
    iterations: int
    stored_key: bytes = attrs.field(repr=False)
    server_key: bytes = attrs.field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, mechanism: str, entry: object) -> ScramCredential:
        """ValueError for an unknown mechanism or an entry that is not one."""
        if mechanism not in HASHES:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        if not isinstance(entry, dict):
            raise ValueError(f"{mechanism}: not an object")
        iterations = entry.get("iterations")
        if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < 1:
            raise ValueError(f"{mechanism}: iterations must be a positive integer")
        try:
            salt, stored, server = (
                base64.b64decode(entry[key], validate=True)
                for key in ("salt", "stored_key", "server_key")
            )
        except (KeyError, TypeError, binascii.Error):
            raise ValueError(f"{mechanism}: salt, stored_key and server_key in base64") from None
        size = hashlib.new(HASHES[mechanism]).digest_size
        if len(stored) != size or len(server) != size:
            raise ValueError(f"{mechanism}: stored_key and server_key are {size}-byte digests")
        return cls(mechanism, salt, iterations, stored, server)


def credential_for(
    mechanism: str, password: str, salt: bytes | None = None, iterations: int = ITERATIONS
) -> ScramCredential:
    """The credential of ``password`` for ``mechanism`` (a fresh random salt unless given)."""
    name = HASHES[mechanism]
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(name, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", name)
    server_key = hmac.digest(salted, b"Server Key", name)
    return ScramCredential(
        mechanism, salt, iterations, hashlib.new(name, client_key).digest(), server_key
    )


def credentials_for(password: str) -> tuple[ScramCredential, ...]:
    """``password``'s credentials for both mechanisms (what a user set through tqbroker has)."""
    return tuple(credential_for(mechanism, password) for mechanism in HASHES)


def credentials_json(credentials: Iterable[ScramCredential]) -> dict[str, Any]:
    """A user's ``scram_credentials``: by mechanism."""
    return {c.mechanism: c.to_json() for c in credentials}


def parse_credentials(value: object) -> tuple[ScramCredential, ...]:
    """A user's ``scram_credentials`` read back; ValueError if malformed."""
    if not isinstance(value, Mapping):
        raise ValueError("scram_credentials must map mechanisms to credentials")
    return tuple(ScramCredential.from_json(str(m), entry) for m, entry in sorted(value.items()))


def username_of(saslname: str) -> str:
    """A SASLname unescaped (``=2C`` is a comma, ``=3D`` is ``=``; RFC 5802 section 5.1)."""
    return saslname.replace("=2C", ",").replace("=3D", "=")


def saslname_of(username: str) -> str:
    """A user name as a SASLname (what a client sends)."""
    return username.replace("=", "=3D").replace(",", "=2C")


@attrs.frozen
class ClientFirst:
    """What the client's first message gives: the user and the extensions it asked for."""

    username: str
    extensions: Mapping[str, str]


class ScramServer:
    """One SCRAM login, from the client's first message to the server's final one."""

    def __init__(self, mechanism: str, nonce: str | None = None) -> None:
        if mechanism not in HASHES:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        self.mechanism = mechanism
        self._hash = HASHES[mechanism]
        self._server_nonce = nonce or base64.urlsafe_b64encode(os.urandom(NONCE_BYTES)).decode()
        self._gs2 = self._bare = self._nonce = self._server_first = ""
        self._credential: ScramCredential | None = None
        self._state = "client-first"
        self.username: str | None = None  # once the client's first message named it
        self.done = False  # the proof checked out

    def _expect(self, state: str) -> None:
        if self._state != state:
            self._state = "failed"
            raise ScramError(f"unexpected SCRAM message (expected the {state} message)")

    def receive_client_first(self, message: bytes) -> ClientFirst:
        self._expect("client-first")
        self._state = "failed"
        matched = _CLIENT_FIRST.fullmatch(_text(message))
        if matched is None:
            raise ScramError("invalid SCRAM client-first message")
        username = username_of(matched["saslname"])
        authzid = matched["authzid"]
        if authzid is not None and username_of(authzid) != username:
            raise ScramError("an authorization id other than the user name is not allowed")
        extensions = dict(part.split("=", 1) for part in matched["extensions"].split(",") if part)
        if extensions.get("tokenauth", "").lower() == "true":
            raise ScramError("delegation tokens are not supported")
        self._gs2, self._bare, self._nonce = matched["gs2"], matched["bare"], matched["nonce"]
        self.username = username
        self._state = "credential"
        return ClientFirst(username, extensions)

    def server_first(self, credential: ScramCredential) -> bytes:
        """The server-first message, for the user's ``credential`` of this mechanism."""
        self._expect("credential")
        if credential.mechanism != self.mechanism:
            self._state = "failed"
            raise ValueError(f"a {credential.mechanism} credential for {self.mechanism}")
        self._credential = credential
        self._server_first = (
            f"r={self._nonce}{self._server_nonce},s={_b64(credential.salt)},"
            f"i={credential.iterations}"
        )
        self._state = "client-final"
        return self._server_first.encode()

    def receive_client_final(self, message: bytes) -> bytes:
        """The server-final message (the server's signature) once the proof checks out."""
        self._expect("client-final")
        self._state = "failed"
        credential = self._credential
        assert credential is not None
        matched = _CLIENT_FINAL.fullmatch(_text(message))
        if matched is None:
            raise ScramError("invalid SCRAM client-final message")
        # Ending with the server-first nonce, as Kafka's ScramSaslServer checks it
        # (``clientFinalMessage.nonce().endsWith(serverFirstMessage.nonce())``): librdkafka
        # 2.0.2, Debian's, sends its own nonce before the one it was given. The proof below
        # covers the nonce as sent.
        if not matched["nonce"].endswith(self._nonce + self._server_nonce):
            raise ScramError("invalid nonce in the SCRAM client-final message")
        if matched["binding"] != _b64(self._gs2.encode()):
            raise ScramError("channel binding is not supported")
        try:
            proof = base64.b64decode(matched["proof"], validate=True)
        except binascii.Error:
            raise ScramError("invalid proof in the SCRAM client-final message") from None
        auth_message = f"{self._bare},{self._server_first},{matched['without_proof']}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if len(proof) != len(signature) or not hmac.compare_digest(
            hashlib.new(self._hash, client_key).digest(), credential.stored_key
        ):
            raise ScramError("invalid credentials")
        self._state, self.done = "done", True
        return b"v=" + _b64(hmac.digest(credential.server_key, auth_message, self._hash)).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _text(message: bytes) -> str:
    try:
        return message.decode()
    except UnicodeDecodeError:
        raise ScramError("a SCRAM message that is not UTF-8") from None
