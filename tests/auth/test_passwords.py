"""RabbitMQ-format password hashes: the format (base64 of a 4-byte salt and the digest),
a hash RabbitMQ 3.10 wrote, every algorithm, malformed hashes refused."""

from __future__ import annotations

import base64
import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tqbroker.auth.passwords import (
    ALGORITHMS,
    MD5,
    SHA256,
    SHA512,
    HashError,
    check_password,
    hash_password,
    validate_hash,
)

# Written by RabbitMQ 3.10.8 for guest/guest (tests/data/rabbitmq-3.10-definitions.json).
RABBITMQ_GUEST = "c0x5LQiSd0/grRNgSBRWPx/19lVBQBXeykcIxqJdmpTgpMEp"


def test_a_hash_rabbitmq_wrote_checks() -> None:
    assert check_password("guest", RABBITMQ_GUEST, SHA256)
    assert not check_password("Guest", RABBITMQ_GUEST, SHA256)


def test_the_format_is_salt_then_digest_of_salt_and_password() -> None:
    made = hash_password("s3cret", SHA256, salt=b"\x01\x02\x03\x04")
    raw = base64.b64decode(made)
    assert raw[:4] == b"\x01\x02\x03\x04"
    assert raw[4:] == hashlib.sha256(b"\x01\x02\x03\x04s3cret").digest()


@given(password=st.text(), algorithm=st.sampled_from(sorted(ALGORITHMS)))
def test_round_trip(password: str, algorithm: str) -> None:
    made = hash_password(password, algorithm)
    validate_hash(made, algorithm)
    assert check_password(password, made, algorithm)
    assert not check_password(password + "x", made, algorithm)


@pytest.mark.parametrize("algorithm", [SHA256, SHA512, MD5])
def test_salts_differ(algorithm: str) -> None:
    assert hash_password("same", algorithm) != hash_password("same", algorithm)


@pytest.mark.parametrize(
    "bad", ["", "not base64!", base64.b64encode(b"short").decode(), RABBITMQ_GUEST + "AAAA"]
)
def test_malformed_hashes_never_match(bad: str) -> None:
    assert not check_password("guest", bad, SHA256)


def test_unknown_algorithm_is_refused_by_name() -> None:
    with pytest.raises(HashError, match="unknown hashing_algorithm 'rabbit_password_hashing_x'"):
        hash_password("x", "rabbit_password_hashing_x")
    with pytest.raises(HashError, match="not a 4-byte salt"):
        validate_hash(RABBITMQ_GUEST, SHA512)  # a SHA-256 hash under SHA-512
