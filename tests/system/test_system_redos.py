"""
Catastrophic-backtracking patterns against a real broker process
(``tests/system/test_system_redos.py``): a reader or worker subscribes with
``(a+)+$`` or ``(a|aa)+$`` and a subject of thirty ``a`` and a ``b`` goes
by, which kept Python's ``re`` (and the reactor) busy for minutes. With the
patterns on RE2 (``malamute_pack/matching/regex.py``) the broker goes on
answering everyone, the pattern's owner gets exactly the subjects it
matches, and SIGTERM stops the broker cleanly.

The deadline is a liveness bound, not a benchmark: a stalled broker misses
it by minutes, a working one meets it in milliseconds.
"""

from __future__ import annotations

import time
from pathlib import Path

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.errors import MalamuteError
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.fuzz_frames import EXPLOSIVE_PATTERNS, EXPLOSIVE_SUBJECTS
from tests.support import skip_slow
from tests.system_support import Peer

# Seconds everything must be answered in: generous, as liveness goes.
DEADLINE = 10.0
EXPLOSIVE = ("(a+)+$", "(a|aa)+$")
EVIL = "a" * 30 + "b"  # matches neither: a backtracking engine tries 2**30 ways first
GOOD = "a" * 30


class RedosTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()))
        self.broker.start()
        self.addCleanup(self.broker.stop)  # a clean SIGTERM shutdown is part of each test
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def client(self, address: str) -> BlockingClient:
        client = BlockingClient(
            self.broker.endpoint, address, context=self.context, timeout=DEADLINE
        )
        self.addCleanup(client.close)
        return client

    def pinger(self, address: str) -> Peer:
        """A raw peer opened with C{address}, for timing PINGs."""
        peer = Peer(self.context, self.broker.endpoint)
        self.addCleanup(peer.close)
        self.assertEqual(peer.command(mlm.ConnectionOpen(address=address), DEADLINE), mlm.Ok())
        return peer

    def ping(self, peer: Peer) -> float:
        """Seconds C{peer}'s PING took to be answered with PONG (within the deadline)."""
        sent = time.monotonic()
        self.assertEqual(peer.command(mlm.ConnectionPing(), DEADLINE), mlm.ConnectionPong())
        return time.monotonic() - sent

    def assertBrokerAnswers(self, started: float) -> None:
        """
        A bystander's PING is answered with PONG, a command with OK, and a
        letter is stored and delivered, all before the deadline.
        """
        self.ping(self.pinger("redos-pinger"))

        bystander, inbox = self.client("redos-bystander"), self.client("redos-inbox")
        bystander.set_consumer("redos-other", "^x")
        self.assertIsInstance(bystander.sendto("redos-inbox", "hello", [b"hi"]), int)
        letter = inbox.recv(timeout=DEADLINE)
        assert letter is not None, "letter not delivered"
        self.assertEqual(letter.subject, "hello")
        self.assertLess(time.monotonic() - started, DEADLINE)

    def test_streamReader(self) -> None:
        """
        A reader with both explosive patterns: the subject that sets them off
        is not delivered, the one that matches is, and meanwhile the broker
        answers a PING, a command and a letter.
        """
        reader, writer = self.client("redos-reader"), self.client("redos-writer")
        for pattern in EXPLOSIVE:
            reader.set_consumer("redos", pattern)
        writer.set_producer("redos")
        started = time.monotonic()
        writer.send(EVIL, [b"evil"])
        writer.send(GOOD, [b"good"])
        self.assertBrokerAnswers(started)
        delivery = reader.recv(timeout=DEADLINE)
        assert delivery is not None, "the matching message was not delivered"
        self.assertEqual((delivery.subject, delivery.content), (GOOD, (b"good",)))
        self.assertIsNone(reader.recv(timeout=0.5))  # and nothing else
        self.assertLess(time.monotonic() - started, DEADLINE)

    def test_serviceWorker(self) -> None:
        """
        A worker offering ``(a+)+$``: the request whose subject sets it off
        waits for another worker, the matching one is dispatched, and
        meanwhile the broker answers a PING, a command and a letter.
        """
        worker, requester = self.client("redos-worker"), self.client("redos-requester")
        worker.set_worker("redos-service", EXPLOSIVE[0])
        started = time.monotonic()
        self.assertIsInstance(requester.sendfor("redos-service", EVIL, [b"evil"]), int)
        self.assertIsInstance(requester.sendfor("redos-service", GOOD, [b"good"]), int)
        self.assertBrokerAnswers(started)
        request = worker.recv(timeout=DEADLINE)
        assert request is not None, "the matching request was not dispatched"
        self.assertEqual((request.subject, request.content), (GOOD, (b"good",)))
        self.assertIsNone(worker.recv(timeout=0.5))
        self.assertLess(time.monotonic() - started, DEADLINE)

    def test_pingDuringExplosiveSubjects(self) -> None:
        """
        While 2000 different subjects built to set off the fuzz's explosive
        patterns (each new, so each is matched, not taken from the cache)
        pour into a stream read with all of them, a bystander's PINGs are
        answered each within the deadline; the longest round trip is
        printed (the issue's figure: under 50 ms).
        """
        reader, writer = self.client("redos-many"), self.client("redos-flood")
        for pattern in EXPLOSIVE_PATTERNS:
            reader.set_consumer("redos-many", pattern.decode())
        writer.set_producer("redos-many")
        timer = self.pinger("redos-timer")
        slowest = 0.0
        for n in range(2000):
            base = EXPLOSIVE_SUBJECTS[n % len(EXPLOSIVE_SUBJECTS)].decode()
            writer.send(f"{base[: 20 + n % 180]}{n}", [b"x"])
            if n % 20 == 0:
                slowest = max(slowest, self.ping(timer))
        print(f"\nPING round trip during 2000 explosive subjects: max {slowest * 1000:.1f} ms")

    def test_manyRegexReadersUniqueSubjects(self) -> None:
        """
        15 clients with 1000 regular-expression patterns each on one stream
        (defect 4: each new subject used to scan all 15,000): 3000 subjects
        never seen before are matched while a bystander's PINGs are answered
        each within the deadline, and the readers get exactly what matches.
        The longest PING round trip is printed, after and including the
        first subject (which builds the pattern set).
        """
        readers = []
        for c in range(15):
            reader = self.pinger(f"scan-{c}")
            for n in range(1000):
                pattern = rf"^sensor\.{c * 1000 + n}\.[a-z0-9]+\.temp$"
                reader.send(mlm.StreamRead("scan", pattern))
            for _ in range(1000):
                self.assertEqual(reader.receive(DEADLINE), mlm.Ok())
            readers.append(reader)
        writer = self.client("scan-writer")
        writer.set_producer("scan")
        timer = self.pinger("scan-timer")
        slowest = 0.0
        for n in range(3000):
            # Every 10th subject matches one reader's pattern; all are new.
            wanted = n % 10 == 0
            sensor = n * 5 if wanted else 20_000 + n
            writer.send(f"sensor.{sensor}.room{n}.{'temp' if wanted else 'hum'}", [b"x"])
            if n % 30 == 0:
                slowest = max(slowest, self.ping(timer))
        # Only sensor.N.*.temp with N below 15,000 match (N = 0, 50, ... 14950).
        delivered = 0
        deadline = time.monotonic() + DEADLINE
        while delivered < 300 and time.monotonic() < deadline:
            for reader in readers:
                for message in reader.receive_ready():
                    assert isinstance(message, mlm.StreamDeliver), message
                    self.assertTrue(message.subject.endswith(".temp"), message.subject)
                    delivered += 1
            time.sleep(0.01)
        self.assertEqual(delivered, 300)
        figure = f"max {slowest * 1000:.1f} ms"
        print(f"\nPING round trip, 15,000 regex readers, 3000 new subjects: {figure}")

    def test_backreferenceRefused(self) -> None:
        """
        A pattern RE2 cannot run (a backreference) is refused with an ERROR
        that says so, and the connection goes on working.
        """
        reader = self.client("redos-refused")
        error = self.assertRaises(MalamuteError, reader.set_consumer, "redos", r"(a)\1")
        self.assertIn("backreferences", str(error))
        reader.set_consumer("redos", "^a")

    def test_otherReadingRefused(self) -> None:
        """
        A pattern RE2 would compile only by reading it otherwise than Python
        (a repeat count past RE2's 1000, which RE2 takes as text) is answered
        with ERROR 300 naming the count, and the connection goes on working.
        """
        peer = self.pinger("redos-count")
        reason = (
            "invalid pattern: regex: repetition count 99999999999999 is more than 1000: "
            "{99999999999999}"
        )
        self.assertEqual(
            peer.command(mlm.StreamRead("redos", "a{99999999999999}"), DEADLINE),
            mlm.Error(status_code=mlm.FAILED, status_reason=reason),
        )
        self.assertEqual(peer.command(mlm.StreamRead("redos", "a{3}"), DEADLINE), mlm.Ok())
