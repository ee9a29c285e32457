"""Against the loopback RabbitMQ 3.10 (``rabbitmq_oracle``): users move both ways with their
passwords (a RabbitMQ export imported into tqbroker logs in; a tqbroker hash imported into
RabbitMQ logs in), pattern matching is RabbitMQ's (an unanchored search), and the management
API refuses a user without a management tag with RabbitMQ's status and text."""

from __future__ import annotations

from pathlib import Path

import httpx
import pika
import pytest

from tests.support.rabbitmq_oracle import RabbitMQ
from tqbroker.auth import Permission, hash_password, refusal_text
from tqbroker.config import BrokerConfig
from tqbroker.testing import running_broker

pytestmark = pytest.mark.timeout(120)


def _login(host: str, port: int, user: str, password: str) -> bool:
    params = pika.ConnectionParameters(
        host, port, "/", pika.PlainCredentials(user, password), connection_attempts=1
    )
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.ProbableAuthenticationError:
        return False
    return True


def test_users_move_between_rabbitmq_and_tqbroker(
    rabbitmq_oracle: RabbitMQ, tmp_path: Path
) -> None:
    rabbit = httpx.Client(base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30)
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    assert rabbit.put(
        "/api/users/from-rabbit", json={"password": "r-pw", "tags": "management"}
    ).status_code in (201, 204)
    assert rabbit.put("/api/permissions/%2F/from-rabbit", json=grant).status_code in (201, 204)
    exported = rabbit.get("/api/definitions").json()
    users = [u for u in exported["users"] if u["name"] == "from-rabbit"]
    assert users[0]["tags"] == ["management"]  # 3.10 writes a list
    document = {
        "users": users,
        "permissions": [p for p in exported["permissions"] if p["user"] == "from-rabbit"],
    }
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    with running_broker(config) as ours:
        api = httpx.Client(base_url=ours.http_url, auth=("guest", "guest"), timeout=30)
        assert api.post("/api/definitions", json=document).status_code == 204
        assert _login(ours.host, ours.port, "from-rabbit", "r-pw")
        assert not _login(ours.host, ours.port, "from-rabbit", "wrong")
        whoami = httpx.get(f"{ours.http_url}/api/whoami", auth=("from-rabbit", "r-pw"))
        assert whoami.json() == {"name": "from-rabbit", "tags": ["management"]}
    # And the other way: our hashes, every algorithm, into RabbitMQ.
    for algorithm in ("sha256", "sha512", "md5"):
        name = f"from-tqbroker-{algorithm}"
        full = f"rabbit_password_hashing_{algorithm}"
        user = {
            "name": name,
            "password_hash": hash_password("t-pw", full),
            "hashing_algorithm": full,
            "tags": [],
            "limits": {},
        }
        permission = {"user": name, "vhost": "/", **grant}
        back = rabbit.post("/api/definitions", json={"users": [user], "permissions": [permission]})
        assert back.status_code in (201, 204), back.text
        assert _login("127.0.0.1", rabbitmq_oracle.port, name, "t-pw")


def test_patterns_match_as_rabbitmq_matches_them(rabbitmq_oracle: RabbitMQ) -> None:
    """configure "a": RabbitMQ lets a user declare "xa" and "ab" but not "b"; our Permission
    answers the same."""
    rabbit = httpx.Client(base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30)
    rabbit.put("/api/users/pattern-user", json={"password": "p", "tags": ""})
    rabbit.put(
        "/api/permissions/%2F/pattern-user", json={"configure": "a", "write": "", "read": ".*"}
    )
    ours = Permission("a", "", ".*")
    params = pika.ConnectionParameters(
        "127.0.0.1", rabbitmq_oracle.port, "/", pika.PlainCredentials("pattern-user", "p")
    )
    connection = pika.BlockingConnection(params)
    try:
        for name in ("xa", "ab", "b", "A"):
            channel = connection.channel()
            refused: tuple[int, str] | None = None
            try:
                channel.queue_declare(name, auto_delete=True)
                channel.close()
            except pika.exceptions.ChannelClosedByBroker as exc:
                refused = (exc.reply_code, exc.reply_text)
            assert ours.allows("configure", name) == (refused is None), name
            text = f"access to queue '{name}' in vhost '/' refused for user 'pattern-user'"
            assert refused in (None, (403, f"ACCESS_REFUSED - {text}"))
            assert refusal_text("queue", name, "/", "pattern-user") == text
    finally:
        connection.close()


def test_a_user_without_a_management_tag_is_refused_as_rabbitmq_refuses(
    rabbitmq_oracle: RabbitMQ, tmp_path: Path
) -> None:
    rabbit = httpx.Client(base_url=rabbitmq_oracle.http_url, auth=("guest", "guest"), timeout=30)
    rabbit.put("/api/users/untagged", json={"password": "u", "tags": ""})
    theirs = httpx.get(f"{rabbitmq_oracle.http_url}/api/overview", auth=("untagged", "u"))
    exported = rabbit.get("/api/users/untagged").json()
    config = BrokerConfig(port=0, http_port=0, data_dir=tmp_path)
    with running_broker(config) as running:
        api = httpx.Client(base_url=running.http_url, auth=("guest", "guest"), timeout=30)
        assert api.post("/api/definitions", json={"users": [exported]}).status_code == 204
        ours = httpx.get(f"{running.http_url}/api/overview", auth=("untagged", "u"))
    assert (ours.status_code, ours.json()) == (theirs.status_code, theirs.json())
    assert theirs.json() == {"error": "not_authorised", "reason": "Not management user"}
