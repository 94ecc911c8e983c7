"""
The one local Spark session the Spark test modules share: starting one
costs 5-8 s, so it is made once per test process, on first use, and
stopped when the process exits. Settings from ``docs/spark.md``: two local
cores, two shuffle partitions (the default 200 is frozen into streaming
checkpoints and makes every micro-batch slow), a JVM that starts fast,
loopback only, and Python workers that run this interpreter (so they
import this checkout's package).

Quiet, and nothing shared with another test process (``trial -j``): the
JVM is started with its stdout and stderr going to ``spark/spark.log``
under the process's working directory (trial's temporary directory, its
own per worker), so its log4j output, py4j's and what its Python workers
print (the tracebacks of failures a test expects) stay off the terminal;
L{spark_for} copies a test's share of that file into trial's
``test.log``, where a failure's Java side can be read. Its scratch space
(local dirs, ``java.io.tmpdir``, the warehouse, Ivy, Derby) is under
``spark/`` too; no UI, no fixed port.

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_ticker_plant.py``.
"""

from __future__ import annotations

import atexit
import os
import shlex
import sys
from pathlib import Path

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession
from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.spark import register

_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"

_log = Logger()
_session: SparkSession | None = None
_log_file: Path | None = None


def _configuration(home: Path) -> SparkConf:
    """The session's settings, every path under C{home}."""
    scratch = home / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    java_options = " ".join(
        [
            _JAVA_OPTIONS,
            shlex.quote(f"-Djava.io.tmpdir={scratch}"),
            shlex.quote(f"-Dderby.system.home={home / 'derby'}"),
        ]
    )
    settings = {
        "spark.master": "local[2]",
        "spark.app.name": "malamute_pack-tests",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.extraJavaOptions": java_options,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.local.dir": str(home / "local"),
        "spark.sql.warehouse.dir": str(home / "warehouse"),
        "spark.sql.catalogImplementation": "in-memory",
        "spark.jars.ivy": str(home / "ivy"),
    }
    conf = SparkConf()
    for key, value in settings.items():
        conf.set(key, value)
    return conf


def spark_session() -> SparkSession:
    """The shared C{local[2]} session, with the C{malamute} data source registered."""
    global _session, _log_file
    if _session is None:
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PYSPARK_PYTHON"] = sys.executable
        home = Path("spark").resolve()
        conf = _configuration(home)
        log_file = home / "spark.log"
        with log_file.open("ab") as output:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": output, "stderr": output})
        SparkContext(conf=conf, gateway=gateway)
        session = SparkSession.builder.getOrCreate()
        register(session)
        atexit.register(session.stop)
        _session, _log_file = session, log_file
    return _session


def spark_for(case: SynchronousTestCase) -> SparkSession:
    """
    The shared session, for C{case}: what the JVM writes to its log while
    C{case} runs is copied into trial's log when it ends.
    """
    session = spark_session()
    assert _log_file is not None
    log_file, start = _log_file, _log_file.stat().st_size

    def copy_log() -> None:
        with log_file.open("rb") as log:
            log.seek(start)
            text = log.read().decode("utf-8", "replace")
        if text.strip():
            _log.info("Spark's log during {test}:\n{text}", test=case.id(), text=text)

    case.addCleanup(copy_log)
    return session
