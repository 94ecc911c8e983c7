"""
Slow system test of the login throttle (docs/security.md, "Refused
attempts and the login throttle") with the broker as a real process and
real PLAIN handshakes: a brute force of 1000 wrong passwords from
127.0.0.1, many at once, each a new ZeroMQ socket, while the right user
logs in again and again from the same address
(L{malamute_pack.bench.bruteforce}, which also measures what the attack
costs the broker: a figure printed by its command, never asserted here).

Skipped with C{MALAMUTE_SKIP_SLOW=1}.

Tests: this is a test module; it drives L{malamute_pack.bench.bruteforce}.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from twisted.logger import Logger
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import bruteforce
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment
from tests.support import skip_slow

_log = Logger()


class BruteForceTests(SynchronousTestCase):
    skip = skip_slow

    def test_rightUserGetsInDuringBruteForce(self) -> None:
        """
        While 1000 wrong passwords for alice are tried from 127.0.0.1, all
        of them in flight at once, every one is refused (ZAP's 400), none
        is let in, none is left unanswered; alice, from the same address
        with her right password, logs in within 1 s every time she tries
        during the attack, and is never refused. The broker's metrics
        count the 1000 refusals, the throttled ones among them.
        """
        directory = Path(self.mktemp()).resolve()
        directory.mkdir(parents=True)
        result = bruteforce.run(directory, attempts=1000, concurrency=1000, idle=0)
        _log.info("{line}", line=result.line())
        outcomes = result.outcomes
        self.assertEqual(
            (outcomes.refused, outcomes.accepted, outcomes.other, outcomes.lost),
            (1000, 0, 0, 0),
            result.line(),
        )
        self.assertGreater(len(result.logins), 0, result.line())
        self.assertEqual(result.logins_refused, 0, result.line())
        self.assertLess(max(result.logins), 1.0, result.line())
        self.assertEqual(result.zap["refused"], 1000)
        self.assertGreater(result.zap["throttled"], 0)

    def test_command(self) -> None:
        """
        ``python -m malamute_pack.bench bruteforce`` runs a short brute
        force and prints its line: every attempt refused, the right user
        in, the broker's CPU share a number.
        """
        ran = subprocess.run(
            [
                sys.executable,
                "-m",
                "malamute_pack.bench",
                "bruteforce",
                "--attempts=20",
                "--concurrency=20",
                "--idle=0.2",
            ],
            cwd=PROJECT_ROOT,
            env=checkout_environment(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(ran.returncode, 0, ran.stderr)
        match = re.fullmatch(
            r"bruteforce attempts=20 concurrency=20 refused=20 accepted=0 other=0 lost=0 .*"
            r" right_logins=[1-9]\d* right_refused=0 .* broker_cpu_share=(\d+\.\d+) .*"
            r" idle_cpu_share=\d+\.\d+ .* zap_refused=20 zap_throttled=\d+ zap_hurried=0\n",
            ran.stdout,
        )
        self.assertIsNotNone(match, ran.stdout)
