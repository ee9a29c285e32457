"""The node-to-node link's sans-IO protocol: frames reassembled from any split, the handshake on
the cluster secret (and each way it fails), requests and replies after it, and bad input, which
always raises ``PeerProtocolError`` (never anything else)."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tqbroker.cluster.peer_protocol import (
    HANDSHAKE_MAX_FRAME,
    EndOfStream,
    ErrorReply,
    Event,
    HandshakeComplete,
    Kind,
    LocalProtocolError,
    PeerAuthError,
    PeerConnection,
    PeerProtocolError,
    Reply,
    Request,
    Role,
    State,
    encode_frame,
)

SECRET = b"s" * 32
OTHER_SECRET = b"t" * 32

bodies = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)
request_ids = st.integers(0, 2**63 - 1)


def raw_frame(value: Any) -> bytes:
    body = cbor2.dumps(value)
    return struct.pack(">I", len(body)) + body


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def feed(connection: PeerConnection, pieces: list[bytes]) -> list[Event]:
    events: list[Event] = []
    for piece in pieces:
        if piece:
            events += connection.receive_data(piece)
    return events


def handshake(
    initiator_secret: bytes = SECRET,
    acceptor_secret: bytes = SECRET,
    *,
    expected_peer: str | None = "b",
) -> tuple[PeerConnection, PeerConnection]:
    initiator = PeerConnection(Role.INITIATOR, "a", initiator_secret, expected_peer=expected_peer)
    acceptor = PeerConnection(Role.ACCEPTOR, "b", acceptor_secret)
    assert acceptor.receive_data(initiator.data_to_send()) == []
    assert initiator.receive_data(acceptor.data_to_send()) == [HandshakeComplete("b")]
    assert acceptor.receive_data(initiator.data_to_send()) == [HandshakeComplete("a")]
    return initiator, acceptor


@given(cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_the_handshake_completes_from_bytes_split_anywhere(cuts):
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET, expected_peer="b")
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    assert feed(acceptor, split(initiator.data_to_send(), cuts)) == []
    assert feed(initiator, split(acceptor.data_to_send(), cuts)) == [HandshakeComplete("b")]
    assert feed(acceptor, split(initiator.data_to_send(), cuts)) == [HandshakeComplete("a")]
    assert initiator.state is State.OPEN
    assert acceptor.state is State.OPEN
    assert acceptor.peer_id == "a"


@given(
    requests=st.lists(st.tuples(request_ids, st.text(max_size=10), bodies), max_size=10),
    cuts=st.lists(st.integers(0, 100_000), max_size=12),
)
def test_requests_round_trip_through_frames_split_anywhere(requests, cuts):
    initiator, acceptor = handshake()
    data = b"".join(initiator.send_request(*request) for request in requests)
    assert feed(acceptor, split(data, cuts)) == [Request(*request) for request in requests]


@given(
    answers=st.lists(
        st.one_of(
            st.tuples(st.just("reply"), request_ids, bodies),
            st.tuples(st.just("error"), request_ids, st.text(max_size=10), st.text()),
        ),
        max_size=10,
    ),
    cuts=st.lists(st.integers(0, 100_000), max_size=12),
)
def test_replies_and_errors_round_trip_through_frames_split_anywhere(answers, cuts):
    initiator, acceptor = handshake()
    data, expected = b"", list[Event]()
    for kind, *fields in answers:
        if kind == "reply":
            data += acceptor.send_reply(*fields)
            expected.append(Reply(*fields))
        else:
            data += acceptor.send_error(*fields)
            expected.append(ErrorReply(*fields))
    assert feed(initiator, split(data, cuts)) == expected


def test_requests_may_follow_the_proof_in_the_same_read():
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET)
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    acceptor.receive_data(initiator.data_to_send())
    initiator.receive_data(acceptor.data_to_send())
    big = b"x" * (HANDSHAKE_MAX_FRAME * 4)  # the limit rises once the proof is checked
    data = initiator.data_to_send() + initiator.send_request(7, "fetch", big)
    assert acceptor.receive_data(data) == [HandshakeComplete("a"), Request(7, "fetch", big)]


def test_a_wrong_secret_fails_on_the_initiator_before_it_proves_anything():
    initiator = PeerConnection(Role.INITIATOR, "a", OTHER_SECRET)
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    acceptor.receive_data(initiator.data_to_send())
    with pytest.raises(PeerAuthError, match="does not hold the cluster secret"):
        initiator.receive_data(acceptor.data_to_send())
    assert initiator.data_to_send() == b""
    assert initiator.state is State.CLOSED


def test_a_wrong_proof_fails_on_the_acceptor():
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET)
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    acceptor.receive_data(initiator.data_to_send())
    with pytest.raises(PeerAuthError, match="'a' does not hold the cluster secret"):
        acceptor.receive_data(encode_frame([Kind.PROOF, b"\0" * 32]))
    assert acceptor.state is State.CLOSED


def test_a_peer_that_is_not_the_node_dialled_is_refused():
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET, expected_peer="c")
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    acceptor.receive_data(initiator.data_to_send())
    with pytest.raises(PeerAuthError, match="the peer is node 'b', not 'c'"):
        initiator.receive_data(acceptor.data_to_send())


def test_a_proof_replayed_from_another_connection_fails():
    first = PeerConnection(Role.INITIATOR, "a", SECRET)
    eavesdropped = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    eavesdropped.receive_data(first.data_to_send())
    first.receive_data(eavesdropped.data_to_send())
    proof = first.data_to_send()
    fresh = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    fresh.receive_data(PeerConnection(Role.INITIATOR, "a", SECRET).data_to_send())
    with pytest.raises(PeerAuthError):
        fresh.receive_data(proof)


def test_the_acceptors_own_challenge_reflected_back_is_no_proof():
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    acceptor.receive_data(PeerConnection(Role.INITIATOR, "a", SECRET).data_to_send())
    challenge = cbor2.loads(acceptor.data_to_send()[4:])
    with pytest.raises(PeerAuthError):
        acceptor.receive_data(encode_frame([Kind.PROOF, challenge[4]]))


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (encode_frame([Kind.HELLO, 2, "a", b"n" * 32]), "version 2"),
        (encode_frame([Kind.HELLO, 1, "a", b"short"]), "a nonce of 5 bytes"),
        (encode_frame([Kind.HELLO, 1, "a"]), "a malformed hello"),
        (encode_frame([Kind.HELLO, True, "a", b"n" * 32]), "a malformed hello"),
        (encode_frame([Kind.REQUEST, 1, "op", None]), "request before the handshake"),
        (encode_frame([Kind.PROOF, b"x" * 32]), "proof before the handshake"),
        (encode_frame([99, 1]), "unknown message kind 99"),
        (encode_frame([]), "starts with its kind"),
        (raw_frame({"kind": 1}), "starts with its kind"),
        (struct.pack(">I", 3) + b"\xff\xff\xff", "undecodable"),
        (struct.pack(">I", 2) + b"\x80\x00", "bytes after"),
        (struct.pack(">I", HANDSHAKE_MAX_FRAME + 1), "at most 1024"),
    ],
)
def test_bad_input_to_the_acceptor_is_a_protocol_error(frame, message):
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET)
    with pytest.raises(PeerProtocolError, match=message):
        acceptor.receive_data(frame)
    assert acceptor.state is State.CLOSED
    with pytest.raises(PeerProtocolError, match="closed"):
        acceptor.receive_data(b"more")


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ([Kind.REQUEST, 1, "op", None], "unexpected request to the initiator"),
        ([Kind.REPLY, -1, None], "request id -1 out of range"),
        ([Kind.ERROR, 1, 5, "text"], "a malformed error"),
        ([Kind.HELLO, 1, "b", b"n" * 32], "unexpected hello"),
    ],
)
def test_bad_messages_after_the_handshake_are_protocol_errors(message: list[Any], error):
    initiator, _ = handshake()
    with pytest.raises(PeerProtocolError, match=error):
        initiator.receive_data(encode_frame(message))


def test_an_oversize_frame_is_refused_once_its_length_is_known():
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET, max_frame=1000)
    acceptor = PeerConnection(Role.ACCEPTOR, "b", SECRET, max_frame=1000)
    acceptor.receive_data(initiator.data_to_send())
    initiator.receive_data(acceptor.data_to_send())
    acceptor.receive_data(initiator.data_to_send())
    with pytest.raises(PeerProtocolError, match="frame of 1001 bytes"):
        initiator.receive_data(struct.pack(">I", 1001))
    with pytest.raises(LocalProtocolError, match="at most 1000"):
        acceptor.send_reply(1, b"x" * 1000)


def test_the_end_of_the_stream():
    initiator, acceptor = handshake()
    assert initiator.receive_data(acceptor.send_reply(1, "body")[:-1]) == []
    assert acceptor.receive_data(b"") == [EndOfStream()]
    with pytest.raises(PeerProtocolError, match="inside a frame"):
        initiator.receive_data(b"")


def test_sending_is_refused_before_the_handshake_and_from_the_wrong_side():
    initiator = PeerConnection(Role.INITIATOR, "a", SECRET)
    with pytest.raises(LocalProtocolError, match="AWAIT_CHALLENGE"):
        initiator.send_request(1, "op", None)
    initiator, acceptor = handshake()
    with pytest.raises(LocalProtocolError, match="initiator cannot"):
        initiator.send_reply(1, None)
    with pytest.raises(LocalProtocolError, match="acceptor cannot"):
        acceptor.send_request(1, "op", None)


def test_an_empty_secret_is_refused():
    with pytest.raises(ValueError, match="empty"):
        PeerConnection(Role.INITIATOR, "a", b"")


@given(data=st.binary(max_size=200), authenticated=st.booleans())
def test_arbitrary_bytes_never_raise_anything_but_a_protocol_error(data, authenticated):
    acceptor = handshake()[1] if authenticated else PeerConnection(Role.ACCEPTOR, "b", SECRET)
    with contextlib.suppress(PeerProtocolError):
        acceptor.receive_data(data)
