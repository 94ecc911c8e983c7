"""
Tests for the Spark benchmark (``python -m malamute_pack.bench spark``):
its percentile, and a tiny run of both parts as its own process, which must
print every figure as a ``name value`` line. The run is given a directory
of the test's for its temporary files and Spark's scratch space, and its
process group (its broker, its JVM) is killed if it overruns.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench.spark import percentile
from malamute_pack.testing.brokerprocess import checkout_environment
from tests.support import skip_slow

READ_FIGURES = {
    "messages",
    "publish_s",
    "spark_count_s",
    "spark_count_rows_per_s",
    "spark_noop_s",
    "spark_noop_rows_per_s",
    "spark_noop_broker_cpu_s",
    "direct_read_s",
    "direct_read_rows_per_s",
    "direct_read_broker_cpu_s",
    "direct_arrow_s",
    "direct_arrow_rows_per_s",
}
PLANT_FIGURES = {
    "plant_rate",
    "plant_messages",
    "plant_latency_p50_s",
    "plant_latency_p99_s",
    "plant_latency_max_s",
    "plant_batches",
    "plant_batch_p50_s",
    "plant_batch_max_s",
    "plant_add_batch_p50_s",
}


class PercentileTests(SynchronousTestCase):
    def test_nearestRank(self) -> None:
        """The pth percentile is the value at rank ceil(p/100 * n) of the sorted values."""
        values = [float(v) for v in range(100, 0, -1)]
        self.assertEqual(percentile(values, 50), 50.0)
        self.assertEqual(percentile(values, 99), 99.0)
        self.assertEqual(percentile(values, 100), 100.0)
        self.assertEqual(percentile([3.0], 99), 3.0)
        self.assertEqual(percentile([1.0, 2.0, 3.0], 50), 2.0)
        self.assertRaises(ValueError, percentile, [], 50)


class BenchRunTests(SynchronousTestCase):
    skip = skip_slow

    def test_tinyRun(self) -> None:
        """
        A tiny run (2000 messages, a few seconds of the plant) exits 0 and
        prints each figure of both parts once, every one a number, the
        counts what was asked and the rates and latencies positive.
        """
        scratch = Path(self.mktemp()).resolve()
        scratch.mkdir(parents=True)
        bench = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "malamute_pack.bench",
                "spark",
                "--messages",
                "2000",
                "--seconds",
                "5",
                "--warmup",
                "3",
                "--rate",
                "200",
            ],
            env=checkout_environment(
                TMPDIR=str(scratch),
                SPARK_LOCAL_DIRS=str(scratch),
                SPARK_SUBMIT_OPTS=f"-Djava.io.tmpdir={scratch}",
            ),
            cwd=scratch,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = bench.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(bench.pid, signal.SIGKILL)
            bench.communicate()
            raise
        ran = subprocess.CompletedProcess(bench.args, bench.returncode, stdout, stderr)
        self.assertEqual(ran.returncode, 0, ran.stderr[-6000:])
        lines = [line.split() for line in ran.stdout.splitlines()]
        self.assertTrue(all(len(words) == 2 for words in lines), ran.stdout)
        figures = {name: float(value) for name, value in lines}
        self.assertEqual(len(figures), len(lines), "a figure printed twice")
        self.assertEqual(set(figures), READ_FIGURES | PLANT_FIGURES)
        self.assertEqual(figures["messages"], 2000)
        self.assertEqual(figures["plant_rate"], 200)
        self.assertGreater(figures["plant_messages"], 0)
        for name in (
            "spark_count_rows_per_s",
            "spark_noop_rows_per_s",
            "direct_read_rows_per_s",
            "direct_arrow_rows_per_s",
            "plant_latency_p50_s",
        ):
            self.assertGreater(figures[name], 0, name)
        self.assertLessEqual(figures["plant_latency_p50_s"], figures["plant_latency_p99_s"])
        self.assertLessEqual(figures["plant_latency_p99_s"], figures["plant_latency_max_s"])
