"""Spark stays on loopback: the test session binds and advertises 127.0.0.1 (driver host,
bind address, RPC endpoint, block manager), and every file that starts a SparkSession does it
through ``tqbroker.spark.loopback_builder``."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "src" / "tqbroker" / "spark" / "_session.py"
SCANNED = ("src", "tests", "benchmarks", "examples", "docs", "README.md")
SUFFIXES = {".py", ".md", ".rst", ".txt", ".ipynb"}


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        found += [p for p in paths if p.is_file() and p.suffix in SUFFIXES]
    return found


def test_every_spark_session_is_built_by_the_loopback_helper() -> None:
    this = Path(__file__).resolve()
    offenders = [
        str(path.relative_to(ROOT))
        for path in _files()
        if path.resolve() not in (HELPER, this)
        and "SparkSession.builder" in path.read_text(encoding="utf-8", errors="replace")
    ]
    assert offenders == [], f"use tqbroker.spark.loopback_builder instead in: {offenders}"
    users = [p for p in _files() if "loopback_builder(" in p.read_text(errors="replace")]
    assert len(users) >= 3  # the test fixture, benchmarks/spark.py, the example


@pytest.mark.spark
def test_the_test_session_binds_and_advertises_loopback(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"
    ui = spark.sparkContext.uiWebUrl
    assert ui is None or "//127.0.0.1:" in ui
    # What the driver's JVM really listens on (RPC, block manager, py4j): loopback only.
    pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    listening = _listening(pid)
    assert listening, "found no listening socket of the driver JVM"
    assert {host for host, _ in listening} == {"127.0.0.1"}, listening


def _listening(pid: int) -> list[tuple[str, int]]:
    """The addresses ``pid`` listens on (Linux /proc; v4-mapped IPv6 ones as IPv4)."""
    fds = Path(f"/proc/{pid}/fd")
    if not fds.is_dir():
        pytest.skip("needs Linux /proc to list the JVM's sockets")
    inodes = set()
    for fd in fds.iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found: list[tuple[str, int]] = []
    for table, v6 in (("tcp", False), ("tcp6", True)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, 32, 8))
            host = str(ipaddress.ip_address(raw if v6 else raw[:4]))
            if v6 and raw[:12] == b"\0" * 10 + b"\xff\xff":  # a v4-mapped address
                host = str(ipaddress.ip_address(raw[12:]))
            found.append((host, int(port, 16)))
    return found
