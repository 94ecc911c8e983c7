"""
The one local Spark session the Spark test modules share: starting one
costs 5-8 s, so it is made once per test process, on first use, and
stopped when the process exits. Settings from ``notes/spark.md``: two local
cores, two shuffle partitions (the default 200 is frozen into streaming
checkpoints and makes every micro-batch slow), a JVM that starts fast,
loopback only, and Python workers that run this interpreter (so they
import this checkout's package).

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_ticker_plant.py``.
"""

from __future__ import annotations

import atexit
import os
import sys

from pyspark.sql import SparkSession

from malamute_pack.spark import register

_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_session: SparkSession | None = None


def spark_session() -> SparkSession:
    """The shared C{local[2]} session, with the C{malamute} data source registered."""
    global _session
    if _session is None:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PYSPARK_PYTHON"] = sys.executable
        session = (
            SparkSession.builder.master("local[2]")
            .appName("malamute_pack-tests")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.extraJavaOptions", _JAVA_OPTIONS)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        session.sparkContext.setLogLevel("ERROR")
        register(session)
        atexit.register(session.stop)
        _session = session
    return _session
