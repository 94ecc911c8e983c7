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
        """
        The echo worker sends the requester's text back; the requester
        prints the id its request was stored under, then the reply.
        """
        worker = subprocess.Popen(
            example("echo_worker.py", "--endpoint", self.broker.endpoint, "--count", "1"),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.addCleanup(worker.kill)
        requester = subprocess.run(
            example(
                "echo_requester.py",
                "--endpoint",
                self.broker.endpoint,
                "--timeout",
                "10",
                "hello echo",
            ),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(requester.returncode, 0, requester.stderr)
        stored, reply = requester.stdout.strip().splitlines()
        self.assertRegex(stored, r"^request stored as [1-9][0-9]*$")
        self.assertEqual(reply, "reply from echo-worker: hello echo")
        output, _ = worker.communicate(timeout=10)
        self.assertEqual(worker.returncode, 0, output)
        self.assertIn(b"echoed 'echo'", output)

    def test_mailboxExchange(self) -> None:
        """Bob gets Alice's letter though he connected after it was sent; Alice gets
        his confirmation and his answer."""
        result = subprocess.run(
            example("mailbox_exchange.py", "--endpoint", self.broker.endpoint, "--timeout", "10"),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stdout, r"alice: wrote to bob, .*\(stored as [1-9][0-9]*\)")
        self.assertIn("bob: got 'greeting' from alice", result.stdout)
        self.assertIn("alice: letter-1 confirmed: 200 read", result.stdout)
        self.assertIn("alice: got 're: greeting' from bob", result.stdout)

    def test_weatherFromStart(self) -> None:
        """
        The consumer with --from-start prints the readings the producer
        published before it started, numbered from 1.
        """
        producer = subprocess.run(
            example(
                "weather_producer.py",
                "--endpoint",
                self.broker.endpoint,
                "--count",
                "4",
                "--interval",
                "0",
            ),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(producer.returncode, 0, producer.stderr)
        published = producer.stdout.split()[0::2]  # "subject value" lines
        consumer = subprocess.run(
            example(
                "weather_consumer.py",
                "--endpoint",
                self.broker.endpoint,
                "--from-start",
                "--pattern",
                "",
                "--count",
                "4",
            ),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(consumer.returncode, 0, consumer.stderr)
        lines = consumer.stdout.splitlines()
        self.assertEqual(
            [line.split()[:2] for line in lines],
            [[f"#{n + 1}", subject] for n, subject in enumerate(published)],
        )
