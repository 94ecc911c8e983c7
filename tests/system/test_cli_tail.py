"""
C{malamute tail} of a stream that has no record yet (a typo, often: C{tail
wether}) says once on stderr that it waits for the first, with the hint
that C{malamute streams} lists the streams, and keeps waiting: the first
record published is shown. The command (L{malamute_pack.cli.commands}) runs
as a real process against a real broker, with the helpers of
C{tests/system/test_cli.py}.
"""

from __future__ import annotations

import select
import signal
import subprocess
import time
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.support import skip_slow
from tests.system.test_cli import COMMAND, _environment, _kill, malamute


class TailWaitsTests(SynchronousTestCase):
    skip = skip_slow

    def test_noRecordYet(self) -> None:
        """
        tail from latest on a stream with no record: one line on stderr,
        then the first record published is shown; Ctrl-C ends it quietly.
        """
        broker = BrokerProcess(Path(self.mktemp()))
        broker.start()
        self.addCleanup(broker.stop)
        process = subprocess.Popen(
            [*COMMAND, "-e", broker.endpoint, "tail", "wether"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_environment(),
        )
        self.addCleanup(_kill, process)
        assert process.stdout is not None and process.stderr is not None
        line = process.stderr.readline().decode()
        self.assertIn("waiting for the first record of stream 'wether'", line)
        self.assertIn("`malamute streams` lists them", line)
        deadline = time.monotonic() + 60
        while not select.select([process.stdout], [], [], 0.5)[0]:
            self.assertIsNone(process.poll(), "tail stopped waiting")
            self.assertLess(time.monotonic(), deadline, "tail showed no record")
            published = malamute("-e", broker.endpoint, "publish", "wether", "first", "x")
            self.assertEqual(published.returncode, 0, published.stderr)
        self.assertIn(b" first x", process.stdout.readline())
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=30)
        self.assertEqual((process.returncode, rest), (130, b""))
