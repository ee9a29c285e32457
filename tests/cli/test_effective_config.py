"""Where settings come from: flags over ``TQBROKER_*`` variables over the file over the
defaults, ``"off"`` for the ports, and ``--print-config`` showing the result (passwords
redacted) as TOML that reads back to the same configuration."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest

from tqbroker.config import BrokerConfig, SettingError, load_config


def print_config(
    cwd: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TQBROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "tqbroker", "--print-config", *flags],
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_flags_beat_variables_beat_the_file(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('port = 1111\nheartbeat = 30\ndata_dir = "from-file"\n')
    env = {"TQBROKER_PORT": "2222", "TQBROKER_HTTP_PORT": "off", "TQBROKER_CONFIG": "c.toml"}
    shown = tomllib.loads(print_config(tmp_path, env=env).stdout)
    assert (shown["port"], shown["heartbeat"], shown["data_dir"]) == (2222, 30, "from-file")
    assert shown["http_port"] == "off"
    shown = tomllib.loads(print_config(tmp_path, "--port", "3333", env=env).stdout)
    assert shown["port"] == 3333
    shown = tomllib.loads(print_config(tmp_path, "--http-port", "0", env=env).stdout)
    assert shown["http_port"] == 0
    assert not (tmp_path / "from-file").exists()  # printing starts nothing


def test_print_config_redacts_passwords_and_reads_back(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text(
        'vhosts = ["/", "staging"]\nmetrics_port = false\nlog_level = "warning"\n'
        '[[users]]\nname = "app"\npassword = "s3cret-pw"\n'
        'tags = ["management"]\n[users.permissions.staging]\nconfigure = "^app-"\n'
        '[backend_options.log]\nfsync = "never"\n'
        '[auth_backend_options.internal]\nservice = "http://svc:url-pw@127.0.0.1:9/auth"\n'
    )
    done = print_config(tmp_path, "--config", "c.toml", "--log-format", "json")
    assert done.returncode == 0, done.stderr
    assert "s3cret-pw" not in done.stdout
    assert "url-pw" not in done.stdout  # a URL's password too
    assert 'service = "http://svc:<redacted>@127.0.0.1:9/auth"' in done.stdout
    assert 'password = "<redacted>"' in done.stdout
    (tmp_path / "shown.toml").write_text(done.stdout)
    (tmp_path / "c.toml").write_text(
        (tmp_path / "c.toml").read_text().split("[auth_backend_options")[0]
    )
    (tmp_path / "shown.toml").write_text(done.stdout.split("\n[auth_backend_options")[0])
    shown = load_config(tmp_path / "shown.toml")
    original = load_config(tmp_path / "c.toml", log_format="json")
    assert shown.metrics_port is None
    assert shown.log_level == "WARNING"
    assert shown.backend_options == {"log": {"fsync": "never"}}
    redacted = tuple(attrs.evolve(user, password="<redacted>") for user in original.users)
    assert shown == attrs.evolve(original, users=redacted)


@pytest.mark.parametrize("off", ['"off"', '"OFF"', "false"])
def test_ports_turn_off_in_a_file(tmp_path: Path, off: str) -> None:
    (tmp_path / "c.toml").write_text(f"http_port = {off}\nconsumer_timeout_ms = {off}\n")
    config = load_config(tmp_path / "c.toml")
    assert config.http_port is None
    assert config.consumer_timeout_ms is None


def test_python_callers_are_refused_too() -> None:
    with pytest.raises(SettingError, match=r"^port: must be between 0 and 65535 \(got 70000\)$"):
        BrokerConfig(port=70000)
    with pytest.raises(SettingError, match=r"^frame_max: must be 0 \(no limit\) or between 4096"):
        BrokerConfig(frame_max=4095)
    with pytest.raises(SettingError, match=r"^heartbeat: "):
        BrokerConfig(heartbeat=-1)
    assert BrokerConfig(frame_max=4096, channel_max=0, heartbeat=0).frame_max == 4096
    assert BrokerConfig(frame_max=0).frame_max == 0  # no limit, as the spec says
    assert BrokerConfig(log_level="debug").log_level == "DEBUG"


def test_log_level_in_any_case(tmp_path: Path) -> None:
    shown = tomllib.loads(print_config(tmp_path, "--log-level", "debug").stdout)
    assert shown["log_level"] == "DEBUG"


def test_the_fsync_flag_beats_the_files_backend_option(tmp_path: Path) -> None:
    (tmp_path / "c.toml").write_text('[backend_options.log]\nfsync = "sometimes"\n')
    done = print_config(tmp_path, "--config", "c.toml", "--fsync", "never")
    assert done.returncode == 0, done.stderr
    assert tomllib.loads(done.stdout)["backend_options"] == {"log": {"fsync": "never"}}
