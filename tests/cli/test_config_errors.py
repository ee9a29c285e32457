"""Issue 15 item 8, as a user meets it: ``python -m tqbroker`` with a bad value in a flag, a
``TQBROKER_*`` variable or the config file says so in one line naming the setting, with no
traceback, exits with status 2 and starts nothing (no data directory appears)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tqbroker.cli import main

# (flags, environment, config file, the error line after "tqbroker: ")
CASES = {
    "port too high": (
        ["--port", "99999"],
        {},
        None,
        "--port: must be between 0 and 65535 (got 99999)",
    ),
    "negative port": (["--port", "-5"], {}, None, "--port: must be between 0 and 65535 (got -5)"),
    "port not a number": (["--port", "abc"], {}, None, "--port: must be an integer (got 'abc')"),
    "http port flag": (
        ["--http-port", "70000"],
        {},
        None,
        '--http-port: must be between 0 and 65535, or "off" (got 70000)',
    ),
    "http_port = -1 in the file": (
        [],
        {},
        "http_port = -1",
        'http_port: must be between 0 and 65535, or "off" (got -1)',
    ),
    "negative heartbeat": (
        [],
        {},
        "heartbeat = -5",
        "heartbeat: must be between 0 and 65535 (got -5)",
    ),
    "tiny frame_max": (
        [],
        {},
        "frame_max = 10",
        "frame_max: must be 0 (no limit) or between 4096 and 4294967295 (got 10)",
    ),
    "negative channel_max": (
        [],
        {},
        "channel_max = -1",
        "channel_max: must be between 0 and 65535 (got -1)",
    ),
    "negative max_message_size": (
        [],
        {},
        "max_message_size = -1",
        "max_message_size: must be between 1 and 536870912 (got -1)",
    ),
    "max_message_size over RabbitMQ's 512 MiB": (
        [],
        {},
        "max_message_size = 536870913",
        "max_message_size: must be between 1 and 536870912 (got 536870913)",
    ),
    "negative timeout": (
        [],
        {},
        "shutdown_timeout = -1.5",
        "shutdown_timeout: must be at least 0 (got -1.5)",
    ),
    "consumer timeout 0": (
        [],
        {},
        "consumer_timeout_ms = 0",
        "consumer_timeout_ms: must be at least 1",
    ),
    "log level": (["--log-level", "loud"], {}, None, "--log-level: must be one of DEBUG, INFO"),
    "log format": (
        [],
        {},
        'log_format = "xml"',
        "log_format: must be one of text, json (got 'xml')",
    ),
    "environment port": (
        [],
        {"TQBROKER_PORT": "70000"},
        None,
        "TQBROKER_PORT: must be between 0 and 65535",
    ),
    "environment heartbeat": (
        [],
        {"TQBROKER_HEARTBEAT": "soon"},
        None,
        "TQBROKER_HEARTBEAT: must be an integer (got 'soon')",
    ),
    "environment switch": (
        [],
        {"TQBROKER_HTTP_ACCESS_LOG": "maybe"},
        None,
        "TQBROKER_HTTP_ACCESS_LOG: must be true or false (got 'maybe')",
    ),
    "a table from the environment": (
        [],
        {"TQBROKER_USERS": "app:secret"},
        None,
        "TQBROKER_USERS: users come from the config file only",
    ),
    "backend option value": (
        [],
        {},
        '[backend_options.log]\nfsync = "sometimes"',
        "backend_options.log.fsync: fsync policy must be one of batch, interval:<ms>, never",
    ),
    "unknown backend option": (
        [],
        {},
        '[backend_options.log]\nfsink = "never"',
        "backend_options.log.fsink: unknown option (the backend takes fsync, ",
    ),
    "fsync flag": (["--fsync", "sometimes"], {}, None, "--fsync: fsync policy must be one of"),
    "unknown key": ([], {}, "prot = 5672", "extra fields found (prot)"),
    "a fractional port": ([], {}, "port = 5.5", "expected int @ $.port"),
    "a number for a switch": (
        [],
        {},
        "keep_unloadable_definitions = 1",
        "expected bool @ $.keep_unloadable_definitions",
    ),
    "log file in a missing directory": (
        ["--log-file", "missing/tqbroker.log"],
        {},
        None,
        "log_file: cannot open missing/tqbroker.log: No such file or directory",
    ),
}


def run_broker(
    cwd: Path, flags: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TQBROKER_")}
    return subprocess.run(
        [sys.executable, "-m", "tqbroker", *flags],
        cwd=cwd,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def assert_config_error(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("tqbroker: ")
    assert expected in done.stderr


# The issue's own examples run as a user runs them; the others through ``main`` in this
# process (the same code from the flags on, and quicker).
AS_A_USER = (
    "port too high",
    "negative port",
    "http_port = -1 in the file",
    "negative heartbeat",
    "tiny frame_max",
    "negative channel_max",
    "negative max_message_size",
    "environment port",
    "backend option value",
)


@pytest.mark.parametrize("case", AS_A_USER)
def test_a_bad_value_is_one_line_naming_the_setting(tmp_path: Path, case: str) -> None:
    flags, env, config, expected = CASES[case]
    if config is not None:
        (tmp_path / "tqbroker.toml").write_text(config + "\n")
        flags = ["--config", "tqbroker.toml", *flags]
    elif "--port" not in flags and "TQBROKER_PORT" not in env:
        flags = ["--port", "0", *flags]  # should it start after all: not on 5672
    done = run_broker(tmp_path, flags, env)
    assert_config_error(done, expected)
    assert not (tmp_path / "tqbroker-data").exists()  # refused before anything started


@pytest.mark.parametrize("case", [case for case in CASES if case not in AS_A_USER])
def test_other_bad_values_in_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    flags, env, config, expected = CASES[case]
    monkeypatch.chdir(tmp_path)
    for name in [name for name in os.environ if name.startswith("TQBROKER_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if config is not None:
        (tmp_path / "tqbroker.toml").write_text(config + "\n")
        flags = ["--config", "tqbroker.toml", *flags]
    status = main(flags)
    out, err = capsys.readouterr()
    assert_config_error(subprocess.CompletedProcess(flags, status, out, err), expected)
    assert not (tmp_path / "tqbroker-data").exists()


def test_the_flag_error_is_exactly_one_line(tmp_path: Path) -> None:
    done = run_broker(tmp_path, ["--port", "99999"])
    assert done.stderr == "tqbroker: --port: must be between 0 and 65535 (got 99999)\n"
    assert done.returncode == 2


def test_a_data_directory_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    done = run_broker(tmp_path, ["--port", "0", "--data-dir", "data"])
    assert_config_error(done, "data_dir: data is a file, not a directory")
    done = run_broker(tmp_path, ["--port", "0", "--data-dir", "data/below"])
    assert_config_error(done, "data_dir: data is a file, not a directory")


def test_an_unwritable_data_directory(tmp_path: Path) -> None:
    """A directory the broker may not write to. Root may write anywhere: then the broker runs
    as root without the capabilities that let it (``setpriv`` drops them from its bounding set),
    so the permission bits hold for it as for anyone."""
    data = tmp_path / "data"
    data.mkdir(mode=0o555)
    data.chmod(0o555)
    done = subprocess.run(
        [
            *_unprivileged(),
            sys.executable,
            "-m",
            "tqbroker",
            "--port",
            "0",
            "--data-dir",
            str(data),
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if not k.startswith("TQBROKER_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_config_error(done, f"data_dir: {data} is not writable: Permission denied")


def _unprivileged() -> list[str]:
    """The command prefix that takes root's power to write anywhere away (nothing for others)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner"]
