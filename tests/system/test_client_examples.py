"""
Tests for the example scripts in ``examples/``: each runs as its own process
against a broker process, as a user would run them. Every example takes
credentials (C{--user}, the password from C{MALAMUTE_PASSWORD}); a wrong
password is one line and exit status 1; a Twisted example sent SIGTERM
closes its connection (the broker logs the close, not an expiry) and exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing import brokerprocess
from tests.support import skip_slow
from tests.system.test_client_blocking import ROOT, BrokerProcess

EXAMPLES = sorted(path.name for path in (ROOT / "examples").glob("*.py"))


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


class ExampleOptionsTests(SynchronousTestCase):
    def test_helpMentionsUser(self) -> None:
        """Every example's --help offers --user, and -e for the endpoint."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.assertGreaterEqual(len(EXAMPLES), 7)
        for name in EXAMPLES:
            result = subprocess.run(
                example(name, "--help"), env=env, capture_output=True, text=True, timeout=60
            )
            self.assertEqual(result.returncode, 0, f"{name}: {result.stderr}")
            self.assertIn("--user", result.stdout, name)
            self.assertIn("-e ENDPOINT, --endpoint ENDPOINT", result.stdout, name)

    def test_userWithoutPassword(self) -> None:
        """--user without MALAMUTE_PASSWORD is a usage error that names the variable."""
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("MALAMUTE_PASSWORD", None)
        result = subprocess.run(
            example("echo_requester.py", "--user", "bob"),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        self.assertEqual(result.returncode, 2)
        self.assertIn("MALAMUTE_PASSWORD", result.stderr)


class ExampleSecurityTests(SynchronousTestCase):
    """The examples against a broker process that requires PLAIN."""

    skip = skip_slow

    def setUp(self) -> None:
        directory = Path(self.mktemp()).resolve()
        directory.mkdir(parents=True)
        passwords = directory / "passwords"
        passwords.write_text("bob = builder\n")
        self.broker = brokerprocess.BrokerProcess(
            directory,
            bind=brokerprocess.ANY_TCP_PORT,
            args=["--passwords", str(passwords)],
            plain=("bob", "builder"),
        )
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "MALAMUTE_PASSWORD": "builder"}

    def requester(self, *args: str, password: str = "builder") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            example("echo_requester.py", "-e", self.broker.endpoint, "--timeout", "1", *args),
            env={**self.env, "MALAMUTE_PASSWORD": password},
            capture_output=True,
            text=True,
            timeout=30,
        )

    def test_wrongPasswordOneLine(self) -> None:
        """
        A wrong password: exit status 1 and one line that says the broker
        refused the credentials (not the connect timeout's message: a
        process start-up on a loaded machine can take as long as the
        timeout, so the time is not what tells them apart).
        """
        result = self.requester("--user", "bob", password="wrong")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(
            result.stderr.strip(),
            f"echo_requester: the broker at {self.broker.endpoint} refused the credentials "
            "(PLAIN user 'bob'): check --user and the password",
        )

    def test_noCredentialsOneLine(self) -> None:
        """
        Without --user: one line saying the broker requires credentials;
        the broker logs the mismatch (which never reaches ZAP).
        """
        result = self.requester()
        self.assertEqual(result.returncode, 1)
        self.assertIn("requires PLAIN/CURVE authentication", result.stderr)
        self.assertEqual(len(result.stderr.strip().splitlines()), 1, result.stderr)
        self.broker.wait_log(
            rf"(refused a client on {self.broker.endpoint}: security mechanism mismatch"
            rf"|a client on {self.broker.endpoint} broke off the PLAIN handshake)",
            5,
        )

    def test_sigtermClosesCleanly(self) -> None:
        """
        The echo worker (Twisted), with --user, sent SIGTERM: it says
        CONNECTION_CLOSE and exits 0; the broker logs its close with the
        reason and the user, not an expiry.
        """
        worker = subprocess.Popen(
            example("echo_worker.py", "-e", self.broker.endpoint, "--user", "bob"),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.addCleanup(worker.kill)
        self.broker.wait_log("client connected: address=echo-worker user=bob version=2")
        assert worker.stdout is not None
        self.assertEqual(worker.stdout.readline(), b"serving echo\n")
        worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=10)
        self.assertEqual(worker.returncode, 0, output)
        self.broker.wait_log(
            r"client closed: address=echo-worker user=bob \(CONNECTION_CLOSE\)", timeout=5
        )
        self.assertNotIn("expired", self.broker.run_log())
