"""A flood of wrong logins from one address (a NAT, a proxy, Kubernetes SNAT: every client
behind it shares 127.0.0.1 here) does not refuse the right passwords of the clients behind it,
and still slows the guessing: the broker in its own process, ``flood.py`` (wrong passwords for
``guest`` over AMQP and HTTP) in another, and legitimate pika and HTTP logins meanwhile, both of
another user and of the flooded user itself."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pika
import pytest
import trio

from tests.support.polling import file_containing
from tqbroker.auth import (
    AuthChain,
    Authenticator,
    LoginRefused,
    Peer,
    User,
    UserDb,
    hash_password,
    internal,
)
from tqbroker.auth.authenticator import RATE_LIMITED
from tqbroker.testing import BrokerProcess, start_broker_process

pytestmark = pytest.mark.timeout(120)

FLOOD = Path(__file__).with_name("flood.py")
LOGINS = 8


def _amqp_login(broker: BrokerProcess, user: str, password: str) -> bool:
    params = pika.ConnectionParameters(
        broker.host,
        broker.port,
        "/",
        pika.PlainCredentials(user, password),
        connection_attempts=1,
        socket_timeout=10,
        blocked_connection_timeout=10,
    )
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def test_a_flood_of_wrong_logins_from_one_address_refuses_no_right_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TQBROKER_AUTH_FAILURE_DELAY", "0.1")  # the flood's pace: ~100/s
    log = tmp_path / "broker.log"
    with start_broker_process(tmp_path / "data", stderr=log) as broker:
        with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=10) as api:
            api.put(
                "/api/users/bob", json={"password": "bob-pw", "tags": "management"}
            ).raise_for_status()
            api.put(
                "/api/permissions/%2F/bob", json={"configure": ".*", "write": ".*", "read": ".*"}
            ).raise_for_status()
        assert _amqp_login(broker, "guest", "guest")  # the flooded user logged in before
        flood = subprocess.Popen(
            [
                sys.executable,
                str(FLOOD),
                str(broker.port),
                str(broker.http_port),
                "8",
                "15",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        started = time.monotonic()
        file_containing(log, "user 'guest' - too many failed logins")  # the allowance spent
        results: dict[str, list[bool]] = {"bob amqp": [], "bob http": [], "guest amqp": []}
        with httpx.Client(base_url=broker.http_url, timeout=10) as web:
            for _ in range(LOGINS):
                results["bob amqp"].append(_amqp_login(broker, "bob", "bob-pw"))
                whoami = web.get("/api/whoami", auth=("bob", "bob-pw"))
                results["bob http"].append(whoami.status_code == 200)
                results["guest amqp"].append(_amqp_login(broker, "guest", "guest"))
                time.sleep(0.3)
        assert flood.poll() is None, "the flood ended before the logins did"
        logins_done = time.monotonic() - started
        attempts = [int(n) for n in flood.communicate()[0].split()]
        elapsed = time.monotonic() - started
    refusals = log.read_text()
    checked = refusals.count("user 'guest' - invalid credentials")
    limited = refusals.count("user 'guest' - too many failed logins")
    accepted = ", ".join(f"{key} {sum(ok)} of {len(ok)}" for key, ok in results.items())
    print(
        f"wrong logins for guest: {sum(attempts) / elapsed:.0f}/s ({attempts} AMQP, HTTP); "
        f"logins done at {logins_done:.1f} s; password checked {checked}, refused by the "
        f"allowance {limited}; right passwords accepted: {accepted}"
    )
    assert sum(attempts) / elapsed > 20
    assert results == {key: [True] * LOGINS for key in results}
    # Guessing guest's password from this address is still slowed: the burst (10), then about
    # one check a second (the rate); the rest refused before any check.
    assert checked <= 10 + 1.0 * elapsed + 5
    assert limited > 5 * checked


def test_the_allowance_is_per_user_and_a_recent_success_passes_an_empty_one() -> None:
    """Unit level: wrong logins for alice and for unknown users from one address leave bob's
    allowance whole; bob's own allowance spent, his right password, which the cache knows (he
    logged in a moment ago), is accepted unchecked; carol's, never seen, is refused unchecked."""
    db = UserDb()
    for name in ("alice", "bob", "carol"):
        db.put_user(User(name, hash_password(f"{name}-pw")))
    checks: list[str] = []
    backend = internal.InternalBackend(db)
    real = backend.authenticate

    async def counting(username: str, password: str | None, peer: Peer) -> object:
        checks.append(username)
        return await real(username, password, peer)

    backend.authenticate = counting  # type: ignore[method-assign,assignment]
    authenticator = Authenticator(
        AuthChain([("internal", backend)]), failure_delay=0, failure_burst=3, failure_rate=0.001
    )
    nat = Peer("192.0.2.7")

    async def refused(username: str, password: str) -> str:
        with pytest.raises(LoginRefused) as refusal:
            await authenticator.login(username, password, nat)
        return refusal.value.reason

    async def main() -> None:
        for n in range(20):
            await refused("alice", f"guess-{n}")
            await refused(f"nobody-{n}", "x")
        assert (await authenticator.login("bob", "bob-pw", nat)).name == "bob"
        for n in range(3):
            await refused("bob", f"guess-{n}")
        checked = len(checks)
        assert await refused("bob", "guess-3") == RATE_LIMITED
        assert (await authenticator.login("bob", "bob-pw", nat)).name == "bob"  # cached
        assert len(checks) == checked
        for n in range(3):
            await refused("carol", f"guess-{n}")
        checked = len(checks)
        assert await refused("carol", "carol-pw") == RATE_LIMITED  # not known: not checked
        assert len(checks) == checked

    trio.run(main)
