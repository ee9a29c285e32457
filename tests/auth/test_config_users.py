"""``[[users]]`` in the configuration file (password or RabbitMQ-format hash, tags,
permissions), refused with one line naming the user, ``hash-password``, and the SASL
mechanisms offered."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tqbroker.auth import check_password
from tqbroker.auth.sasl import offered_mechanisms
from tqbroker.broker.users import open_user_db
from tqbroker.config import ConfigError, SettingError, UserConfig, load_config
from tqbroker.storage_env import StorageEnv

HASH = "c0x5LQiSd0/grRNgSBRWPx/19lVBQBXeykcIxqJdmpTgpMEp"  # RabbitMQ's, of "guest"


def test_a_users_table_with_a_hash_tags_and_permissions(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        f'data_dir = "{tmp_path / "data"}"\n'
        '[[users]]\nname = "app"\n'
        f'password_hash = "{HASH}"\n'
        'tags = ["monitoring"]\n'
        '[users.permissions."/"]\nconfigure = "^app-"\n'
        '[[users]]\nname = "dev"\npassword = "dev-pw"\n'
    )
    config = load_config(tmp_path / "c.toml")
    db, first = open_user_db(config, StorageEnv.default())
    assert first
    app = db.get("app")
    assert app is not None
    assert app.tags == {"monitoring"}
    assert check_password("guest", app.password_hash)
    permission = db.permission("app", "/")
    assert permission is not None
    assert (permission.configure, permission.write, permission.read) == ("^app-", ".*", ".*")
    dev = db.get("dev")
    assert dev is not None
    assert check_password("dev-pw", dev.password_hash)  # hashed at load
    assert db.permission("dev", "/") is None  # none listed: none given
    assert db.get("guest") is None  # a [[users]] list replaces the default user


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"password": "x", "password_hash": HASH}, "give password or password_hash, not both"),
        ({"password_hash": "not-base64!"}, "password_hash is not base64"),
        ({"password": "x", "hashing_algorithm": "sha1"}, "unknown hashing_algorithm 'sha1'"),
    ],
)
def test_bad_users_are_one_line_naming_the_user(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingError, match=f"^users: user 'app': .*{message}"):
        UserConfig("app", **kwargs)


def test_a_bad_pattern_in_the_file_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        '[[users]]\nname = "app"\npassword = "p"\n[users.permissions."/"]\nread = "("\n'
    )
    with pytest.raises(ConfigError, match="invalid permission pattern '\\('") as info:
        load_config(tmp_path / "c.toml")
    assert "\n" not in str(info.value)


def test_hash_password_prints_a_hash_of_stdin() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tqbroker",
            "hash-password",
            "--algorithm",
            "rabbit_password_hashing_sha512",
        ],
        input="s3cret\n",
        capture_output=True,
        text=True,
        check=True,
    )
    made = done.stdout.strip()
    assert check_password("s3cret", made, "rabbit_password_hashing_sha512")
    assert "s3cret" not in done.stdout + done.stderr


def test_mechanisms_offered() -> None:
    assert offered_mechanisms(("PLAIN", "AMQPLAIN"), False) == ["PLAIN", "AMQPLAIN"]
    assert offered_mechanisms(("EXTERNAL", "PLAIN"), False) == ["PLAIN"]  # no certificate
    assert offered_mechanisms(("EXTERNAL", "PLAIN"), True) == ["EXTERNAL", "PLAIN"]
    assert "ANONYMOUS" not in offered_mechanisms(("ANONYMOUS", "PLAIN"), True)
