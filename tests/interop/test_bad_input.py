"""Bad input over a raw socket: every malformed or abusive input gets the reaction RabbitMQ has,
while a second, healthy client (the canary) keeps doing round trips on the same broker.

One test (or parametrized group) per row of the table in the reliability notes,
``reliability.md`` section 3 "Bad input for an AMQP 0-9-1 server"; the test names carry the row
number. Where RabbitMQ's actual behaviour (``rabbit_reader``, ``rabbit_channel``,
``rabbit_command_assembler``, ``rabbit_amqqueue``) differs from the table's summary the test
follows RabbitMQ and says so in its docstring.

Hard errors must end with ``connection.close`` and, after our ``close-ok`` (or our silence), the
broker must drop the socket within ``CLOSE_GRACE`` seconds (RabbitMQ: 3 s).

Row 10 (vhost without permission / connection limit) has no test: tqbroker has neither
permissions nor connection limits (``BrokerConfig`` offers no such setting), so there is nothing to
configure that RabbitMQ would refuse with 530.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import socket
import ssl
import struct
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import attrs
import pytest

from tests.support.canary import Canary
from tests.support.rawamqp import (
    CLIENT_CAPABILITIES,
    CLOSE_GRACE,
    RawAMQP,
    SocketClosed,
    body_frame,
    content_header,
    frame,
    heartbeat_frame,
    method_arguments,
    method_frame,
)
from tqbroker.config import BrokerConfig, PermissionConfig, UserConfig
from tqbroker.protocol.codec import U32
from tqbroker.protocol.frames import (
    FRAME_BODY,
    FRAME_METHOD,
    PROTOCOL_HEADER,
    encode_method,
)
from tqbroker.protocol.methods import (
    METHODS,
    BasicAck,
    BasicConsume,
    BasicConsumeOk,
    BasicGet,
    BasicGetEmpty,
    BasicGetOk,
    BasicNack,
    BasicPublish,
    BasicQos,
    BasicQosOk,
    BasicRecover,
    BasicRecoverAsync,
    BasicReject,
    ChannelClose,
    ChannelCloseOk,
    ChannelFlow,
    ChannelOpen,
    ChannelOpenOk,
    ConfirmSelect,
    ConfirmSelectOk,
    ConnectionClose,
    ConnectionCloseOk,
    ConnectionOpen,
    ConnectionStart,
    ConnectionStartOk,
    ConnectionTune,
    ConnectionTuneOk,
    ExchangeBind,
    ExchangeDeclare,
    ExchangeDeclareOk,
    ExchangeDelete,
    ExchangeDeleteOk,
    ExchangeUnbind,
    ExchangeUnbindOk,
    Method,
    QueueBind,
    QueueBindOk,
    QueueDeclare,
    QueueDeclareOk,
    QueueDelete,
    QueueDeleteOk,
    QueuePurge,
    QueueUnbind,
    QueueUnbindOk,
    TxCommit,
    TxRollback,
    TxSelect,
    TxSelectOk,
)
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(30)

M = TypeVar("M", bound=Method)

# Reply codes (spelled out so a failing assertion reads like the spec).
ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
FRAME_ERROR = 501
COMMAND_INVALID = 503
CHANNEL_ERROR = 504
UNEXPECTED_FRAME = 505
NOT_ALLOWED = 530
NOT_IMPLEMENTED = 540


# -- fixtures ------------------------------------------------------------------------------------


@attrs.frozen
class BrokerAddress:
    host: str
    port: int


class SharedBroker:
    """One broker and its canary for every test that needs no special configuration (a broker per
    test costs ~0.15 s); thrown away and replaced after a test in which the canary failed."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self.address = BrokerAddress("", 0)
        self.canary: Canary | None = None

    def get(self) -> tuple[BrokerAddress, Canary]:
        if self._stack is None or self.canary is None or not self.canary.alive:
            self.close()
            self._stack = contextlib.ExitStack()
            running = self._stack.enter_context(running_broker(BrokerConfig(port=0)))
            self.address = BrokerAddress(running.host, running.port)
            self.canary = self._stack.enter_context(Canary(running.host, running.port))
        return self.address, self.canary

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack = self.canary = None


@pytest.fixture(scope="module")
def shared_broker() -> Iterator[SharedBroker]:
    shared = SharedBroker()
    yield shared
    shared.close()


@pytest.fixture
def broker_and_canary(
    request: pytest.FixtureRequest, shared_broker: SharedBroker
) -> Iterator[tuple[BrokerAddress, Canary]]:
    """The broker under test and a canary on it: the shared ones, or (``indirect``
    parametrization of ``broker`` with ``BrokerConfig`` overrides) a dedicated pair."""
    overrides = getattr(request, "param", None)
    if not overrides:
        yield shared_broker.get()
        return
    with running_broker(BrokerConfig(port=0, **overrides)) as running:
        host = "127.0.0.1" if running.host in ("0.0.0.0", "::") else running.host
        with Canary(host, running.port) as canary:
            yield BrokerAddress(host, running.port), canary


@pytest.fixture
def broker(broker_and_canary: tuple[BrokerAddress, Canary]) -> BrokerAddress:
    return broker_and_canary[0]


@pytest.fixture(autouse=True)
def canary(broker_and_canary: tuple[BrokerAddress, Canary]) -> Iterator[Canary]:
    """A healthy pika client doing round trips on the same broker during the whole test; at the
    end of the test it must have made more round trips, without error or stall."""
    canary = broker_and_canary[1]
    canary.mark()
    yield canary
    canary.check()


_counter = itertools.count(1)


@pytest.fixture
def name() -> Callable[[str], str]:
    """Per-test queue/exchange names (the shared broker keeps what earlier tests declared)."""
    prefix = f"t{next(_counter)}."
    return lambda base: prefix + base


def scoped(method: M, name: Callable[[str], str]) -> M:
    """``method`` with its queue/exchange names made per-test (``amq.*`` and "" untouched)."""
    changes: dict[str, str] = {}
    for field in ("queue", "exchange", "destination", "source"):
        value = getattr(method, field, None)
        if value and not value.startswith("amq."):
            changes[field] = name(value)
    return attrs.evolve(method, **changes)  # type: ignore[misc]  # M: a method class (attrs)


Connect = Callable[..., RawAMQP]


@pytest.fixture
def connect(broker: BrokerAddress) -> Iterator[Connect]:
    """Open raw connections (closed at teardown, before the canary is checked)."""
    opened: list[RawAMQP] = []

    def connect_(host: str | None = None) -> RawAMQP:
        conn = RawAMQP(host or broker.host, broker.port)
        opened.append(conn)
        return conn

    yield connect_
    for conn in opened:
        conn.close()


@pytest.fixture
def amqp(connect: Connect) -> RawAMQP:
    """An open connection (broker's tune values) with channel 1 open."""
    conn = connect()
    conn.handshake()
    conn.open_channel(1)
    return conn


# -- helpers -------------------------------------------------------------------------------------


def start(conn: RawAMQP) -> ConnectionStart:
    """Send the protocol header and read connection.start."""
    conn.send_header()
    return conn.expect_method(ConnectionStart, channel=0)


def until_tune(conn: RawAMQP) -> ConnectionTune:
    """Header, start-ok; returns connection.tune."""
    start(conn)
    conn.start_ok()
    return conn.expect_method(ConnectionTune, channel=0)


def expect_close_or_silence(conn: RawAMQP, code: int, timeout: float = 5.0) -> None:
    """Before the handshake completes RabbitMQ may just drop the socket (after 3 s) where the spec
    says ``code``: accept either a connection.close with ``code`` or a silent close."""
    try:
        got = conn.next_frame(timeout)
    except SocketClosed:
        return
    except TimeoutError:
        raise AssertionError(f"expected connection.close {code} or a close, got nothing") from None
    method = got.method
    assert isinstance(method, ConnectionClose), (
        f"expected connection.close {code} or a close, got {got.describe()}"
    )
    assert method.reply_code == code, f"got {method.reply_code} {method.reply_text!r}"
    conn.send_method(0, ConnectionCloseOk())
    conn.expect_socket_closed(CLOSE_GRACE)


def expect_each(conns: Mapping[str, RawAMQP], check: Callable[[RawAMQP], object]) -> None:
    """Run ``check`` on every connection (variants sent side by side) and report every failure."""
    failures = []
    for variant, conn in conns.items():
        try:
            check(conn)
        except AssertionError as exc:
            failures.append(f"[{variant}] {exc}")
    assert not failures, "\n".join(failures)


def ping(conn: RawAMQP, channel: int) -> None:
    """Prove ``channel`` still works: a passive declare of a predeclared exchange."""
    conn.call(channel, ExchangeDeclare(exchange="amq.direct", passive=True), ExchangeDeclareOk)


def declare_queue(conn: RawAMQP, channel: int, name: str, **flags: Any) -> str:
    ok = conn.call(channel, QueueDeclare(queue=name, **flags), QueueDeclareOk)
    return ok.queue


def publish_and_get(conn: RawAMQP, channel: int, queue: str, *, no_ack: bool = False) -> int:
    """Publish one message to ``queue`` and basic.get it; returns the delivery tag."""
    conn.publish(channel, "", queue, b"payload")
    conn.send_method(channel, BasicGet(queue=queue, no_ack=no_ack))
    ok = conn.expect_method(BasicGetOk, channel=channel)
    conn.expect_content(channel)
    return ok.delivery_tag


def publish_frames(channel: int, exchange: str = "", routing_key: str = "q") -> bytes:
    """Just the basic.publish method frame (content to be supplied by the test)."""
    return encode_method(channel, BasicPublish(exchange=exchange, routing_key=routing_key))


def tls_client_hello() -> bytes:
    """A real TLS ClientHello, as a TLS client pointed at the AMQP port sends it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def non_loopback_ipv4() -> str | None:
    """An address of this host that is not loopback (None if it has none)."""
    candidates = []
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # UDP connect sends nothing; it only picks a route
        candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    finally:
        probe.close()
    with contextlib.suppress(OSError):
        candidates.append(socket.gethostbyname(socket.gethostname()))
    for ip in candidates:
        if not ipaddress.ip_address(ip).is_loopback and ip != "0.0.0.0":
            return ip
    return None


def table_bytes(raw_entries: bytes) -> bytes:
    """A field table from raw name/value bytes (length prefix computed)."""
    return U32.pack(len(raw_entries)) + raw_entries


def queue_declare_with_raw_arguments(channel: int, raw_table: bytes) -> bytes:
    """queue.declare 'q' whose arguments field is ``raw_table`` (not validated)."""
    args = struct.pack(">H", 0) + b"\x01q" + b"\x00" + raw_table
    return method_frame(channel, 50, 10, args)


def nested_tables(depth: int) -> bytes:
    """``depth`` tables nested one inside the other: {"a": {"a": {...}}}."""
    inner = table_bytes(b"")
    for _ in range(depth):
        inner = table_bytes(b"\x01aF" + inner)
    return inner


def nested_arrays(depth: int) -> bytes:
    """A table {"a": [[[...]]]} with ``depth`` nested arrays."""
    inner = U32.pack(0)
    for _ in range(depth - 1):
        inner = U32.pack(len(inner) + 1) + b"A" + inner
    return table_bytes(b"\x01aA" + inner)


# == 1-11: the protocol header and the handshake ==================================================


BAD_HEADERS = {
    "amqp-0-9-2": b"AMQP\x00\x00\x09\x02",
    "amqp-0-10": b"AMQP\x01\x01\x00\x0a",
    "amqp-1-0": b"AMQP\x00\x01\x00\x00",
    "amqp-1-0-sasl": b"AMQP\x03\x01\x00\x00",
    "http-get": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "zeros": b"\x00" * 8,
    "tls-client-hello": tls_client_hello(),
}


@pytest.mark.parametrize("header", BAD_HEADERS.values(), ids=BAD_HEADERS.keys())
def test_r01_bad_protocol_header_gets_our_header_then_close(
    connect: Connect, header: bytes
) -> None:
    """Spec (connection.start, rule protocol-name): answer a bad header with the header we
    speak and close the socket, no connection.close."""
    conn = connect()
    conn.send(header)
    assert conn.read_until_closed(timeout=5.0) == PROTOCOL_HEADER


STALLS = ["partial-header", "after-start", "after-tune", "after-tune-ok", "trickle"]


@pytest.mark.parametrize(
    "broker_and_canary", [{"handshake_timeout": 1.0}], indirect=True, ids=["hs=1s"]
)
@pytest.mark.parametrize("stall", STALLS)
def test_r02_stalled_handshake_times_out(connect: Connect, stall: str) -> None:
    """The handshake has a deadline from TCP accept (RabbitMQ: handshake_timeout, 10 s; 1 s here)
    after which the socket is closed without a word, however the client stalls, including a
    slow-loris trickle of one byte at a time."""
    began = time.monotonic()
    conn = connect()
    if stall == "partial-header":
        conn.send(PROTOCOL_HEADER[:5])
    elif stall == "after-start":
        start(conn)
    elif stall == "after-tune":
        until_tune(conn)
    elif stall == "after-tune-ok":
        tune = until_tune(conn)
        conn.tune_ok(tune.channel_max, tune.frame_max, 0)
    else:
        start(conn)
        start_ok = encode_method(0, ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US"))
        for byte in start_ok[:-1]:
            conn.send(bytes((byte,)))
            try:
                conn.next_frame(0.1)
            except TimeoutError:
                continue
            except SocketClosed:
                break
            raise AssertionError("the broker answered an incomplete frame")
    conn.expect_silent_close(timeout=6.0 - (time.monotonic() - began))
    elapsed = time.monotonic() - began
    # Not before the timeout; the upper bound only says "it does close", generous enough for a
    # loaded 2-core CI machine.
    assert 0.8 <= elapsed <= 5.0, f"closed after {elapsed:.2f}s, handshake_timeout is 1s"


@pytest.mark.parametrize("mechanism", ["NOPE", "plain", "ANONYMOUS", "EXTERNAL", ""])
def test_r03_unknown_sasl_mechanism_closes_without_reply(connect: Connect, mechanism: str) -> None:
    """Spec (start-ok rule validity): an unknown mechanism closes the socket without sending
    anything further (RabbitMQ: 503 internally, silent close)."""
    conn = connect()
    start(conn)
    conn.start_ok(mechanism=mechanism)
    conn.expect_silent_close(timeout=5.0)


CREDENTIALS = [("guest", "wrong"), ("nobody", "guest"), ("guest", "")]


@pytest.mark.parametrize(
    ("user", "password"), CREDENTIALS, ids=["bad-password", "no-user", "empty"]
)
def test_r04_wrong_credentials_with_capability_get_403(
    connect: Connect, user: str, password: str
) -> None:
    """With the client capability ``authentication_failure_close`` a failed login gets
    connection.close 403 ACCESS_REFUSED."""
    conn = connect()
    start(conn)
    conn.start_ok(user, password)
    close = conn.expect_connection_close(ACCESS_REFUSED)
    assert "refused" in close.reply_text.lower()


@pytest.mark.parametrize(
    "capabilities",
    [{}, {"authentication_failure_close": False}],
    ids=["no-capabilities", "capability-false"],
)
def test_r04_wrong_credentials_without_capability_close_tcp(
    connect: Connect, capabilities: dict[str, bool]
) -> None:
    """Without ``authentication_failure_close`` the spec (and RabbitMQ's ``auth_fail``) just
    closes the TCP connection: no connection.close."""
    conn = connect()
    start(conn)
    conn.start_ok("guest", "wrong", capabilities=capabilities)
    conn.expect_silent_close(timeout=5.0)


NON_LOOPBACK_BROKER = {
    "host": "0.0.0.0",
    "users": (
        UserConfig(
            "guest", "guest", tags=("administrator",), permissions={"/": PermissionConfig()}
        ),
        UserConfig(
            "remote", "secret", tags=("administrator",), permissions={"/": PermissionConfig()}
        ),
    ),
}


@pytest.mark.parametrize("broker_and_canary", [NON_LOOPBACK_BROKER], indirect=True, ids=["0.0.0.0"])
@pytest.mark.parametrize("capable", [True, False], ids=["capability", "no-capability"])
def test_r05_guest_from_non_loopback_is_refused(connect: Connect, capable: bool) -> None:
    """``guest`` may only connect via localhost: 403 ACCESS_REFUSED (with the capability
    ``authentication_failure_close``, else a silent close); another user from the same address
    gets in."""
    ip = non_loopback_ipv4()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to connect from")
    conn = connect(ip)
    start(conn)
    conn.start_ok("guest", "guest", capabilities=CLIENT_CAPABILITIES if capable else {})
    if capable:
        conn.expect_connection_close(ACCESS_REFUSED)
    else:
        conn.expect_silent_close(timeout=5.0)
    other = connect(ip)
    other.handshake("remote", "secret")
    other.open_channel(1)
    ping(other, 1)


def test_r06_frame_larger_than_initial_frame_max_before_tune(connect: Connect) -> None:
    """Before tune-ok frames are limited to the initial frame_max (RabbitMQ 8192; spec minimum
    4096): a bigger start-ok (huge client properties) gets 501 FRAME_ERROR or a close, and a
    frame head declaring 2 GiB is refused at once, without waiting for (or buffering) the
    payload. (Both variants run side by side: a fatal frame error costs a 3 s grace period.)"""
    big, declared = connect(), connect()
    for conn in (big, declared):
        start(conn)
    big.start_ok(extra_properties={"padding": "x" * 10_000})
    declared.send(struct.pack(">BHI", FRAME_METHOD, 0, 0x7FFF_FFF0) + b"\x00\x0a\x00\x0b")
    expect_each(
        {"10KB-start-ok": big, "declared-2GiB": declared},
        lambda conn: expect_close_or_silence(conn, FRAME_ERROR),
    )


TUNE_FRAME_MAX = {
    "server+1": 131073,
    "1MiB": 1 << 20,
    "u32-max": 0xFFFF_FFFF,
    "zero-unlimited": 0,
    "below-min-4095": 4095,
    "tiny-8": 8,
}


@pytest.mark.parametrize("frame_max", TUNE_FRAME_MAX.values(), ids=TUNE_FRAME_MAX.keys())
def test_r07_tune_ok_frame_max_out_of_range(connect: Connect, frame_max: int) -> None:
    """tune-ok frame_max above the server's (0 = unlimited counts as above) or below 4096:
    530 NOT_ALLOWED "negotiated frame_max = ..." (RabbitMQ ``validate_negotiated_integer_value``;
    it names method connection.tune, 10/30). The connection.open a client pipelines after
    tune-ok must not be answered."""
    conn = connect()
    tune = until_tune(conn)
    conn.send(
        encode_method(0, ConnectionTuneOk(tune.channel_max, frame_max, 0))
        + encode_method(0, ConnectionOpen("/"))
    )
    close = conn.expect_connection_close(NOT_ALLOWED, class_id=10, method_id=(30, 31))
    assert "frame_max" in close.reply_text


TUNE_CHANNEL_MAX = {"server+1": 2048, "u16-max": 65535, "zero-unlimited": 0}


@pytest.mark.parametrize("channel_max", TUNE_CHANNEL_MAX.values(), ids=TUNE_CHANNEL_MAX.keys())
def test_r08_tune_ok_channel_max_above_server(connect: Connect, channel_max: int) -> None:
    """tune-ok channel_max above the server's 2047 (0 = unlimited counts as above):
    530 NOT_ALLOWED, as for frame_max."""
    conn = connect()
    tune = until_tune(conn)
    conn.send(
        encode_method(0, ConnectionTuneOk(channel_max, tune.frame_max, 0))
        + encode_method(0, ConnectionOpen("/"))
    )
    close = conn.expect_connection_close(NOT_ALLOWED, class_id=10, method_id=(30, 31))
    assert "channel_max" in close.reply_text


@pytest.mark.parametrize(
    "vhost", ["no-such-vhost", "", "/ "], ids=["missing", "empty", "slash-space"]
)
def test_r09_open_unknown_vhost(connect: Connect, vhost: str) -> None:
    """connection.open of a vhost that does not exist: 530 NOT_ALLOWED "vhost X not found"
    on connection.open (10/40)."""
    conn = connect()
    tune = until_tune(conn)
    conn.tune_ok(tune.channel_max, tune.frame_max, 0)
    conn.send_method(0, ConnectionOpen(vhost))
    close = conn.expect_connection_close(NOT_ALLOWED, class_id=10, method_id=40)
    assert "not found" in close.reply_text


RESTRICTED = {
    "vhosts": ("/", "restricted"),
    "users": (
        UserConfig(
            "guest",
            "guest",
            tags=("administrator",),
            permissions={"/": PermissionConfig(), "restricted": PermissionConfig()},
        ),
        UserConfig(
            "limited", "secret", tags=("management",), permissions={"/": PermissionConfig()}
        ),
    ),
}


@pytest.mark.parametrize("broker_and_canary", [RESTRICTED], indirect=True, ids=["restricted"])
def test_r10_open_vhost_without_permission(connect: Connect) -> None:
    """connection.open of an existing vhost the user may not use: 530 NOT_ALLOWED "access to
    vhost ... refused for user ..." on connection.open (10/40); the vhost it may use opens."""
    conn = connect()
    conn.send_header()
    conn.expect_method(ConnectionStart)
    conn.start_ok("limited", "secret")
    tune = conn.expect_method(ConnectionTune)
    conn.tune_ok(tune.channel_max, tune.frame_max, 0)
    conn.send_method(0, ConnectionOpen("restricted"))
    close = conn.expect_connection_close(NOT_ALLOWED, class_id=10, method_id=40)
    assert "access to vhost 'restricted' refused for user 'limited'" in close.reply_text
    allowed = connect()
    allowed.handshake("limited", "secret")
    allowed.open_channel(1)
    allowed.close_connection()


@pytest.mark.parametrize("stage", ["starting", "tuning"])
def test_r11_channel_frame_before_authentication(connect: Connect, stage: str) -> None:
    """A channel frame while the server waits for start-ok / tune-ok: 505 UNEXPECTED_FRAME or,
    as RabbitMQ does before authentication, a silent close; the channel is never opened."""
    conn = connect()
    if stage == "starting":
        start(conn)
    else:
        until_tune(conn)
    conn.send_method(1, ChannelOpen())
    expect_close_or_silence(conn, UNEXPECTED_FRAME)


def test_r11_channel_frame_before_connection_open(connect: Connect) -> None:
    """After tune-ok but before connection.open (RabbitMQ's ``opening`` state) a channel frame
    gets connection.close 505 UNEXPECTED_FRAME."""
    conn = connect()
    tune = until_tune(conn)
    conn.tune_ok(tune.channel_max, tune.frame_max, 0)
    conn.send_method(1, ChannelOpen())
    conn.expect_connection_close(UNEXPECTED_FRAME)


# == 12-17: framing ================================================================================


def test_r12_frame_larger_than_negotiated_frame_max(connect: Connect) -> None:
    """A frame payload above the negotiated frame_max (4096 here; RabbitMQ tolerates up to
    frame_max, an 8-byte fudge) is a fatal 501 FRAME_ERROR: nothing after it is processed (the
    channel.open sent right behind it is not answered). Variants: a 4097-byte method frame, a
    4097-byte body frame, a frame head declaring 2 GiB (refused without waiting for the payload);
    they run side by side to share the 3 s grace of a fatal error."""
    # A queue.declare padded with a big arguments table: payload 4097 bytes.
    args = method_arguments(QueueDeclare(queue="q"))[:-4]
    pad = 4097 - 4 - len(args) - 4
    big_method = method_frame(
        1, 50, 10, args + table_bytes(b"\x01pS" + U32.pack(pad - 7) + b"x" * (pad - 7))
    )
    assert len(big_method) - 8 == 4097
    variants = {
        "method+1": big_method,
        "body+1": publish_frames(1) + content_header(1, 5000) + body_frame(1, b"x" * 4097),
        "declared-2GiB": struct.pack(">BHI", FRAME_BODY, 1, 0x7FFF_FFF0) + b"x" * 100,
    }
    conns = {}
    for variant, bad in variants.items():
        conn = conns[variant] = connect()
        conn.handshake(frame_max=4096)
        conn.open_channel(1)
        conn.send(bad + encode_method(2, ChannelOpen()))
    expect_each(conns, lambda conn: conn.expect_connection_close(FRAME_ERROR))


@pytest.mark.parametrize("payload", [4088, 4096], ids=["frame_max-8", "frame_max"])
def test_r12_frame_at_negotiated_frame_max_is_accepted(connect: Connect, payload: int) -> None:
    """Control for row 12: body frames of frame_max - 8 bytes (what the spec allows) and of
    frame_max (RabbitMQ's fudge) are accepted."""
    conn = connect()
    conn.handshake(frame_max=4096)
    conn.open_channel(1)
    queue = declare_queue(conn, 1, "", exclusive=True)
    body = b"y" * payload
    conn.send(publish_frames(1, "", queue) + content_header(1, payload) + body_frame(1, body))
    conn.send_method(1, BasicGet(queue=queue, no_ack=True))
    conn.expect_method(BasicGetOk, channel=1)
    assert conn.expect_content(1)[1] == body


def test_r13_bad_frame_end_octet(connect: Connect) -> None:
    """A frame whose end octet is not 0xCE (0x00, 0xCD, 0xCF): fatal 501 FRAME_ERROR; the frame
    (a channel.open) is not acted on. Variants run side by side (3 s grace each)."""
    conns = {}
    for end in (0x00, 0xCD, 0xCF):
        conn = conns[f"end={end:#04x}"] = connect()
        conn.handshake()
        conn.send(frame(FRAME_METHOD, 2, encode_method(2, ChannelOpen())[7:-1], end=end))
    expect_each(conns, lambda conn: conn.expect_connection_close(FRAME_ERROR))


def test_r14_unknown_frame_type(connect: Connect) -> None:
    """Unknown frame types (0, 4, 9, 255) on channel 0 and on an open channel: 501 FRAME_ERROR
    (RabbitMQ ``unknown_frame``). Variants run side by side (a fatal error may take 3 s)."""
    conns = {}
    for frame_type in (0, 4, 9, 255):
        for channel in (0, 1):
            conn = conns[f"type={frame_type},channel={channel}"] = connect()
            conn.handshake()
            conn.open_channel(1)
            conn.send(frame(frame_type, channel, b"\x00\x01\x02\x03"))
    expect_each(conns, lambda conn: conn.expect_connection_close(FRAME_ERROR))


@pytest.mark.parametrize("channel", [1, 7], ids=["open-channel", "unopened-channel"])
def test_r15_heartbeat_on_nonzero_channel(amqp: RawAMQP, channel: int) -> None:
    """A heartbeat frame on a channel other than 0: 505 UNEXPECTED_FRAME."""
    amqp.send(heartbeat_frame(channel))
    amqp.expect_connection_close(UNEXPECTED_FRAME)


@pytest.mark.parametrize("payload", [b"x", b"\x00" * 16], ids=["1-byte", "16-bytes"])
def test_r16_heartbeat_with_payload(amqp: RawAMQP, payload: bytes) -> None:
    """A heartbeat frame with a payload is malformed: 501 FRAME_ERROR."""
    amqp.send(heartbeat_frame(0, payload))
    amqp.expect_connection_close(FRAME_ERROR)


@pytest.mark.parametrize(
    "broker_and_canary", [{"heartbeat": 1}], indirect=True, ids=["heartbeat=1s"]
)
def test_r17_missed_heartbeats_close_tcp(connect: Connect) -> None:
    """Negotiated heartbeat 1 s and a silent client: the broker sends heartbeats every
    timeout/2 and, once the client missed its heartbeats, closes TCP without connection.close
    (RabbitMQ: "missed heartbeats from client", between 1 and 2 timeouts)."""
    conn = connect()
    conn.handshake()
    assert conn.tune is not None
    assert conn.tune.heartbeat == 1
    began = time.monotonic()
    seen = conn.expect_socket_closed(timeout=7.0)
    elapsed = time.monotonic() - began
    assert not seen, f"expected a plain TCP close, got {[f.describe() for f in seen]}"
    # Not before a timeout; the upper bound (RabbitMQ: 2 timeouts) is made generous enough for
    # a loaded 2-core CI machine.
    assert 0.9 <= elapsed <= 6.0, f"closed after {elapsed:.2f}s with a 1s heartbeat"
    assert conn.heartbeats_received >= 2, "the broker did not send heartbeats every timeout/2"


@pytest.mark.parametrize(
    "broker_and_canary", [{"heartbeat": 1}], indirect=True, ids=["heartbeat=1s"]
)
def test_r17_client_heartbeats_keep_the_connection(connect: Connect) -> None:
    """Control for row 17: a client that sends only heartbeats (every 0.4 s) stays connected
    for 2.5 s (more than two timeouts) and receives the broker's heartbeats."""
    conn = connect()
    conn.handshake()
    conn.open_channel(1)
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:
        conn.send(heartbeat_frame())
        conn.expect_nothing(0.4)
    assert conn.heartbeats_received >= 3
    ping(conn, 1)
    conn.close_connection()


# == 18-21: methods that do not decode ============================================================


@pytest.mark.parametrize(
    ("class_id", "method_id"),
    [(99, 10), (60, 99), (0, 0), (65535, 65535)],
    ids=["unknown-class", "unknown-method", "zero", "max"],
)
def test_r18_unknown_method_id(amqp: RawAMQP, class_id: int, method_id: int) -> None:
    """A method frame with unknown class/method ids: 503 COMMAND_INVALID (or 540)."""
    amqp.send(method_frame(1, class_id, method_id, b"\x00" * 8))
    amqp.expect_connection_close((COMMAND_INVALID, NOT_IMPLEMENTED))


SERVER_ONLY = {
    "basic.deliver": (60, 60, True),
    "basic.get-empty": (60, 72, False),
    "queue.declare-ok": (50, 11, False),
    "channel.open-ok": (20, 11, False),
    "connection.tune-ok-on-channel-1": (10, 31, False),
}


@pytest.mark.parametrize("method", SERVER_ONLY.values(), ids=SERVER_ONLY.keys())
def test_r18_known_method_the_server_does_not_handle(
    amqp: RawAMQP, method: tuple[int, int, bool]
) -> None:
    """A known method the server never receives (server-to-client methods, connection methods on
    a channel): 503 COMMAND_INVALID "unimplemented method" naming the method."""
    class_id, method_id, has_content = method
    raw = method_arguments(METHODS[class_id << 16 | method_id]())
    data = method_frame(1, class_id, method_id, raw)
    if has_content:
        data += content_header(1, 0)
    amqp.send(data)
    amqp.expect_connection_close(COMMAND_INVALID, class_id=class_id, method_id=method_id)


CHANNEL0_OUT_OF_STATE: dict[str, Method] = {
    "start-ok": ConnectionStartOk({}, "PLAIN", "\0guest\0guest", "en_US"),
    "tune-ok": ConnectionTuneOk(2047, 131072, 0),
    "open": ConnectionOpen("/"),
}


@pytest.mark.parametrize("method", CHANNEL0_OUT_OF_STATE.values(), ids=CHANNEL0_OUT_OF_STATE.keys())
def test_r18_handshake_method_after_open(amqp: RawAMQP, method: Method) -> None:
    """A handshake method on channel 0 once the connection is open: RabbitMQ (``rabbit_reader``
    ``handle_method0`` fallback) closes with 504 CHANNEL_ERROR "unexpected method in connection
    state running", naming the method."""
    amqp.send_method(0, method)
    amqp.expect_connection_close(
        CHANNEL_ERROR, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )


def _shortstr_past_end() -> bytes:
    return struct.pack(">H", 0) + b"\xff" + b"q" * 10  # queue.declare: 255-byte name, 10 present


MALFORMED_ARGUMENTS: dict[str, tuple[int, int, bytes]] = {
    "shortstr-past-end": (50, 10, _shortstr_past_end()),
    "no-arguments": (50, 10, b""),
    "missing-bits-and-table": (50, 10, struct.pack(">H", 0) + b"\x01q"),
    "table-length-past-end": (50, 10, struct.pack(">H", 0) + b"\x01q\x00" + U32.pack(1000)),
    "truncated-u16": (60, 10, b"\x00"),  # basic.qos needs 7 bytes
    "trailing-bytes": (60, 10, struct.pack(">IHB", 0, 10, 0) + b"\x00junk"),
    "trailing-bytes-on-argless-method": (90, 10, b"junk"),  # tx.select
}


@pytest.mark.parametrize("case", MALFORMED_ARGUMENTS.values(), ids=MALFORMED_ARGUMENTS.keys())
def test_r19_truncated_or_overlong_method_arguments(
    amqp: RawAMQP, case: tuple[int, int, bytes]
) -> None:
    """Method arguments that do not decode exactly (a length past the end of the frame, too few
    bytes, or bytes left over; RabbitMQ's generated decoder matches the whole payload):
    501 FRAME_ERROR "cannot decode ..." naming the method."""
    class_id, method_id, raw = case
    amqp.send(method_frame(1, class_id, method_id, raw))
    amqp.expect_connection_close(FRAME_ERROR, class_id=class_id, method_id=method_id)


@pytest.mark.parametrize(
    "name", [b"\xff\xfe\xfd", b"q\xc0\xaf", b"\xed\xa0\x80"], ids=["ff", "overlong", "surrogate"]
)
def test_r20_invalid_utf8_in_queue_name(amqp: RawAMQP, name: bytes) -> None:
    """A queue name that is not UTF-8: 501 FRAME_ERROR "Malformed UTF-8 in shortstr"."""
    args = struct.pack(">H", 0) + bytes((len(name),)) + name + b"\x00" + U32.pack(0)
    amqp.send(method_frame(1, 50, 10, args))
    amqp.expect_connection_close(FRAME_ERROR)


BAD_TABLES = {
    "unknown-type-tag": table_bytes(b"\x01aZ\x00\x00"),
    "table-longer-than-frame": U32.pack(500) + b"\x01aI\x00\x00\x00\x01",
    "value-past-end": table_bytes(b"\x01aS" + U32.pack(100) + b"short"),
    "key-past-end": table_bytes(b"\x09ab"),
    "nested-tables-1000": nested_tables(1000),
    "nested-arrays-1000": nested_arrays(1000),
}


@pytest.mark.parametrize("raw_table", BAD_TABLES.values(), ids=BAD_TABLES.keys())
def test_r21_malformed_field_table(amqp: RawAMQP, raw_table: bytes) -> None:
    """A field table with an unknown type tag, a length beyond the payload or 1000 levels of
    nesting: 501 FRAME_ERROR (decoding must not recurse without bound)."""
    amqp.send(queue_declare_with_raw_arguments(1, raw_table))
    amqp.expect_connection_close(FRAME_ERROR)


# == 22-27: content assembly ======================================================================


@pytest.mark.parametrize("what", ["header", "body"])
def test_r22_content_without_publish(amqp: RawAMQP, what: str) -> None:
    """A content header (or body) frame with no basic.publish before it: 505 UNEXPECTED_FRAME
    "expected method frame, got non method frame instead"."""
    amqp.send(content_header(1, 3) if what == "header" else body_frame(1, b"abc"))
    amqp.expect_connection_close(UNEXPECTED_FRAME)


@pytest.mark.parametrize("next_frame", ["method", "body"])
def test_r23_publish_followed_by_something_else(amqp: RawAMQP, next_frame: str) -> None:
    """basic.publish followed by a method (or a body) instead of the content header: 505
    UNEXPECTED_FRAME "expected content header for class 60 ...", naming basic.publish (60/40)
    as RabbitMQ's assembler does."""
    after = (
        encode_method(1, QueueDeclare(queue="x")) if next_frame == "method" else body_frame(1, b"a")
    )
    amqp.send(publish_frames(1) + after)
    amqp.expect_connection_close(UNEXPECTED_FRAME, class_id=60, method_id=40)


@pytest.mark.parametrize(
    ("class_id", "weight"), [(50, 0), (0, 0), (60, 1)], ids=["class-50", "class-0", "weight-1"]
)
def test_r24_content_header_for_the_wrong_class_or_weight(
    amqp: RawAMQP, class_id: int, weight: int
) -> None:
    """A content header whose class is not the method's (60) or whose weight is not 0: 505
    UNEXPECTED_FRAME naming basic.publish."""
    amqp.send(publish_frames(1) + content_header(1, 0, class_id=class_id, weight=weight))
    amqp.expect_connection_close(UNEXPECTED_FRAME, class_id=60, method_id=40)


@pytest.mark.parametrize("interruption", ["queue.declare", "basic.publish", "header"])
def test_r25_method_while_body_is_owed(amqp: RawAMQP, interruption: str) -> None:
    """A method (or another header) on the channel while body bytes are still owed: 505
    UNEXPECTED_FRAME "expected content body ...", naming basic.publish."""
    after = {
        "queue.declare": encode_method(1, QueueDeclare(queue="x")),
        "basic.publish": publish_frames(1),
        "header": content_header(1, 3),
    }[interruption]
    amqp.send(publish_frames(1) + content_header(1, 10) + body_frame(1, b"12345") + after)
    amqp.expect_connection_close(UNEXPECTED_FRAME, class_id=60, method_id=40)


def test_r25_other_channels_may_interleave_with_content(amqp: RawAMQP) -> None:
    """Control for row 25: frames on another channel between a publish's header and body are
    legal; both channels carry on."""
    amqp.open_channel(2)
    queue = declare_queue(amqp, 1, "", exclusive=True)
    amqp.send(publish_frames(1, "", queue) + content_header(1, 10) + body_frame(1, b"12345"))
    ping(amqp, 2)
    amqp.send(body_frame(1, b"67890"))
    amqp.send_method(1, BasicGet(queue=queue, no_ack=True))
    amqp.expect_method(BasicGetOk, channel=1)
    assert amqp.expect_content(1)[1] == b"1234567890"


@pytest.mark.parametrize(
    "bodies", [[20], [6, 6], [9, 2]], ids=["one-big", "two-overlap", "last-overshoots"]
)
def test_r26_body_larger_than_declared(amqp: RawAMQP, bodies: list[int]) -> None:
    """Body frames carrying more than the header's body size: 501 FRAME_ERROR "content body frame
    exceeds remaining content size", naming basic.publish."""
    data = publish_frames(1) + content_header(1, 10)
    for size in bodies:
        data += body_frame(1, b"b" * size)
    amqp.send(data)
    amqp.expect_connection_close(FRAME_ERROR, class_id=60, method_id=40)


@pytest.mark.parametrize("in_flight", [0, 3], ids=["header-only", "bodies-in-flight"])
def test_r27_body_size_above_max_message_size(amqp: RawAMQP, in_flight: int) -> None:
    """A content header declaring more than max_message_size (16 MiB): channel.close 406
    PRECONDITION_FAILED "message size N is larger than configured max size M", sent before any
    body byte arrives; body frames already in flight are discarded and the connection goes on."""
    size = 16 * 1024 * 1024 + 1
    data = publish_frames(1) + content_header(1, size)
    for _ in range(in_flight):
        data += body_frame(1, b"z" * 4000)
    amqp.send(data)
    close = amqp.expect_channel_close(1, PRECONDITION_FAILED, class_id=60, method_id=40)
    assert str(size) in close.reply_text
    amqp.open_channel(1)
    ping(amqp, 1)


@pytest.mark.parametrize(
    "size", [(1 << 29) + 1, 1 << 40, (1 << 64) - 1], ids=["512MiB+1", "1TiB", "u64-max"]
)
def test_r27_body_size_above_hard_cap(amqp: RawAMQP, size: int) -> None:
    """A declared body size above RabbitMQ's hard cap of 512 MiB: 501 FRAME_ERROR "content body
    size N exceeds maximum allowed size" (``rabbit_command_assembler``), naming basic.publish."""
    amqp.send(publish_frames(1) + content_header(1, size))
    amqp.expect_connection_close(FRAME_ERROR, class_id=60, method_id=40)


# == 28-31: channels ==============================================================================


def test_r28_channel_beyond_negotiated_channel_max(connect: Connect) -> None:
    """With channel_max 2 negotiated, opening a third channel: 530 NOT_ALLOWED "number of
    channels opened (2) has reached the negotiated channel_max (2)"."""
    conn = connect()
    conn.handshake(channel_max=2)
    conn.open_channel(1)
    conn.open_channel(2)
    conn.send_method(3, ChannelOpen())
    close = conn.expect_connection_close(NOT_ALLOWED)
    assert "channel_max" in close.reply_text


NEVER_OPENED: dict[str, tuple[Method, bool]] = {
    "queue.declare": (QueueDeclare(queue="x"), False),
    "basic.publish": (BasicPublish(routing_key="x"), True),
    "basic.qos": (BasicQos(prefetch_count=1), False),
}


@pytest.mark.parametrize("case", NEVER_OPENED.values(), ids=NEVER_OPENED.keys())
@pytest.mark.parametrize("channel", [7, 65535])
def test_r29_method_on_never_opened_channel(
    amqp: RawAMQP, case: tuple[Method, bool], channel: int
) -> None:
    """A method on a channel that was never opened: 504 CHANNEL_ERROR "expected 'channel.open'",
    naming the method."""
    method, has_content = case
    data = encode_method(channel, method)
    if has_content:
        data += content_header(channel, 1) + body_frame(channel, b"x")
    amqp.send(data)
    close = amqp.expect_connection_close(
        CHANNEL_ERROR, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )
    assert "channel.open" in close.reply_text


def test_r30_second_channel_open(amqp: RawAMQP) -> None:
    """channel.open on an open channel: 504 CHANNEL_ERROR "second 'channel.open' seen"."""
    amqp.send_method(1, ChannelOpen())
    amqp.expect_connection_close(CHANNEL_ERROR, class_id=20, method_id=10)


def test_r31_frames_after_channel_close_are_discarded(
    amqp: RawAMQP, name: Callable[[str], str]
) -> None:
    """After the server sent channel.close it discards everything on that channel but close /
    close-ok; other channels carry on, and the channel can be reopened after close-ok."""
    amqp.open_channel(2)
    amqp.send_method(1, QueueDeclare(queue=name("missing"), passive=True))
    amqp.expect_channel_close(1, NOT_FOUND, close_ok=False)
    amqp.send(
        encode_method(1, QueueDeclare(queue=name("declared-after-close")))
        + publish_frames(1, "", "x")
        + content_header(1, 3)
        + body_frame(1, b"abc")
        + encode_method(1, BasicGet(queue="x"))
    )
    ping(amqp, 2)  # the first thing to come back is channel 2's answer
    amqp.send_method(1, ChannelCloseOk())
    amqp.open_channel(1)
    ping(amqp, 1)
    amqp.send_method(2, QueueDeclare(queue=name("declared-after-close"), passive=True))
    amqp.expect_channel_close(2, NOT_FOUND)


def test_r31_channel_open_while_the_channel_is_closing(amqp: RawAMQP) -> None:
    """channel.open on a channel the server is closing (before the client's close-ok) is a
    second channel.open: 504 CHANNEL_ERROR on the connection, as RabbitMQ 3.10.8 answers."""
    amqp.send_method(1, QueueDeclare(queue="missing-for-r31", passive=True))
    amqp.expect_channel_close(1, NOT_FOUND, close_ok=False)
    amqp.send_method(1, ChannelOpen())
    amqp.expect_connection_close(CHANNEL_ERROR, class_id=20, method_id=10)


@pytest.mark.parametrize("answer", ["close-ok", "crossing-close"])
def test_r31_frames_after_connection_close_are_discarded(
    connect: Connect, amqp: RawAMQP, answer: str, name: Callable[[str], str]
) -> None:
    """After the server sent connection.close it discards everything but close / close-ok: a
    crossing connection.close gets close-ok, and after our close-ok the socket closes."""
    amqp.send_method(9, QueueDeclare(queue="x"))
    amqp.expect_connection_close(CHANNEL_ERROR, close_ok=False)
    amqp.send(
        encode_method(2, ChannelOpen())
        + encode_method(1, QueueDeclare(queue=name("declared-after-close")))
        + publish_frames(1, "", "x")
        + content_header(1, 3)
        + body_frame(1, b"abc")
        + heartbeat_frame()
        + encode_method(0, ConnectionOpen("/"))
    )
    amqp.expect_nothing(0.3)
    if answer == "crossing-close":
        amqp.send_method(0, ConnectionClose(200, "bye", 0, 0))
        amqp.expect_method(ConnectionCloseOk, channel=0)
    amqp.send_method(0, ConnectionCloseOk())
    amqp.expect_socket_closed(CLOSE_GRACE)
    other = connect()
    other.handshake()
    other.open_channel(1)
    other.send_method(1, QueueDeclare(queue=name("declared-after-close"), passive=True))
    other.expect_channel_close(1, NOT_FOUND)


def test_hard_error_then_client_silence_closes_socket(amqp: RawAMQP) -> None:
    """After connection.close, a client that never answers close-ok is cut off within ~3 s."""
    amqp.send_method(9, QueueDeclare(queue="x"))
    amqp.expect_connection_close(CHANNEL_ERROR, close_ok=False)
    began = time.monotonic()
    amqp.expect_socket_closed(CLOSE_GRACE)
    assert time.monotonic() - began <= CLOSE_GRACE


# == 32-40: channel semantics =====================================================================


def test_r32_publish_to_missing_exchange(amqp: RawAMQP) -> None:
    """basic.publish to an exchange that does not exist: channel.close 404 NOT_FOUND on
    basic.publish (60/40); the connection carries on."""
    amqp.publish(1, "no-such-exchange", "rk", b"lost")
    close = amqp.expect_channel_close(1, NOT_FOUND, class_id=60, method_id=40)
    assert "no-such-exchange" in close.reply_text
    amqp.open_channel(1)
    ping(amqp, 1)


MISSING: dict[str, Method] = {
    "queue.declare-passive": QueueDeclare(queue="missing", passive=True),
    "exchange.declare-passive": ExchangeDeclare(exchange="missing", type="direct", passive=True),
    "queue.bind-missing-queue": QueueBind(queue="missing", exchange="amq.direct"),
    "queue.bind-missing-exchange": QueueBind(queue="present", exchange="missing"),
    "queue.purge": QueuePurge(queue="missing"),
    "exchange.bind-missing-source": ExchangeBind(destination="amq.direct", source="missing"),
    "exchange.bind-missing-destination": ExchangeBind(destination="missing", source="amq.direct"),
    "basic.consume": BasicConsume(queue="missing"),
    "basic.get": BasicGet(queue="missing"),
}


@pytest.mark.parametrize("method", MISSING.values(), ids=MISSING.keys())
def test_r33_operation_on_missing_entity(
    amqp: RawAMQP, method: Method, name: Callable[[str], str]
) -> None:
    """Passive declare, bind, unbind, purge, consume or get of a missing queue/exchange:
    channel.close 404 NOT_FOUND naming the method."""
    declare_queue(amqp, 1, name("present"))
    amqp.send_method(1, scoped(method, name))
    amqp.expect_channel_close(1, NOT_FOUND, class_id=method.CLASS_ID, method_id=method.METHOD_ID)


@pytest.mark.parametrize(
    ("method", "reply"),
    [
        (QueueDelete(queue="missing"), QueueDeleteOk),
        (ExchangeDelete(exchange="missing"), ExchangeDeleteOk),
        (QueueUnbind(queue="missing", exchange="amq.direct"), QueueUnbindOk),
        (QueueUnbind(queue="present", exchange="missing"), QueueUnbindOk),
        (ExchangeUnbind(destination="missing", source="amq.direct"), ExchangeUnbindOk),
    ],
    ids=[
        "queue.delete",
        "exchange.delete",
        "queue.unbind-missing-queue",
        "queue.unbind-missing-exchange",
        "exchange.unbind-missing",
    ],
)
def test_r33_delete_or_unbind_of_missing_entity_succeeds(
    amqp: RawAMQP, method: Method, reply: type[Method], name: Callable[[str], str]
) -> None:
    """Deleting a missing queue or exchange, or unbinding from one: the spec says 404,
    RabbitMQ (checked against 3.10.8: delete and unbind are idempotent) answers the ok, and
    so must we."""
    declare_queue(amqp, 1, name("present"))
    amqp.call(1, scoped(method, name), reply)


RESERVED: dict[str, Method] = {
    "queue.declare-amq.foo": QueueDeclare(queue="amq.foo"),
    "exchange.declare-amq.foo": ExchangeDeclare(exchange="amq.foo", type="direct"),
    "exchange.declare-default": ExchangeDeclare(exchange="", type="direct"),
    "exchange.declare-default-passive": ExchangeDeclare(exchange="", type="direct", passive=True),
    "exchange.delete-amq.direct": ExchangeDelete(exchange="amq.direct"),
    "exchange.delete-amq.foo": ExchangeDelete(exchange="amq.foo"),
    "exchange.delete-default": ExchangeDelete(exchange=""),
    "queue.bind-default": QueueBind(queue="present", exchange="", routing_key="present"),
    "queue.unbind-default": QueueUnbind(queue="present", exchange="", routing_key="present"),
    "exchange.bind-default-source": ExchangeBind(destination="amq.direct", source=""),
    "exchange.bind-default-destination": ExchangeBind(destination="", source="amq.direct"),
}


@pytest.mark.parametrize("method", RESERVED.values(), ids=RESERVED.keys())
def test_r34_reserved_names_and_default_exchange(
    amqp: RawAMQP, method: Method, name: Callable[[str], str]
) -> None:
    """Declaring an ``amq.*`` queue/exchange, deleting an ``amq.*`` exchange, or touching the
    default exchange other than by publishing (RabbitMQ ``check_not_default_exchange``, also
    for passive declares): channel.close 403 ACCESS_REFUSED naming the method."""
    declare_queue(amqp, 1, name("present"))
    amqp.send_method(1, scoped(method, name))
    amqp.expect_channel_close(
        1, ACCESS_REFUSED, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )


def test_r34_redeclare_server_named_queue_by_name_is_refused(amqp: RawAMQP) -> None:
    """A non-passive declare of an existing ``amq.gen-*`` queue by its name: 403 (RabbitMQ checks
    the reserved prefix before looking the queue up)."""
    name = declare_queue(amqp, 1, "", exclusive=True)
    assert name.startswith("amq.gen-")
    amqp.send_method(1, QueueDeclare(queue=name, exclusive=True))
    amqp.expect_channel_close(1, ACCESS_REFUSED, class_id=50, method_id=10)


@pytest.mark.parametrize(
    "method",
    [
        ExchangeDeclare(exchange="amq.direct", type="direct", durable=True),
        ExchangeDeclare(exchange="amq.topic", type="topic", passive=True),
    ],
    ids=["amq.direct-equivalent", "amq.topic-passive"],
)
def test_r34_declaring_existing_amq_exchange_is_allowed(amqp: RawAMQP, method: Method) -> None:
    """Control for row 34: the spec allows declaring an ``amq.*`` exchange that already exists
    (passive or equivalent), and RabbitMQ only checks the prefix when creating one."""
    amqp.call(1, method, ExchangeDeclareOk)


INEQUIVALENT: dict[str, tuple[Method, Method, int]] = {
    "queue-durable": (
        QueueDeclare(queue="q", durable=True),
        QueueDeclare(queue="q", durable=False),
        PRECONDITION_FAILED,
    ),
    "queue-auto-delete": (
        QueueDeclare(queue="q"),
        QueueDeclare(queue="q", auto_delete=True),
        PRECONDITION_FAILED,
    ),
    "queue-arguments": (
        QueueDeclare(queue="q", arguments={"x-message-ttl": 1000}),
        QueueDeclare(queue="q", arguments={"x-message-ttl": 2000}),
        PRECONDITION_FAILED,
    ),
    "queue-type": (
        QueueDeclare(queue="q"),
        QueueDeclare(queue="q", arguments={"x-queue-type": "quorum"}),
        PRECONDITION_FAILED,
    ),
    # RabbitMQ's assert_equivalence checks exclusivity first, strictly: 405, not 406.
    "queue-exclusive-then-not": (
        QueueDeclare(queue="q", exclusive=True),
        QueueDeclare(queue="q", exclusive=False),
        RESOURCE_LOCKED,
    ),
    "queue-not-exclusive-then-exclusive": (
        QueueDeclare(queue="q"),
        QueueDeclare(queue="q", exclusive=True),
        RESOURCE_LOCKED,
    ),
    "exchange-type": (
        ExchangeDeclare(exchange="x", type="direct"),
        ExchangeDeclare(exchange="x", type="fanout"),
        PRECONDITION_FAILED,
    ),
    "exchange-durable": (
        ExchangeDeclare(exchange="x", type="direct", durable=True),
        ExchangeDeclare(exchange="x", type="direct"),
        PRECONDITION_FAILED,
    ),
}


@pytest.mark.parametrize("case", INEQUIVALENT.values(), ids=INEQUIVALENT.keys())
def test_r35_inequivalent_redeclare(
    amqp: RawAMQP, case: tuple[Method, Method, int], name: Callable[[str], str]
) -> None:
    """Redeclaring with different durable / auto-delete / arguments / queue type / exchange type:
    channel.close 406 PRECONDITION_FAILED "inequivalent arg ..."; different exclusivity:
    405 RESOURCE_LOCKED (RabbitMQ ``check_exclusive_access(Q, Owner, strict)``)."""
    first, second, code = (scoped(case[0], name), scoped(case[1], name), case[2])
    reply = QueueDeclareOk if isinstance(first, QueueDeclare) else ExchangeDeclareOk
    amqp.call(1, first, reply)
    amqp.send_method(1, second)
    amqp.expect_channel_close(1, code, class_id=second.CLASS_ID, method_id=second.METHOD_ID)


def test_r35_unknown_exchange_type(amqp: RawAMQP) -> None:
    """An unknown exchange type: 503 COMMAND_INVALID (a connection error) on exchange.declare."""
    amqp.send_method(1, ExchangeDeclare(exchange="x", type="no-such-type"))
    amqp.expect_connection_close(COMMAND_INVALID, class_id=40, method_id=10)


EXCLUSIVE_OPS: dict[str, Method] = {
    "queue.declare": QueueDeclare(queue="owned", exclusive=True),
    "queue.declare-passive": QueueDeclare(queue="owned", passive=True),
    "queue.bind": QueueBind(queue="owned", exchange="amq.direct", routing_key="k"),
    "queue.unbind": QueueUnbind(queue="owned", exchange="amq.direct", routing_key="k"),
    "queue.purge": QueuePurge(queue="owned"),
    "queue.delete": QueueDelete(queue="owned"),
    "basic.consume": BasicConsume(queue="owned"),
    "basic.get": BasicGet(queue="owned"),
}


@pytest.mark.parametrize("method", EXCLUSIVE_OPS.values(), ids=EXCLUSIVE_OPS.keys())
def test_r36_exclusive_queue_from_another_connection(
    connect: Connect, amqp: RawAMQP, method: Method, name: Callable[[str], str]
) -> None:
    """Any use of another connection's exclusive queue: channel.close 405 RESOURCE_LOCKED
    "cannot obtain exclusive access to locked queue"; the owner is unaffected."""
    declare_queue(amqp, 1, name("owned"), exclusive=True)
    amqp.call(
        1, QueueBind(queue=name("owned"), exchange="amq.direct", routing_key="k"), QueueBindOk
    )
    other = connect()
    other.handshake()
    other.open_channel(1)
    method = scoped(method, name)
    other.send_method(1, method)
    close = other.expect_channel_close(
        1, RESOURCE_LOCKED, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )
    assert "exclusive" in close.reply_text
    declare_queue(amqp, 1, name("owned"), passive=True)


def _ack_case(amqp: RawAMQP, case: str) -> tuple[int, Method]:
    """Set up the deliveries a bad ack case refers to; returns (channel, the bad method)."""
    queue = declare_queue(amqp, 1, "", exclusive=True)
    if case == "double-ack":
        tag = publish_and_get(amqp, 1, queue)
        amqp.send_method(1, BasicAck(tag))
        return 1, BasicAck(tag)
    if case == "ack-on-other-channel":
        tag = publish_and_get(amqp, 1, queue)
        amqp.open_channel(2)
        return 2, BasicAck(tag)
    if case == "ack-after-auto-ack":
        tag = publish_and_get(amqp, 1, queue, no_ack=True)
        return 1, BasicAck(tag)
    return 1, {
        "ack-unknown": BasicAck(99),
        "ack-unknown-multiple": BasicAck(99, multiple=True),
        "ack-zero": BasicAck(0),
        "nack-unknown": BasicNack(99),
        "reject-unknown": BasicReject(99),
    }[case]


ACK_CASES = [
    "ack-unknown",
    "ack-unknown-multiple",
    "ack-zero",
    "nack-unknown",
    "reject-unknown",
    "double-ack",
    "ack-on-other-channel",
    "ack-after-auto-ack",
]


@pytest.mark.parametrize("case", ACK_CASES)
def test_r37_ack_of_unknown_delivery_tag(amqp: RawAMQP, case: str) -> None:
    """Ack / nack / reject of a tag the channel does not have outstanding (unknown, already
    acked, another channel's, auto-acked): channel.close 406 PRECONDITION_FAILED "unknown
    delivery tag N"."""
    channel, method = _ack_case(amqp, case)
    amqp.send_method(channel, method)
    close = amqp.expect_channel_close(
        channel, PRECONDITION_FAILED, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )
    assert "unknown delivery tag" in close.reply_text


def test_r38_reused_consumer_tag(amqp: RawAMQP) -> None:
    """basic.consume with a consumer tag already in use on the channel: connection.close 530
    NOT_ALLOWED "attempt to reuse consumer tag"."""
    queue = declare_queue(amqp, 1, "", exclusive=True)
    amqp.call(1, BasicConsume(queue=queue, consumer_tag="ctag"), BasicConsumeOk)
    amqp.send_method(1, BasicConsume(queue=queue, consumer_tag="ctag"))
    amqp.expect_connection_close(NOT_ALLOWED, class_id=60, method_id=20)


@pytest.mark.parametrize(
    "first_exclusive", [False, True], ids=["then-exclusive", "after-exclusive"]
)
def test_r38_exclusive_consumer_conflict(
    amqp: RawAMQP, first_exclusive: bool, name: Callable[[str], str]
) -> None:
    """An exclusive consume on a queue that has consumers, or any consume on a queue with an
    exclusive consumer: channel.close 403 ACCESS_REFUSED "... in exclusive use"."""
    queue = declare_queue(amqp, 1, name("shared"))
    amqp.call(1, BasicConsume(queue=queue, exclusive=first_exclusive), BasicConsumeOk)
    amqp.open_channel(2)
    second = BasicConsume(queue=queue, exclusive=not first_exclusive)
    amqp.send_method(2, second)
    amqp.expect_channel_close(2, ACCESS_REFUSED, class_id=60, method_id=20)
    ping(amqp, 1)


PRECONDITIONS = [
    "queue.delete-if-empty",
    "queue.delete-if-unused",
    "exchange.delete-if-unused",
    "tx.commit-non-tx",
    "tx.rollback-non-tx",
    "confirm.select-on-tx",
    "tx.select-on-confirm",
]


@pytest.mark.parametrize("case", PRECONDITIONS)
def test_r39_precondition_failed(amqp: RawAMQP, case: str, name: Callable[[str], str]) -> None:
    """if-empty / if-unused violated, commit/rollback on a non-transactional channel, switching
    between tx and confirm mode: channel.close 406 PRECONDITION_FAILED naming the method."""
    method: Method
    if case == "queue.delete-if-empty":
        queue = declare_queue(amqp, 1, name("full"))
        amqp.publish(1, "", queue, b"m")
        method = QueueDelete(queue=queue, if_empty=True)
    elif case == "queue.delete-if-unused":
        queue = declare_queue(amqp, 1, name("used"))
        amqp.call(1, BasicConsume(queue=queue), BasicConsumeOk)
        method = QueueDelete(queue=queue, if_unused=True)
    elif case == "exchange.delete-if-unused":
        bound, dest = name("bound"), name("dest")
        amqp.call(1, ExchangeDeclare(exchange=bound, type="direct"), ExchangeDeclareOk)
        declare_queue(amqp, 1, dest)
        amqp.call(1, QueueBind(queue=dest, exchange=bound, routing_key="k"), QueueBindOk)
        method = ExchangeDelete(exchange=bound, if_unused=True)
    elif case == "tx.commit-non-tx":
        method = TxCommit()
    elif case == "tx.rollback-non-tx":
        method = TxRollback()
    elif case == "confirm.select-on-tx":
        amqp.call(1, TxSelect(), TxSelectOk)
        method = ConfirmSelect()
    else:
        amqp.call(1, ConfirmSelect(), ConfirmSelectOk)
        method = TxSelect()
    amqp.send_method(1, method)
    amqp.expect_channel_close(
        1, PRECONDITION_FAILED, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )


NOT_IMPLEMENTED_CASES: dict[str, Method] = {
    "basic.qos-prefetch-size": BasicQos(prefetch_size=1, prefetch_count=10),
    "basic.publish-immediate": BasicPublish(routing_key="x", immediate=True),
    "channel.flow-inactive": ChannelFlow(active=False),
    "basic.recover-async-no-requeue": BasicRecoverAsync(requeue=False),
    "basic.recover-no-requeue": BasicRecover(requeue=False),
}


@pytest.mark.parametrize("method", NOT_IMPLEMENTED_CASES.values(), ids=NOT_IMPLEMENTED_CASES.keys())
def test_r40_not_implemented(amqp: RawAMQP, method: Method) -> None:
    """basic.qos prefetch_size != 0, publish immediate=true, channel.flow active=false,
    basic.recover(-async) requeue=false: connection.close 540 NOT_IMPLEMENTED naming the
    method."""
    data = encode_method(1, method)
    if isinstance(method, BasicPublish):
        data += content_header(1, 1) + body_frame(1, b"i")
    amqp.send(data)
    amqp.expect_connection_close(
        NOT_IMPLEMENTED, class_id=method.CLASS_ID, method_id=method.METHOD_ID
    )


def test_control_basic_session_works(amqp: RawAMQP) -> None:
    """Control: the raw client itself is sane (declare, publish, get, qos, close)."""
    queue = declare_queue(amqp, 1, "", exclusive=True)
    tag = publish_and_get(amqp, 1, queue)
    amqp.send_method(1, BasicAck(tag))
    amqp.call(1, BasicQos(prefetch_count=5), BasicQosOk)
    amqp.send_method(1, BasicGet(queue=queue))
    amqp.expect_method(BasicGetEmpty, channel=1)
    amqp.call(1, ChannelClose(200, "bye", 0, 0), ChannelCloseOk)
    amqp.send_method(1, ChannelOpen())
    amqp.expect_method(ChannelOpenOk, channel=1)
    amqp.close_connection()
