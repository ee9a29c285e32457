"""Permissions matched as RabbitMQ matches them (unanchored search; ``""`` is ``^$``), topic
permission variables, the user database's mutations, generation and persistence, the backend
chain and the per-channel permission cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tqbroker.auth import (
    AuthBackendError,
    AuthChain,
    AuthConfigError,
    Authenticator,
    AuthUser,
    InternalBackend,
    LoginRefused,
    Peer,
    Permission,
    PermissionCache,
    TopicPermission,
    User,
    UserDb,
    UserDbError,
    hash_password,
    load_chain,
    refusal_text,
    topic_refusal_text,
)
from tqbroker.auth.authenticator import BACKEND_UNAVAILABLE
from tqbroker.auth.internal import parse_tags
from tqbroker.auth.model import PatternError

PEER = Peer("127.0.0.1")


def test_patterns_are_an_unanchored_search() -> None:
    # Checked against RabbitMQ 3.10 (tests/auth/test_oracle.py): configure "a" lets "xa" in.
    p = Permission("a", "^$", "")
    assert p.allows("configure", "xa")
    assert p.allows("configure", "ab")
    assert not p.allows("configure", "b")
    assert not p.allows("write", "anything")
    assert not p.allows("read", "anything")
    assert Permission().allows("read", "")


def test_a_bad_pattern_is_refused() -> None:
    with pytest.raises(PatternError, match="invalid permission pattern"):
        Permission("(")


def test_topic_patterns_expand_variables_escaped() -> None:
    topic = TopicPermission("amq.topic", write="^{username}\\.", read=".*")
    assert topic.allows("write", "bob.x", {"username": "bob"})
    assert not topic.allows("write", "eve.x", {"username": "bob"})
    assert not topic.allows("write", "aXb.x", {"username": "a.b"})  # "." in a name is literal


def test_refusal_texts_are_rabbitmqs() -> None:
    assert refusal_text("queue", "b", "/", "bob") == (
        "access to queue 'b' in vhost '/' refused for user 'bob'"
    )
    assert topic_refusal_text("yy", "amq.topic", "/", "bob") == (
        "access to topic 'yy' in exchange 'amq.topic' in vhost '/' refused for user 'bob'"
    )


def _db() -> UserDb:
    db = UserDb()
    db.put_user(User("bob", hash_password("pw"), tags=frozenset({"management"})))
    db.set_permissions("bob", "/", Permission("^bob-", ".*", ".*"))
    db.set_topic_permissions("bob", "/", TopicPermission("amq.topic", "^x", ".*"))
    return db


def test_every_mutation_bumps_the_generation() -> None:
    db = _db()
    seen = [db.generation]
    for change in (
        lambda: db.set_permissions("bob", "v", Permission()),
        lambda: db.clear_permissions("bob", "v"),
        lambda: db.clear_topic_permissions("bob", "/", "amq.topic"),
        lambda: db.delete_vhost("/"),
        lambda: db.delete_user("bob"),
    ):
        change()
        assert db.generation > seen[-1]
        seen.append(db.generation)
    with pytest.raises(UserDbError, match="no user 'bob'"):
        db.set_permissions("bob", "/", Permission())


def test_the_store_round_trips_through_its_file(tmp_path: Path) -> None:
    db = _db()
    trio.run(db.save, tmp_path)
    again = UserDb()
    assert again.load(tmp_path)
    assert again.to_json() == db.to_json()
    assert again.to_json()["users"][0]["tags"] == ["management"]  # a list, as RabbitMQ 3.10
    assert not UserDb().load(tmp_path / "nothing")


def test_old_string_tags_and_bad_entries() -> None:
    assert parse_tags("administrator, monitoring") == {"administrator", "monitoring"}
    db = UserDb()
    with pytest.raises(UserDbError, match="user 'x': password_hash is not base64"):
        db.load_json({"users": [{"name": "x", "password_hash": "!!", "tags": []}]})
    assert db.get("x") is None  # nothing applied
    assert db.generation == 0


def test_the_chain_and_the_internal_backend() -> None:
    chain = AuthChain([("internal", InternalBackend(_db()))])

    async def main() -> None:
        bob = await chain.authenticate("bob", "pw", PEER)
        assert bob == AuthUser("bob", frozenset({"management"}), "internal")
        assert await chain.authenticate("bob", "wrong", PEER) is None
        assert await chain.authenticate("nobody", "pw", PEER) is None
        assert await chain.authenticate("bob", None, PEER) == bob  # EXTERNAL: the user exists
        assert await chain.authenticate("nobody", None, PEER) is None
        assert await chain.check_vhost(bob, "/", PEER)
        assert not await chain.check_vhost(bob, "other", PEER)
        assert await chain.check_resource(bob, "/", "queue", "bob-q", "configure")
        assert not await chain.check_resource(bob, "/", "queue", "q", "configure")
        assert await chain.check_topic(bob, "/", "amq.topic", "x.1", "write")
        assert not await chain.check_topic(bob, "/", "amq.topic", "y.1", "write")
        assert await chain.check_topic(bob, "/", "other.topic", "y.1", "write")  # none set

    trio.run(main)


def test_a_user_without_a_password_logs_in_by_external_only() -> None:
    db = UserDb()
    db.put_user(User("cert-user"))
    backend = InternalBackend(db)

    async def main() -> None:
        assert await backend.authenticate("cert-user", "", PEER) is None
        assert await backend.authenticate("cert-user", None, PEER) is not None

    trio.run(main)


def test_the_permission_cache_follows_the_generation() -> None:
    db = _db()
    chain = AuthChain([("internal", InternalBackend(db))])
    bob = AuthUser("bob", frozenset(), "internal")
    cache = PermissionCache(chain, bob, "/")

    async def main() -> None:
        assert not await cache.check("queue", "q", "configure")
        db.set_permissions("bob", "/", Permission())
        assert await cache.check("queue", "q", "configure")  # the change seen at once

    trio.run(main)


def test_an_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(AuthConfigError, match=r"unknown backend 'ldap' \(installed: .*internal"):
        load_chain(["ldap"])
    chain = load_chain(["internal"])  # through the entry point, as a third party's
    assert isinstance(chain.backends["internal"], InternalBackend)


def test_a_changed_password_is_not_served_from_the_login_cache() -> None:
    db = _db()
    authenticator = Authenticator(
        AuthChain([("internal", InternalBackend(db))]), failure_delay=0, failure_burst=100
    )

    async def main() -> None:
        assert (await authenticator.login("bob", "pw", PEER)).name == "bob"
        db.put_user(User("bob", hash_password("new")))
        with pytest.raises(LoginRefused):
            await authenticator.login("bob", "pw", PEER)
        assert (await authenticator.login("bob", "new", PEER)).name == "bob"

    trio.run(main)


def test_loopback_users_log_in_from_a_loopback_peer_only() -> None:
    db = _db()
    authenticator = Authenticator(
        AuthChain([("internal", InternalBackend(db))]), loopback_users=["bob"], failure_delay=0
    )

    async def main() -> None:
        for host in ("127.0.0.1", "127.8.0.1", "::1", "::ffff:127.0.0.1"):
            assert (await authenticator.login("bob", "pw", Peer(host))).name == "bob"
        with pytest.raises(LoginRefused) as refused:
            await authenticator.login("bob", "pw", Peer("192.0.2.1"))
        assert refused.value.loopback

    trio.run(main)


class _Down(InternalBackend):
    """The internal database behind a backend that can be made unable to answer."""

    down = True

    async def authenticate(
        self, username: str, password: str | None, peer: Peer
    ) -> AuthUser | None:
        if self.down:
            raise AuthBackendError("service unavailable")
        return await super().authenticate(username, password, peer)


def test_a_backend_that_cannot_answer_does_not_count_against_the_address() -> None:
    """An outage of the backend refuses logins, but does not use up the address's allowance
    of failed logins: once it answers again, the user logs in at once."""
    backend = _Down(_db())
    authenticator = Authenticator(
        AuthChain([("down", backend)]), failure_delay=0, failure_burst=2, failure_rate=0.001
    )

    async def main() -> None:
        for _ in range(5):
            with pytest.raises(LoginRefused) as refused:
                await authenticator.login("bob", "pw", PEER)
            assert refused.value.reason == BACKEND_UNAVAILABLE
        backend.down = False
        assert (await authenticator.login("bob", "pw", PEER)).name == "bob"

    trio.run(main)
