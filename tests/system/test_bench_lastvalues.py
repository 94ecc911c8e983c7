"""
Tests for L{malamute_pack.bench.lastvalues}: its options, and (slow) a
short real run against a broker process that prints its figures.
"""

from __future__ import annotations

import re
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench.lastvalues import parse
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment
from tests.support import skip_slow


class ParseTests(SynchronousTestCase):
    """The command's options."""

    def test_defaults(self) -> None:
        """By default: 100,000 subjects updated twice, three snapshots."""
        args = parse([])
        self.assertEqual((args.subjects, args.updates, args.rounds), (100_000, 2, 3))

    def test_atLeastOne(self) -> None:
        """No subject, update or round is a usage error."""
        for option in ("--subjects", "--updates", "--rounds"):
            self.assertRaises(SystemExit, parse, [option, "0"])


class RunTests(SynchronousTestCase):
    """A real, short run."""

    skip = skip_slow

    def test_figures(self) -> None:
        """
        One round of a small snapshot prints a round line, then the
        last_values line with both times and the rate.
        """
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "malamute_pack.bench",
                "lastvalues",
                "--subjects=3000",
                "--rounds=1",
            ],
            cwd=PROJECT_ROOT,
            env=checkout_environment(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        self.assertEqual(ran.returncode, 0, ran.stderr)
        lines = ran.stdout.splitlines()
        self.assertRegex(lines[0], r"^last_values_round round=1 subjects=3000 secs=\S+ raw_secs=")
        self.assertRegex(
            lines[-1],
            re.compile(
                r"^last_values subjects=3000 updates=2 secs=\S+ raw_secs=\S+ records_per_s=\d+$"
            ),
        )
