"""
Tests for L{malamute_pack.bench.ops}: its options, and (slow) a short real
run that starts brokers with and without the management API and prints the
cost line.
"""

from __future__ import annotations

import re
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench.ops import parse
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment
from tests.support import skip_slow


class ParseTests(SynchronousTestCase):
    """The command's options."""

    def test_defaults(self) -> None:
        """By default: stream 1:1, three rounds, the API idle."""
        args = parse([])
        self.assertEqual((args.scenario, args.rounds, args.poll), ("stream_1to1", 3, False))

    def test_badRounds(self) -> None:
        """Fewer than one round is a usage error."""
        self.assertRaises(SystemExit, parse, ["--rounds", "0"])


class RunTests(SynchronousTestCase):
    """A real, short run."""

    skip = skip_slow

    def test_costLine(self) -> None:
        """
        One round with the API polled prints a run line for each broker
        (the API one with answers counted) and the ops_cost line with a
        ratio.
        """
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "malamute_pack.bench",
                "ops",
                "--rounds=1",
                "--messages=2000",
                "--poll",
            ],
            cwd=PROJECT_ROOT,
            env=checkout_environment(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        self.assertEqual(ran.returncode, 0, ran.stderr)
        self.assertRegex(ran.stdout, r"scenario=stream_1to1 .* api=off\n")
        self.assertRegex(ran.stdout, r"api=on\+polled api_answers=[1-9]")
        cost = re.search(
            r"^ops_cost scenario=stream_1to1 api=polled .* ratio=(\S+)$", ran.stdout, re.M
        )
        assert cost is not None, ran.stdout
        self.assertGreater(float(cost.group(1)), 0.0)
