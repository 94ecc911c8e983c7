"""
C{malamute tail} of a stream that has no record yet (a typo, often: C{tail
wether}) says once on stderr that it waits for the first, with the hint
that C{malamute streams} lists the streams, and keeps waiting: the first
record published is shown. C{tail --last-values} of a last-value stream
shows the latest record of each subject first. The command (L{malamute_pack.cli.commands}) runs
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
from tests.cli_support import COMMAND, cli_environment, kill_process, malamute
from tests.support import skip_slow


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
            env=cli_environment(),
        )
        self.addCleanup(kill_process, process)
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


class TailLastValuesTests(SynchronousTestCase):
    skip = skip_slow

    def test_lastValues(self) -> None:
        """
        tail --last-values of a last-value stream prints the latest message
        of each subject, in the order they were written, then the new ones;
        of another stream, it fails saying why.
        """
        config = Path(self.mktemp()).resolve()
        config.write_text("malamute\n    streams\n        ticks\n            compact = subject\n")
        broker = BrokerProcess(Path(self.mktemp()), args=["--config", str(config)])
        broker.start()
        self.addCleanup(broker.stop)
        for subject, body in (("a", "1"), ("b", "2"), ("a", "3")):
            published = malamute("-e", broker.endpoint, "publish", "ticks", subject, body)
            self.assertEqual(published.returncode, 0, published.stderr)
        shown = malamute("-e", broker.endpoint, "tail", "ticks", "--last-values", "--count", "2")
        self.assertEqual(shown.returncode, 0, shown.stderr)
        lines = shown.stdout.decode().splitlines()
        self.assertEqual([line.split()[-2:] for line in lines], [["b", "2"], ["a", "3"]])
        published = malamute("-e", broker.endpoint, "publish", "plain", "a", "1")
        self.assertEqual(published.returncode, 0, published.stderr)
        refused = malamute("-e", broker.endpoint, "tail", "plain", "--last-values", "--count", "1")
        self.assertNotEqual(refused.returncode, 0)
        self.assertIn(b"not a last-value stream", refused.stderr)
