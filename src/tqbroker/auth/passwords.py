"""Password hashes in RabbitMQ's format, so users move between RabbitMQ and tqbroker.

A hash is ``base64(salt + H(salt + utf8(password)))`` with a 4-byte random salt, where ``H`` is
named by the hashing algorithm: ``rabbit_password_hashing_sha256`` (RabbitMQ's default and
ours), ``rabbit_password_hashing_sha512``, ``rabbit_password_hashing_md5`` (for definitions
exported by RabbitMQ before 3.6). Salted SHA-256 costs microseconds: the brute-force defence is
the per-source rate limit and the failure delay (``authenticator.py``), not the hash's cost.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SHA256 = "rabbit_password_hashing_sha256"
SHA512 = "rabbit_password_hashing_sha512"
MD5 = "rabbit_password_hashing_md5"
DEFAULT_ALGORITHM = SHA256
ALGORITHMS: dict[str, str] = {SHA256: "sha256", SHA512: "sha512", MD5: "md5"}
SALT_BYTES = 4


class HashError(ValueError):
    """An unknown hashing algorithm or a hash that is not base64 of salt + digest."""


def _digest(algorithm: str, data: bytes) -> bytes:
    name = ALGORITHMS.get(algorithm)
    if name is None:
        raise HashError(
            f"unknown hashing_algorithm {algorithm!r} (known: {', '.join(sorted(ALGORITHMS))})"
        )
    return hashlib.new(name, data).digest()


def hash_password(
    password: str, algorithm: str = DEFAULT_ALGORITHM, salt: bytes | None = None
) -> str:
    """The RabbitMQ-format hash of ``password`` (a fresh random salt unless one is given)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return base64.b64encode(salt + _digest(algorithm, salt + password.encode())).decode("ascii")


def validate_hash(password_hash: str, algorithm: str) -> None:
    """HashError unless ``password_hash`` is ``""`` (no password) or a well-formed hash."""
    if password_hash == "":
        _digest(algorithm, b"")
        return
    size = len(_digest(algorithm, b""))
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        raise HashError("password_hash is not base64") from None
    if len(raw) != SALT_BYTES + size:
        raise HashError(f"password_hash is not a 4-byte salt and a {algorithm} digest")


def check_password(password: str, password_hash: str, algorithm: str = DEFAULT_ALGORITHM) -> bool:
    """Whether ``password`` matches ``password_hash``; False for ``""`` (a user without a
    password) and for malformed hashes. Compares in constant time."""
    try:
        raw = base64.b64decode(password_hash, validate=True)
        digest_size = len(_digest(algorithm, b""))
    except (binascii.Error, ValueError):
        return False
    if len(raw) != SALT_BYTES + digest_size:
        return False
    salt, expected = raw[:SALT_BYTES], raw[SALT_BYTES:]
    return hmac.compare_digest(_digest(algorithm, salt + password.encode()), expected)


# Checked against for unknown users, so an unknown user costs what a wrong password does.
DUMMY_HASH = hash_password(os.urandom(16).hex())
