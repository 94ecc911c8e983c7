"""
Tests for the C{malamute} command (L{malamute_pack.cli.main}): the real
command (C{python -m malamute_pack.cli}) run against a real broker process,
its output and exit status checked, and every error it explains in one line:
no broker, a bad endpoint, refused credentials, an unknown stream, files
that cannot be read or written, usage errors and Ctrl-C.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import zmq.auth
from twisted.trial import unittest

from malamute_pack.client.bulk import BulkClient
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import (
    BrokerProcess,
    fresh_ipc_endpoint,
)
from tests.cli_support import COMMAND, cli_environment, kill_process, malamute
from tests.support import skip_slow


class CommandCase(unittest.TestCase):
    """Helpers: a broker process and the command run against it."""

    def start_broker(
        self,
        args: Sequence[str] = (),
        plain: tuple[str, str] | None = None,
        curve: tuple[str, str, str] | None = None,
    ) -> BrokerProcess:
        broker = BrokerProcess(Path(self.mktemp()), args=args, plain=plain, curve=curve)
        broker.start()
        self.addCleanup(broker.stop)
        return broker

    def ok(self, broker: BrokerProcess, *args: str, stdin: bytes = b"") -> str:
        """Run the command against C{broker}; it must succeed; its stdout."""
        done = malamute("-e", broker.endpoint, *args, stdin=stdin)
        self.assertEqual(done.returncode, 0, f"{args}: {done.returncode}\n{done.stderr.decode()}")
        return done.stdout.decode()

    def fails(self, *args: str, status: int = 1, stdin: bytes = b"", **env: str) -> str:
        """Run the command; it must fail with C{status} and one line on stderr; that line."""
        done = malamute(*args, stdin=stdin, **env)
        err = done.stderr.decode()
        self.assertEqual(done.returncode, status, f"{args}: {err}")
        line = err.strip().splitlines()[-1]
        if status == 1:
            self.assertTrue(line.startswith("malamute: error: "), err)
            self.assertEqual(len(err.strip().splitlines()), 1, err)
        else:  # argparse's usage, then "malamute COMMAND: error: ..."
            self.assertRegex(line, r"^malamute( \w+)?: error: ")
        return line

    def wait_committed(self, broker: BrokerProcess, stream: str, last: int) -> None:
        """Wait until C{stream}'s records up to C{last} are committed (readable by range)."""
        with BulkClient(broker.endpoint, timeout=5.0) as bulk:
            deadline = time.monotonic() + 10
            while bulk.status(stream, mlm.EARLIEST).last < last:
                if time.monotonic() > deadline:
                    self.fail(f"stream {stream} never reached {last}")
                time.sleep(0.05)


class StreamTests(CommandCase):
    """publish, tail, Ctrl-C and the status tables against one broker."""

    skip = skip_slow

    def test_publish_tail_status(self) -> None:
        """
        Published messages are tailed from earliest, a sequence number or
        a time, as text and JSON; tail stops quietly on Ctrl-C; the status
        commands show the broker's tables and JSON.
        """
        broker = self.start_broker()
        self.ok(broker, "publish", "weather", "temp.paris", "21.5")
        self.ok(broker, "publish", "weather", "raw", "-", stdin=b"\xff\x00")
        self.ok(broker, "publish", "weather", "line", "--lines", stdin=b"a b\nc\n")
        self.wait_committed(broker, "weather", 4)

        lines = self.ok(broker, "tail", "weather", "--from", "earliest", "--count", "4")
        fields = [line.split(" ", 4) for line in lines.splitlines()]
        self.assertEqual([f[0] for f in fields], ["1", "2", "3", "4"])
        self.assertEqual(
            [(f[3], f[4]) for f in fields],
            [("temp.paris", "21.5"), ("raw", "hex:ff00"), ("line", "a b"), ("line", "c")],
        )
        self.assertTrue(fields[0][2].startswith("malamute-cli."))

        records = [
            json.loads(line)
            for line in self.ok(broker, "tail", "weather", "^line", "--from", "1", "--json",
                                "--count", "2").splitlines()
        ]  # fmt: skip
        self.assertEqual([r["seq"] for r in records], [3, 4])
        self.assertEqual(records[0]["body"], "a b")
        self.assertEqual(records[0]["stream"], "weather")

        after = self.ok(broker, "tail", "weather", "--json", "--from", "2", "--count", "1")
        self.assertEqual(json.loads(after)["body_hex"], "ff00")
        stamp = json.loads(after)["timestamp"]
        at_time = self.ok(broker, "tail", "weather", "--from", stamp, "--count", "1")
        self.assertEqual(at_time.split()[0], "2")

        # Ctrl-C while it waits for live records: exit 130, nothing on
        # stderr. It is interrupted once it has shown a live record (not
        # after a fixed sleep, which a loaded machine can spend importing).
        process = subprocess.Popen(
            [*COMMAND, "-e", broker.endpoint, "tail", "weather"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_environment(),
        )
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while not select.select([process.stdout], [], [], 0.5)[0]:
            self.assertLess(time.monotonic(), deadline, "tail showed no live record")
            self.ok(broker, "publish", "weather", "live", "x")
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        self.assertEqual((process.returncode, err), (130, b""))

        status = self.ok(broker, "status")
        self.assertIn("uptime:", status)
        self.assertRegex(status, rf"endpoints: +{re.escape(broker.endpoint)}\n")
        overview = json.loads(self.ok(broker, "status", "--json"))
        self.assertEqual(overview["pid"], broker.pid)
        streams = self.ok(broker, "streams")
        self.assertEqual(streams.splitlines()[0].split()[:3], ["STREAM", "WRITERS", "READERS"])
        self.assertIn("weather", streams)
        names = [s["name"] for s in json.loads(self.ok(broker, "streams", "--json"))]
        self.assertIn("weather", names)
        self.assertIn("ADDRESS", self.ok(broker, "clients"))
        self.assertIsInstance(json.loads(self.ok(broker, "clients", "--json")), list)
        self.assertIn("$broker", self.ok(broker, "services"))
        self.assertIsInstance(json.loads(self.ok(broker, "mailboxes", "--json")), list)
        self.assertIn("no pack", self.ok(broker, "pack"))
        self.assertEqual(json.loads(self.ok(broker, "pack", "--json"))["enabled"], False)

        line = self.fails("-e", broker.endpoint, "tail", "nowhere", "--from", "earliest")
        self.assertIn("stream 'nowhere' has no records", line)


class RestartTests(CommandCase):
    """
    A broker restarted on the same data directory lists every stream of
    its journal at once (L{malamute_pack.broker.streams.Streams.restore}),
    with the journal's figures, before any client names them again.
    """

    def test_journalStreamsListedAfterRestart(self) -> None:
        """
        Records written to a stream before a restart: after it, the stream
        is listed with its last sequence number and retained records, and
        the status counts it, though no client has touched it since.
        """
        directory = Path(self.mktemp())
        data = directory / "data"
        first = BrokerProcess(directory / "first", data_dir=data)
        first.start()
        self.addCleanup(first.stop)
        self.ok(first, "publish", "weather", "temp.paris", "21.5")
        self.ok(first, "publish", "weather", "temp.oslo", "3.0")
        self.wait_committed(first, "weather", 2)
        first.stop()

        second = BrokerProcess(directory / "second", data_dir=data)
        second.start()
        self.addCleanup(second.stop)
        listed = {s["name"]: s for s in json.loads(self.ok(second, "streams", "--json"))}
        self.assertIn("weather", listed)
        self.assertEqual(listed["weather"]["last_seq"], 2)
        self.assertEqual(listed["weather"]["first_seq"], 1)
        self.assertEqual(listed["weather"]["readers"], 0)
        self.assertEqual(json.loads(self.ok(second, "status", "--json"))["streams"], 1)


class LetterTests(CommandCase):
    """send, recv, request and serve against one broker."""

    skip = skip_slow

    def serve(self, broker: BrokerProcess, *args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*COMMAND, "-e", broker.endpoint, "serve", *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=cli_environment(),
        )
        self.addCleanup(kill_process, process)
        assert process.stderr is not None
        self.assertIn(b"serving", process.stderr.readline())
        return process

    def test_send_recv(self) -> None:
        """Letters sent to a mailbox are taken by recv, as text and JSON."""
        broker = self.start_broker()
        self.ok(broker, "send", "alice", "hello", "hi there")
        self.ok(broker, "send", "alice", "raw", "-", stdin=b"\x00\x01")
        self.ok(broker, "send", "bob", "note", "for bob")
        lines = self.ok(broker, "recv", "alice", "--count", "2").splitlines()
        self.assertEqual([line.split(" ", 1)[1] for line in lines],
                         ["hello hi there", "raw hex:0001"])  # fmt: skip
        letter = json.loads(self.ok(broker, "recv", "bob", "--json", "--count", "1"))
        self.assertEqual(
            (letter["address"], letter["subject"], letter["body"]), ("bob", "note", "for bob")
        )

    def test_request_serve(self) -> None:
        """
        A worker running C{tr a-z A-Z} answers requests with its stdout; one
        whose command fails answers subject error with its stderr, which
        request reports as a failure; a request nobody serves times out.
        """
        broker = self.start_broker()
        upper = self.serve(broker, "upper", "--count", "2", "--", "tr", "a-z", "A-Z")
        self.assertEqual(self.ok(broker, "request", "upper", "s", "hello"), "HELLO")
        self.assertEqual(
            self.ok(broker, "request", "upper", "s", "-", stdin=b"from stdin\n"), "FROM STDIN\n"
        )
        self.assertEqual(upper.wait(30), 0)

        failing = self.serve(
            broker, "failing", "--count", "1", "--", "sh", "-c", "echo it broke >&2; exit 3"
        )
        line = self.fails("-e", broker.endpoint, "request", "failing", "s", "x")
        self.assertEqual(line, "malamute: error: service 'failing' answered error: it broke")
        self.assertEqual(failing.wait(30), 0)

        slow = self.serve(broker, "slow", "--count", "1", "--timeout", "0.5", "--", "sleep", "5")
        line = self.fails("-e", broker.endpoint, "request", "slow", "s", "x")
        self.assertIn("ran longer than 0.5 s", line)
        self.assertEqual(slow.wait(30), 0)

        line = self.fails("-e", broker.endpoint, "request", "nobody", "s", "x", "--timeout", "1")
        self.assertIn("no reply from service 'nobody' within 1 s", line)


class TransferTests(CommandCase):
    """export and import against one broker."""

    skip = skip_slow

    def test_export_import(self) -> None:
        """
        A stream exported to JSON lines (and Parquet with pyarrow) and
        imported into another keeps subjects and bodies; importing the same
        file again writes nothing; an unknown stream and files that cannot
        be written or read are errors.
        """
        broker = self.start_broker()
        self.ok(broker, "publish", "source", "text", "hello")
        self.ok(broker, "publish", "source", "binary", "-", stdin=b"\xff\xfe")
        self.ok(broker, "publish", "source", "text", "again")
        self.wait_committed(broker, "source", 3)
        directory = Path(self.mktemp())
        directory.mkdir()
        formats = ["out.jsonl"]
        try:
            import pyarrow  # noqa: F401

            formats.append("out.parquet")
        except ImportError:
            pass
        for name in formats:
            path = str(directory / name)
            done = malamute("-e", broker.endpoint, "export", "source", path, "--from", "earliest")
            self.assertEqual(done.returncode, 0, done.stderr.decode())
            self.assertIn(b"exported 3 records of stream source (sequence 1 to 3)", done.stderr)
            copy = f"copy-{name.split('.')[1]}"
            done = malamute("-e", broker.endpoint, "import", path, copy)
            self.assertIn(f"imported 3 records into stream {copy}".encode(), done.stderr)
            done = malamute("-e", broker.endpoint, "import", path, copy)
            self.assertIn(b"imported 0 records", done.stderr)
            self.assertIn(b"3 records already imported", done.stderr)
            self.wait_committed(broker, copy, 3)
            lines = self.ok(broker, "tail", copy, "--from", "earliest", "--count", "3")
            self.assertEqual(
                [line.split(" ", 3)[3] for line in lines.splitlines()],
                ["text hello", "binary hex:fffe", "text again"],
            )
        part = self.ok(broker, "export", "source", "-", "--from", "2", "--to", "2")
        self.assertEqual(json.loads(part)["seq"], 2)

        line = self.fails("-e", broker.endpoint, "export", "nowhere", str(directory / "x.jsonl"))
        self.assertIn("stream 'nowhere' has no records", line)
        line = self.fails("-e", broker.endpoint, "export", "source", "/nonexistent/x.jsonl")
        self.assertIn("cannot write /nonexistent/x.jsonl", line)


class ErrorTests(CommandCase):
    """The mistakes the command explains without a broker."""

    def test_no_broker(self) -> None:
        """Nothing at the endpoint: one line naming it and the options, exit 1."""
        endpoint = fresh_ipc_endpoint("cli-none")
        line = self.fails("-e", endpoint, "--timeout", "1", "status")
        self.assertEqual(
            line,
            f"malamute: error: no broker answered at {endpoint} within 1.0 s: is it running? "
            "(-e/--endpoint, MALAMUTE_ENDPOINT)",
        )
        line = self.fails("publish", "s", "x", "y", MALAMUTE_ENDPOINT=endpoint)
        self.assertIn(f"no broker answered at {endpoint} within 5.0 s", line)

    def test_bad_endpoint(self) -> None:
        """An endpoint ZeroMQ cannot take: one line, exit 1."""
        self.assertIn("bad endpoint 'nonsense'", self.fails("-e", "nonsense", "status"))
        self.assertIn("bad endpoint", self.fails("-e", "tcp://nonsense", "status"))

    def test_unreadable_file(self) -> None:
        """An import file that cannot be read: one line, exit 1."""
        line = self.fails("import", "/nonexistent/x.jsonl", "s")
        self.assertEqual(line, "malamute: error: cannot read /nonexistent/x.jsonl: no such file "
                               "or directory")  # fmt: skip

    def test_usage(self) -> None:
        """Usage errors are argparse's, exit 2; a password is never an option."""
        self.fails("bogus", status=2)
        self.fails("tail", status=2)
        self.fails("tail", "s", "--from", "yesterday", status=2)
        self.fails("--password", "x", "status", status=2)
        self.fails("serve", "svc", status=2)

    def test_password_needed(self) -> None:
        """A user without a password says where the password comes from."""
        line = self.fails("--user", "alice", "status")
        self.assertIn("MALAMUTE_PASSWORD", line)


class CredentialTests(CommandCase):
    """A broker that requires PLAIN."""

    skip = skip_slow

    def test_refused_credentials(self) -> None:
        """A wrong password, or none, is refused as such; the right one works."""
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        passwords = directory / "passwords"
        passwords.write_text("alice = secret\n")
        broker = self.start_broker(args=["--passwords", str(passwords)], plain=("alice", "secret"))
        # The login throttle delays refusals (more after each): the client
        # waits for the answer longer than its default 5 s on a loaded machine.
        line = self.fails(
            "-e", broker.endpoint, "--timeout", "30", "--user", "alice", "publish", "s", "x", "y",
            MALAMUTE_PASSWORD="wrong",
        )  # fmt: skip
        self.assertIn("refused", line)
        self.assertIn("'alice'", line)
        self.assertIn("MALAMUTE_PASSWORD", line)
        line = self.fails("-e", broker.endpoint, "--timeout", "30", "publish", "s", "x", "y")
        self.assertNotIn("no broker answered", line)
        self.assertIn("MALAMUTE_PASSWORD", line)
        password_file = directory / "password"
        password_file.write_text("secret\n")
        done = malamute(
            "-e", broker.endpoint, "--user", "alice", "--password-file", str(password_file),
            "publish", "s", "x", "y",
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        done = malamute(
            "-e", broker.endpoint, "publish", "s", "x", "y",
            MALAMUTE_USER="alice", MALAMUTE_PASSWORD="secret",
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr.decode())

    def test_curve(self) -> None:
        """
        CURVE: the broker's key from its certificate and the client's
        secret certificate work; a key the broker does not list is refused.
        """
        directory = Path(self.mktemp()).resolve()
        clients = directory / "clients"
        clients.mkdir(parents=True)
        public_file, secret_file = zmq.auth.create_certificates(str(directory), "client")
        shutil.copy(public_file, clients)
        _, stranger = zmq.auth.create_certificates(str(directory), "stranger")
        public, secret = zmq.auth.load_certificate(secret_file)
        assert secret is not None
        # The broker's key pair, made here so that the readiness probe knows its key.
        server_public, server_secret = zmq.auth.create_certificates(str(directory), "server")
        os.chmod(server_secret, 0o600)  # pyzmq writes it 0644; the broker wants its owner's only
        server_key, _ = zmq.auth.load_certificate(server_public)
        broker = self.start_broker(
            args=["--curve", str(clients), "--curve-secret", server_secret],
            curve=(server_key.decode(), public.decode(), secret.decode()),
        )
        done = malamute(
            "-e", broker.endpoint, "--curve-server-key", server_public, "--curve-keys",
            secret_file, "publish", "s", "x", "y",
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        line = self.fails(
            "-e", broker.endpoint, "publish", "s", "x", "y",
            MALAMUTE_CURVE_SERVER_KEY=server_key.decode(), MALAMUTE_CURVE_KEYS=stranger,
        )  # fmt: skip
        self.assertIn("refused", line)
        self.assertIn("--curve-keys", line)


del CommandCase  # a base, not tests
