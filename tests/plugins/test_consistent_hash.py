"""The x-consistent-hash exchange type (plugins/consistent_hash): RabbitMQ's argument and binding
checks in its words, weighted rendezvous placement and its consistent-hashing properties, and the
exchange fed by pika over real sockets."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pika
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from pika.adapters.blocking_connection import BlockingChannel
from tqbroker_consistent_hash import (
    ConsistentHashExchange,
    ConsistentHashRouter,
    choose,
    erlang_binary,
    hash_input,
    hash_source,
    key_hash,
    members,
    parse_weight,
    pick,
    score,
)

from tqbroker.plugins.loader import load_exchange_types
from tqbroker.protocol.codec import FieldTable
from tqbroker.testing import RunningBroker

pytestmark = pytest.mark.timeout(90)

KEYS = [f"key-{n}".encode() for n in range(10_000)]


def routed(weights: dict[str, int], keys: list[bytes] = KEYS) -> dict[bytes, str | None]:
    return {key: choose(key, weights) for key in keys}


# -- binding keys and arguments, as RabbitMQ words them ------------------------------------------


@pytest.mark.parametrize(
    ("key", "weight"), [("1", 1), ("10", 10), ("+5", 5), ("05", 5), ("9" * 18, int("9" * 18))]
)
def test_weights_read_as_erlang_list_to_integer(key: str, weight: int) -> None:
    assert parse_weight(key) == weight


@pytest.mark.parametrize(
    ("key", "message"),
    [
        # io_lib:format("The binding key must be an integer: ~tp", [Key]) on Erlang/OTP 25
        ("abc", 'The binding key must be an integer: <<"abc">>'),
        ("", "The binding key must be an integer: <<>>"),
        ("1.5", 'The binding key must be an integer: <<"1.5">>'),
        (" 5", 'The binding key must be an integer: <<" 5">>'),
        ("1_0", 'The binding key must be an integer: <<"1_0">>'),
        ('a"b\\c', 'The binding key must be an integer: <<"a\\"b\\\\c">>'),
        ("a\nb", 'The binding key must be an integer: <<"a\\nb">>'),
        ("é", 'The binding key must be an integer: <<"é"/utf8>>'),
        ("日本", "The binding key must be an integer: <<230,151,165,230,156,172>>"),
        ("\u0663", "The binding key must be an integer: <<217,163>>"),  # an Arabic-Indic 3
        ("0", "The binding key must be greater than 0"),
        ("-0", "The binding key must be greater than 0"),
        ("-1", "The binding key must be greater than 0"),
        (str(2**63), f"The binding key must be at most {2**63 - 1}"),
    ],
)
def test_invalid_weights_refused_in_rabbitmqs_words(key: str, message: str) -> None:
    with pytest.raises(ValueError, match="The binding key must be") as refused:
        parse_weight(key)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("data", "shown"),
    [  # Erlang/OTP 25, ~tp, +pc latin1 (the default)
        (b"\xff", '<<"\xff">>'),
        (b"\xd9\xa3", "<<217,163>>"),  # valid UTF-8, not printable: never read as Latin-1
        (b"a\tb\x1b\x0b\x08\x0c\r", '<<"a\\tb\\e\\v\\b\\f\\r">>'),
        (b"\x7f", "<<127>>"),
        (b"a\x00", "<<97,0>>"),
        (b"\xc2\x80", "<<194,128>>"),
        (b"\xc3\xa9\xe6\x97\xa5", "<<195,169,230,151,165>>"),
        (b"a\xffb", '<<"a\xffb">>'),
        (b"a\xff\x01", "<<97,255,1>>"),
        (b"\xe9abc", '<<"\xe9abc">>'),
    ],
)
def test_binaries_printed_as_erlang_prints_them(data: bytes, shown: str) -> None:
    assert erlang_binary(data) == shown


@given(st.integers(min_value=1, max_value=2**63 - 1))
def test_every_positive_integer_is_a_weight(weight: int) -> None:
    assert parse_weight(str(weight)) == weight
    assert parse_weight(f"+{weight}") == weight


@given(st.text().filter(lambda s: not s.isascii() or not s.lstrip("+-").isdigit()))
def test_anything_else_is_not(key: str) -> None:
    with pytest.raises(ValueError, match="The binding key must be"):
        parse_weight(key)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"hash-header": "h", "hash-property": "message_id"}, "mutually exclusive"),
        ({"hash-header": "h", "hash-property": "app_id"}, "mutually exclusive"),
        ({"hash-property": "app_id"}, "^Unsupported property: app_id$"),
        ({"hash-header": 5}, "^hash-header must be a string, not int$"),
    ],
)
def test_exchange_arguments_checked_as_rabbitmq_does(arguments: FieldTable, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ConsistentHashExchange().validate(arguments)


def test_hash_source_arguments() -> None:
    assert hash_source({}) == (None, None)
    assert hash_source({"hash-header": "hash-on", "alternate-exchange": "ae"}) == ("hash-on", None)
    for prop in ("message_id", "correlation_id", "timestamp"):
        assert hash_source({"hash-property": prop}) == (None, prop)


def test_registered_through_its_entry_point() -> None:
    assert isinstance(load_exchange_types()["x-consistent-hash"], ConsistentHashExchange)


# -- placement -----------------------------------------------------------------------------------


def test_key_hash_is_blake2b_64() -> None:
    # hashlib.blake2b(b"", digest_size=8).hexdigest() == "e4a6a0577479b2b4"
    assert key_hash(b"") == 0xE4A6A0577479B2B4
    assert key_hash(None) == 0


def test_hash_inputs() -> None:
    assert hash_input("abc") == b"abc" == hash_input(b"abc")
    assert hash_input(None) is None
    assert hash_input(5) == b"\x00\x00\x00\x06\x00I\x00\x00\x00\x05"  # {"": 5} as a field table
    assert hash_input(5) != hash_input("5")


@given(
    st.integers(0, 2**64 - 1), st.dictionaries(st.text(max_size=4), st.integers(1, 9), max_size=5)
)
def test_pick_is_the_lowest_score(key: int, weights: dict[str, int]) -> None:
    candidates = members(weights)
    best = pick(key, candidates)
    if not candidates:
        assert best is None
    else:
        assert best == min(candidates, key=lambda m: score(key, m.seed, m.weight))


def test_same_named_destinations_of_different_kinds_are_told_apart() -> None:
    class Queue:
        name = "orders"

    class Exchange:
        name = "orders"

    queue, exchange = Queue(), Exchange()
    idents = [member.ident for member in members({queue: 1, exchange: 1})]
    assert len(set(idents)) == 2
    assert {choose(key, {queue: 1, exchange: 1}) for key in KEYS[:100]} == {queue, exchange}
    assert members({queue: 1})[0].ident == "orders"


def test_weights_are_respected() -> None:
    shares = Counter(routed({"light": 1, "heavy": 3}).values())
    assert abs(shares["heavy"] / len(KEYS) - 0.75) < 0.02
    shares = Counter(routed({"q1": 1, "q2": 1, "q3": 2, "q4": 2}).values())
    for queue, share in [("q1", 1 / 6), ("q2", 1 / 6), ("q3", 1 / 3), ("q4", 1 / 3)]:
        assert abs(shares[queue] / len(KEYS) - share) < 0.02


@given(
    st.dictionaries(st.text(max_size=8), st.integers(1, 5), min_size=2, max_size=6),
    st.data(),
)
def test_unbinding_moves_only_that_destinations_keys(
    weights: dict[str, int], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(sorted(weights)))
    rest = {name: weight for name, weight in weights.items() if name != gone}
    keys = KEYS[:300]
    before, after = routed(weights, keys), routed(rest, keys)
    assert all(after[key] == before[key] for key in keys if before[key] != gone)


@given(
    st.dictionaries(st.text(max_size=8), st.integers(1, 5), min_size=1, max_size=6),
    st.text(max_size=8),
    st.integers(1, 5),
)
def test_binding_moves_keys_only_to_the_new_destination(
    weights: dict[str, int], new: str, weight: int
) -> None:
    assume(new not in weights)
    keys = KEYS[:300]
    before, after = routed(weights, keys), routed({**weights, new: weight}, keys)
    assert all(after[key] in (before[key], new) for key in keys)


def test_unbound_keys_spread_in_proportion_to_the_remaining_weights() -> None:
    weights = {"a": 1, "b": 1, "c": 1, "d": 3}
    before = routed(weights)
    after = routed({name: w for name, w in weights.items() if name != "a"})
    moved = Counter(after[key] for key in KEYS if before[key] == "a")
    total = sum(moved.values())
    assert abs(total / len(KEYS) - 1 / 6) < 0.02
    assert abs(moved["d"] / total - 0.6) < 0.06


@given(st.text(max_size=16), st.permutations(["a", "b", "c", "d"]))
def test_placement_does_not_depend_on_bind_order(key: str, order: list[str]) -> None:
    router = ConsistentHashRouter()
    for name in order:
        router.bind(name, str(ord(name) - 96), {})
    weights = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert list(router.route(key, None)) == [choose(key.encode(), weights)]


def test_router_bindings() -> None:
    router = ConsistentHashRouter("hash-on")
    assert list(router.route("k", {"hash-on": "x"})) == []
    router.bind("q1", "3", {})
    assert list(router.route("k", None)) == ["q1"]
    router.bind("q1", "5", {})  # a second binding to the same queue: the first one counts
    router.bind("q2", "1", {})
    assert router.weights == {"q1": 3, "q2": 1}
    router.unbind("q1", "03", {})
    assert router.weights == {"q1": 5, "q2": 1}
    router.unbind("q1", "5", {})
    router.unbind("q1", "5", {})  # already gone
    router.unbind("q2", "nonsense", {})
    assert router.weights == {"q2": 1}


def test_header_hashing_and_missing_header() -> None:
    router = ConsistentHashRouter("hash-on")
    for name, weight in [("a", "1"), ("b", "1"), ("c", "2")]:
        router.bind(name, weight, {})
    weights = router.weights
    for n in range(50):
        value = f"v{n}"
        assert list(router.route("ignored", {"hash-on": value})) == [
            choose(value.encode(), weights)
        ]
    missing = [choose(None, weights)]
    assert list(router.route("x", None)) == missing
    assert list(router.route("y", {"other": 1})) == missing
    assert list(router.route("z", {"hash-on": None})) == missing


# -- over real sockets ---------------------------------------------------------------------------


@pytest.fixture
def connection(tqbroker_thread: RunningBroker) -> Iterator[pika.BlockingConnection]:
    conn = pika.BlockingConnection(pika.URLParameters(tqbroker_thread.url))
    yield conn
    if conn.is_open:
        conn.close()


def declare(ch: BlockingChannel, weights: dict[str, int], **arguments: str) -> None:
    ch.exchange_declare("chx", "x-consistent-hash", arguments=arguments or None)
    for queue, weight in weights.items():
        ch.queue_declare(queue)
        ch.queue_bind(queue, "chx", str(weight))


def drain(ch: BlockingChannel, queues: list[str]) -> dict[str, list[bytes]]:
    got: dict[str, list[bytes]] = {}
    for queue in queues:
        got[queue] = []
        while True:
            method, _properties, body = ch.basic_get(queue, auto_ack=True)
            if method is None:
                break
            got[queue].append(body)
    return got


def test_same_key_same_queue(channel: BlockingChannel) -> None:
    weights = {"q1": 1, "q2": 1, "q3": 2, "q4": 2}
    declare(channel, weights)
    keys = [f"customer-{n}" for n in range(100)]
    for round_ in range(3):
        for key in keys:
            channel.basic_publish("chx", key, f"{key}/{round_}".encode())
    got = drain(channel, list(weights))
    for queue, bodies in got.items():
        expected = [
            f"{key}/{round_}".encode()
            for round_ in range(3)
            for key in keys
            if choose(key.encode(), weights) == queue
        ]
        assert bodies == expected


def test_weights_respected_over_the_wire(channel: BlockingChannel) -> None:
    declare(channel, {"light": 1, "heavy": 3})
    for n in range(10_000):
        channel.basic_publish("chx", f"k{n}", b"")
    counts = {
        q: channel.queue_declare(q, passive=True).method.message_count for q in ["light", "heavy"]
    }
    assert sum(counts.values()) == 10_000  # every message routed, to exactly one queue
    assert abs(counts["heavy"] / 10_000 - 0.75) < 0.02


def test_hash_header(channel: BlockingChannel) -> None:
    weights = {"q1": 1, "q2": 1, "q3": 2}
    declare(channel, weights, **{"hash-header": "hash-on"})
    values = [f"v{n}" for n in range(60)]
    for n, value in enumerate(values):
        headers = {"hash-on": value}
        channel.basic_publish(
            "chx", f"rk{n}", value.encode(), pika.BasicProperties(headers=headers)
        )
    for n in range(5):  # without the header: all to the same queue, as in RabbitMQ
        channel.basic_publish("chx", f"rk{n}", b"none", pika.BasicProperties(headers={"x": 1}))
    got = drain(channel, list(weights))
    for queue, bodies in got.items():
        expected = [v.encode() for v in values if choose(v.encode(), weights) == queue]
        if queue == choose(None, weights):
            expected += [b"none"] * 5
        assert bodies == expected


@pytest.mark.parametrize(
    ("prop", "value"),
    [("message_id", lambda n: f"m{n}"), ("correlation_id", lambda n: f"c{n}"), ("timestamp", int)],
)
def test_hash_property(channel: BlockingChannel, prop: str, value: Callable[[int], object]) -> None:
    """``hash-property``: the same property value, the same queue (whatever the routing key);
    all three queues used; a message without the property goes to one queue."""
    weights = {"q1": 1, "q2": 1, "q3": 1}
    declare(channel, weights, **{"hash-property": prop})
    for n in range(60):
        for copy in range(2):
            properties = pika.BasicProperties(**{prop: value(1_700_000_000 + n % 30)})
            channel.basic_publish("chx", f"rk{n}-{copy}", b"%d" % (n % 30), properties)
    for _ in range(3):
        channel.basic_publish("chx", "rk", b"none", pika.BasicProperties())
    got = drain(channel, list(weights))
    where: dict[bytes, str] = {}
    for queue, bodies in got.items():
        for body in bodies:
            assert where.setdefault(body, queue) == queue  # one queue per property value
    assert sum(map(len, got.values())) == 123
    assert len({q for b, q in where.items() if b != b"none"}) == 3
    assert sum(body == b"none" for bodies in got.values() for body in bodies) == 3


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        (
            {"hash-header": "h", "hash-property": "message_id"},
            "PRECONDITION_FAILED - hash-header and hash-property are mutually exclusive",
        ),
        ({"hash-property": "app_id"}, "PRECONDITION_FAILED - Unsupported property: app_id"),
    ],
)
def test_bad_exchange_arguments_refused(
    connection: pika.BlockingConnection, arguments: dict[str, str], text: str
) -> None:
    ch = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.exchange_declare("bad", "x-consistent-hash", arguments=arguments)
    assert closed.value.reply_code == 406
    assert closed.value.reply_text.startswith(text)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        (
            "not-a-number",
            'PRECONDITION_FAILED - The binding key must be an integer: <<"not-a-number">>',
        ),
        ("-1", "PRECONDITION_FAILED - The binding key must be greater than 0"),
        ("0", "PRECONDITION_FAILED - The binding key must be greater than 0"),
    ],
)
def test_invalid_weight_refused(connection: pika.BlockingConnection, key: str, text: str) -> None:
    ch = connection.channel()
    ch.exchange_declare("chx", "x-consistent-hash")
    ch.queue_declare("q")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_bind("q", "chx", key)
    assert (closed.value.reply_code, closed.value.reply_text) == (406, text)


def test_unbinding_moves_only_that_queues_keys(channel: BlockingChannel) -> None:
    weights = {"q1": 1, "q2": 2, "q3": 1}
    declare(channel, weights)
    keys = [f"k{n}" for n in range(600)]

    def placement() -> dict[str, str]:
        for key in keys:
            channel.basic_publish("chx", key, key.encode())
        return {
            body.decode(): queue
            for queue, bodies in drain(channel, list(weights)).items()
            for body in bodies
        }

    before = placement()
    assert len(before) == len(keys)
    assert set(before.values()) == set(weights)
    channel.queue_unbind("q2", "chx", "2")  # not the last bound: RabbitMQ would move others too
    after = placement()
    assert len(after) == len(keys)
    assert "q2" not in after.values()
    assert all(after[key] == queue for key, queue in before.items() if queue != "q2")
    channel.queue_bind("q2", "chx", "2")
    assert placement() == before  # bound again: every key back where it was
