"""
Tests for the example scripts in ``examples/``: each runs as its own process
against a broker process, as a user would run them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests.support import skip_slow
from tests.test_client_blocking import ROOT, BrokerProcess


def example(name: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / name), *args]


class ExampleTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()))
        self.addCleanup(self.broker.stop)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def test_echoWorkerAndRequester(self) -> None:
        """The echo worker sends the requester's text back; the requester prints it."""
        worker = subprocess.Popen(
            example("echo_worker.py", "--endpoint", self.broker.endpoint, "--count", "1"),
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        self.addCleanup(worker.kill)
        requester = subprocess.run(
            example("echo_requester.py", "--endpoint", self.broker.endpoint, "--timeout", "10",
                    "hello echo"),
            env=self.env, capture_output=True, text=True, timeout=30,
        )
        self.assertEqual(requester.returncode, 0, requester.stderr)
        self.assertEqual(requester.stdout.strip(), "reply from echo-worker: hello echo")
        output, _ = worker.communicate(timeout=10)
        self.assertEqual(worker.returncode, 0, output)
        self.assertIn(b"echoed 'echo'", output)

    def test_mailboxExchange(self) -> None:
        """Bob gets Alice's letter though he connected after it was sent; Alice gets
        his confirmation and his answer."""
        result = subprocess.run(
            example("mailbox_exchange.py", "--endpoint", self.broker.endpoint, "--timeout", "10"),
            env=self.env, capture_output=True, text=True, timeout=30,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("bob: got 'greeting' from alice", result.stdout)
        self.assertIn("alice: letter-1 confirmed: 200 read", result.stdout)
        self.assertIn("alice: got 're: greeting' from bob", result.stdout)
