"""A local SparkSession builder that stays on loopback: the driver binds and advertises
127.0.0.1 (Spark otherwise picks the network interface's address when the hostname resolves
to 127.0.0.1: "using 192.0.2.2 instead")."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"


def loopback_builder(app_name: str, master: str = "local[2]") -> SparkSession.Builder:
    """``SparkSession.builder`` for a local session on 127.0.0.1 (driver RPC, block manager
    and UI), quiet progress bar; add your own ``.config(...)`` and call ``.getOrCreate()``.
    Sets ``SPARK_LOCAL_IP`` too, which the JVM inherits when it starts."""
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = LOOPBACK
    return (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.bindAddress", LOOPBACK)
        .config("spark.driver.host", LOOPBACK)
        .config("spark.ui.showConsoleProgress", "false")
    )
