"""
Tests for L{malamute_pack.bench.percentiles} (the latency figures every
benchmark line shares) and, as a slow system test, the round-trip floors of
L{malamute_pack.bench.floor} with real processes and sockets.
"""

from __future__ import annotations

import contextlib
import io
import re

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import floor
from malamute_pack.bench.__main__ import main as bench_main
from malamute_pack.bench.percentiles import latency_figures, percentile
from tests.support import skip_slow


class PercentileTests(SynchronousTestCase):
    def test_nearestRank(self) -> None:
        """A percentile is the sample at the nearest rank at or above it."""
        ordered = [float(i) for i in range(1, 101)]
        self.assertEqual(
            [percentile(ordered, f) for f in (0.5, 0.99, 0.999, 1.0)], [50.0, 99.0, 100.0, 100.0]
        )

    def test_oneSample(self) -> None:
        """With one sample every percentile is that sample."""
        self.assertEqual(percentile([7.0], 0.5), 7.0)
        self.assertEqual(percentile([7.0], 0.999), 7.0)

    def test_figuresInMicroseconds(self) -> None:
        """The figures are named as the lines print them, in whole microseconds, unsorted input."""
        seconds = [i / 1e6 for i in range(1000, 0, -1)]
        self.assertEqual(
            latency_figures(seconds),
            {"p50_us": "500", "p99_us": "990", "p999_us": "999", "max_us": "1000"},
        )

    def test_noSamples(self) -> None:
        """Without samples every figure is 0 rather than an error."""
        self.assertEqual(set(latency_figures([]).values()), {"0"})


class FloorTests(SynchronousTestCase):
    skip = skip_slow

    def assertLine(self, line: str, name: str, n: int) -> None:
        match = re.fullmatch(
            rf"floor={name} n={n} rt_per_s=(\d+) p50_us=(\d+) p99_us=(\d+) p999_us=(\d+) "
            r"max_us=(\d+)",
            line,
        )
        self.assertIsNotNone(match, line)
        assert match is not None
        rate, p50, p99, p999, top = map(int, match.groups())
        self.assertGreater(rate, 0)
        self.assertTrue(0 < p50 <= p99 <= p999 <= top, line)

    def test_echo(self) -> None:
        """The echo floor makes its round trips through a real ROUTER process and prints them."""
        self.assertLine(floor.measure("echo", 200), "echo", 200)

    def test_relay(self) -> None:
        """The relay floor carries each request to a worker process and back."""
        self.assertLine(floor.measure("relay", 200), "relay", 200)

    def test_subcommand(self) -> None:
        """``python -m malamute_pack.bench floor`` prints the line of each floor asked for."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(bench_main(["floor", "--floor", "echo", "--messages", "50"]), 0)
        [line] = out.getvalue().splitlines()
        self.assertLine(line, "echo", 50)
