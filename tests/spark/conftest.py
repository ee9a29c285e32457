"""Fixtures for the Spark data source tests: one local SparkSession for all of them (started
on first use, stopped at the end: starting Spark costs about 10 s), a broker per module, and an
HTTP client to set topics up.

The Spark tests are marked ``spark``: ``pytest -m "not spark"`` leaves them out. They need Java
17+ (``java`` on PATH or ``JAVA_HOME``) and skip without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tqbroker.testing import RunningBroker, running_broker

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def _jvm_options(java: str) -> str:
    """Faster start for a short-lived JVM: C1 only, the serial GC, and a class-data archive
    (made by the first run, reused by the next ones; keyed by the JDK and pyspark versions)."""
    import pyspark

    options = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
    if os.environ.get("TQBROKER_SPARK_CDS", "1") == "0":
        return options
    version = subprocess.run(
        [java, "-version"], capture_output=True, text=True, check=False
    ).stderr.splitlines()
    build = "".join(c if c.isalnum() or c in ".-" else "_" for c in (version or ["?"])[-1])[:80]
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tqbroker-spark"
    archive = cache / f"spark-{pyspark.__version__}-{build}.jsa"
    if archive.exists():
        return f"{options} -XX:SharedArchiveFile={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"
    cache.mkdir(parents=True, exist_ok=True)
    return f"{options} -XX:ArchiveClassesAtExit={archive} -Xlog:cds=off -Xlog:cds+dynamic=off"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    java = _java()
    if java is None:
        pytest.skip("the Spark tests need Java 17+ (java on PATH or JAVA_HOME)")
    # Workers must run this interpreter (it has pyarrow and tqbroker), and inherit the
    # environment of the JVM: set it before the session starts.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from tqbroker.spark import loopback_builder, register

    session = (
        loopback_builder("tqbroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", _jvm_options(java))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def broker() -> Iterator[RunningBroker]:
    with running_broker() as running:
        yield running


@pytest.fixture(scope="module")
def http(broker: RunningBroker) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker.http_url, auth=("guest", "guest"), timeout=30) as client:
        yield client


class Topics:
    """Set topics up and look at them through the broker's HTTP API."""

    def __init__(self, http: httpx.Client, broker: RunningBroker) -> None:
        self.http = http
        self.url = broker.http_url

    def create(self, topic: str, partitions: int = 1, **arguments: object) -> None:
        body = {"partitions": partitions, "arguments": arguments}
        response = self.http.put(f"/topics/{topic}", json=body)
        assert response.status_code == 201, response.text

    def produce(self, topic: str, records: list[dict[str, object]]) -> list[tuple[int, int]]:
        """JSON records (``value``, ``key``, ``headers``, ``partition``); where they landed."""
        landed = []
        for start in range(0, len(records), 5000):
            response = self.http.post(
                f"/topics/{topic}/messages", json={"records": records[start : start + 5000]}
            )
            assert response.status_code == 201, response.text
            landed += [(o["partition"], o["offset"]) for o in response.json()["offsets"]]
        return landed

    def offsets(self, topic: str) -> list[dict[str, int]]:
        response = self.http.get(f"/topics/{topic}/offsets")
        assert response.status_code == 200, response.text
        partitions: list[dict[str, int]] = response.json()["partitions"]
        return partitions

    def read_all(self, topic: str) -> list[Record]:
        """Every record of every partition, in partition then offset order."""
        from tqbroker.recordbatch import decode_read

        found = []
        for info in self.offsets(topic):
            partition, position = info["partition"], info["earliest"]
            while position < info["latest"]:
                response = self.http.get(
                    f"/topics/{topic}/partitions/{partition}/records",
                    params={"offset": position, "headers": "true", "max_bytes": 8 << 20},
                )
                assert response.status_code == 200, response.text
                batch = decode_read(response.content, headers=True)
                assert batch.headers is not None
                for i in range(len(batch)):
                    found.append(
                        Record(
                            partition,
                            batch.offsets[i],
                            batch.keys[i].decode(),
                            batch.values[i],
                            json.loads(batch.headers[i] or b"{}"),
                        )
                    )
                position = batch.next_offset
                if not len(batch):
                    break
        return found


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: str
    value: bytes
    headers: dict[str, object]


@pytest.fixture(scope="module")
def topics(http: httpx.Client, broker: RunningBroker) -> Topics:
    return Topics(http, broker)
