"""
A failed start with the real twistd (L{malamute_pack.startup},
L{malamute_pack.datadir}): its reason is said once, whether stdout (the
log) and stderr go apart (stderr: exactly one line; the log: once) or to
the same place (a terminal, C{2>&1}: once in all), and a failed first
start leaves no data directory behind, while a failed later start leaves
the broker's data as it was.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import (
    BrokerProcess,
    checkout_environment,
    fresh_ipc_endpoint,
    twistd_command,
)
from tests.support import skip_slow


class FailedStartTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.directory = Path(self.mktemp()).resolve()
        self.directory.mkdir()

    def twistd(self, *args: str, together: bool = False) -> tuple[str, str]:
        """
        Run C{twistd -n malamute args} in the test's directory; it must fail.
        Its stdout and stderr (with C{together}, stderr goes to stdout).
        """
        done = subprocess.run(
            twistd_command("--nodaemon", "--pidfile=", "malamute", *args),
            cwd=self.directory,
            env=checkout_environment(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if together else subprocess.PIPE,
            text=True,
            timeout=60,
        )
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertNotIn("Traceback", done.stdout + (done.stderr or ""))
        return done.stdout, done.stderr or ""

    def assertSaidOnce(self, reason: str, *args: str) -> None:
        """A start with C{args} fails saying C{reason} once, in each way its output can go."""
        stdout, stderr = self.twistd(*args)
        self.assertEqual(len(stderr.splitlines()), 1, stderr)
        self.assertIn(reason, stderr)
        self.assertEqual(stdout.count(reason), 1, stdout)
        together, _ = self.twistd(*args, together=True)
        self.assertEqual(together.count(reason), 1, together)

    def test_dataDirLocked(self) -> None:
        """A data directory another broker holds: the service's own log line, or stderr's."""
        with BrokerProcess(self.directory / "first") as first:
            self.assertSaidOnce(
                f"process {first.pid}", "-e", fresh_ipc_endpoint("once"), "-d", str(first.data_dir)
            )

    def test_bindRefused(self) -> None:
        """An endpoint that cannot be bound: the start's own line, once."""
        self.assertSaidOnce("cannot bind tcp://nonsense: Invalid argument", "-e", "tcp://nonsense")

    def test_firstStartLeavesNothing(self) -> None:
        """
        A first start that fails once its journal is open leaves no data
        directory (nor the parents it made); one that fails on a data
        directory in use keeps every file.
        """
        self.twistd("-e", "tcp://nonsense", "-d", "new/data")
        self.assertFalse((self.directory / "new").exists())
        empty = self.directory / "empty"
        empty.mkdir()
        self.twistd("-e", "tcp://nonsense", "-d", "empty")
        self.assertEqual(list(empty.iterdir()), [])

    def test_laterStartKeepsData(self) -> None:
        """A failed start on a data directory a broker has used leaves its files."""
        data_dir = self.directory / "data"
        with BrokerProcess(self.directory / "first", data_dir=data_dir):
            pass
        before = sorted(p.name for p in data_dir.iterdir())
        self.assertIn("journal.sqlite", before)
        self.twistd("-e", "tcp://nonsense", "-d", str(data_dir))
        self.assertEqual(sorted(p.name for p in data_dir.iterdir()), before)
