"""
Slow system tests of the broker's data directory and journal safety with
the broker as a real process (L{malamute_pack.testing.brokerprocess}):

- one broker per data directory: a second broker on it exits non-zero
  naming the first's pid, and touches nothing; after the first is killed
  with SIGKILL a new one starts (the kernel released the lock) and claims
  only what is true (a crash, the letters it holds);
- a journal file truncated to 0 bytes or deleted between runs makes the
  broker refuse to start, saying what happened and what to do, instead of
  starting afresh without the letters it held; restored, they are back;
- a stream record whose stream name is not valid UTF-8 never makes other
  clients' letters fail (the journal drops that record alone, or the door
  refuses the name first).

Skipped with ``MALAMUTE_SKIP_SLOW=1``. Run with
``.venv/bin/python -m twisted.trial tests.system.test_system_journal_safety``.

Tests: this is a test module; its helpers are ``tests/system_support.py``
and the broker process of L{malamute_pack.testing.brokerprocess}.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal import JOURNAL_MARKER
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import (
    BrokerError,
    BrokerProcess,
    fresh_ipc_endpoint,
)
from tests.support import skip_slow
from tests.system_support import Peer

LETTERS = 20
# Stream name bytes ff 62 61 64 as the codec keeps them (surrogateescape).
BAD_STREAM = b"\xffbad".decode("utf-8", "surrogateescape")


class JournalSafetyCase(SynchronousTestCase):
    """
    Brokers as processes on one data directory, C{data} in the test's
    directory, and ZeroMQ peers; all torn down after each test.
    """

    def setUp(self) -> None:
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.data_dir = self.base / "data"
        self.journal = self.data_dir / "journal.sqlite"
        self.marker = self.data_dir / JOURNAL_MARKER
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def broker(self, label: str, *, journal: bool = True) -> BrokerProcess:
        """A broker (not started) on the shared data directory, in a directory of its own."""
        broker = BrokerProcess(
            self.base / label,
            bind=fresh_ipc_endpoint(f"safety-{label}"),
            data_dir=self.data_dir,
            journal=journal,
        )
        self.addCleanup(broker.kill)
        return broker

    def refused_start(self, broker: BrokerProcess) -> str:
        """
        Run C{broker} in the foreground: it must exit non-zero without
        binding anything. What it wrote (its log and stderr).
        """
        try:
            code, output = broker.run_until_exit()
        except BrokerError as e:
            raise AssertionError(str(e)) from e
        self.assertNotEqual(code, 0, output)
        self.assertNotIn("Malamute broker bound to", output)
        return output

    def peer(self, broker: BrokerProcess, version: int = 2, address: str = "") -> Peer:
        """A peer of C{broker}, opened with C{version} and C{address}."""
        peer = Peer(self.context, broker.endpoint)
        self.addCleanup(peer.close)
        reply = peer.command(mlm.ConnectionOpen(version=version, address=address))
        self.assertEqual(reply, mlm.Ok(), broker.log_text())
        return peer

    def post(self, broker: BrokerProcess, sender: Peer, subject: str) -> None:
        """Send a letter to C{inbox}; it must get STORED 200."""
        reply = sender.command(mlm.MailboxSend("inbox", subject, subject, 0, [b"body"]))
        assert isinstance(reply, mlm.Stored), f"{reply}\n{broker.log_text()}"
        self.assertEqual(reply.status_code, mlm.SUCCESS, f"{reply}\n{broker.log_text()}")

    def post_letters(self, broker: BrokerProcess) -> list[str]:
        """LETTERS letters to C{inbox}, each STORED 200; their subjects."""
        sender = self.peer(broker, address="tx")
        subjects = [f"letter-{i}" for i in range(LETTERS)]
        for subject in subjects:
            self.post(broker, sender, subject)
        return subjects

    def receive_mail(self, broker: BrokerProcess) -> list[str]:
        """Subjects of what C{inbox} gets until quiet for 1 s, each answered with DONE."""
        inbox = self.peer(broker, address="inbox")
        got: list[str] = []
        while (record := inbox.receive(1.0)) is not None:
            assert isinstance(record, mlm.MailboxRecord), record
            got.append(record.subject)
            inbox.send(mlm.Done(record.id, mlm.SUCCESS, ""))
        return got


class OneBrokerPerDataDirTests(JournalSafetyCase):
    skip = skip_slow

    def test_secondBrokerRefusedUntilFirstDies(self) -> None:
        """
        While a broker runs, a second one on its data directory exits
        non-zero with a message naming the first's pid, opening no journal
        (so it claims no crash). The first goes on serving, and after a
        clean stop and restart it does not claim a crash either. Once the
        first is killed with SIGKILL, a new broker starts on the directory
        (the kernel released the lock), says truly that the last run
        crashed, holds exactly the letters stored, and records its own pid
        in the lock.
        """
        first = self.broker("first")
        first.start()
        letters = self.post_letters(first)

        output = self.refused_start(self.broker("second"))
        self.assertIn(
            f"data directory {self.data_dir} is in use by another broker: process {first.pid} on ",
            output,
        )
        self.assertIn("Stop that broker first, or give this one another --data-dir.", output)
        self.assertNotIn("letters waiting", output)
        self.assertNotIn("crashed", output)
        ping = self.peer(first, version=1)
        self.assertEqual(ping.command(mlm.ConnectionPing()), mlm.ConnectionPong())

        first.stop()
        first.start()
        log = first.run_log()
        self.assertIn(f"0 streams, {LETTERS} letters waiting\n", log)
        self.assertNotIn("crashed", log)

        self.assertIn(f"process {first.pid} on ", self.refused_start(self.broker("third")))
        killed = first.pid
        first.kill()
        fourth = self.broker("fourth")
        fourth.start()
        log = fourth.run_log()
        self.assertIn(f"{LETTERS} letters waiting (the last run crashed", log)
        self.assertIn(f"locked by process {fourth.pid} on ", log)
        self.assertNotIn(str(killed), (self.data_dir / "lock").read_text())
        self.assertEqual(sorted(self.receive_mail(fourth)), sorted(letters))
        fourth.stop()

    def test_lockedWithoutJournal(self) -> None:
        """
        With --no-journal the data directory is still the broker's: a
        second broker (journal or not) is refused naming the first, and no
        journal is made.
        """
        first = self.broker("first", journal=False)
        first.start()
        for label, journal in (("second", False), ("third", True)):
            output = self.refused_start(self.broker(label, journal=journal))
            self.assertIn(f"is in use by another broker: process {first.pid} on ", output)
        self.assertFalse(self.journal.exists())
        first.stop()


class JournalIdentityTests(JournalSafetyCase):
    skip = skip_slow

    def setUp(self) -> None:
        super().setUp()
        self.first = self.broker("first")
        self.first.start()
        self.letters = self.post_letters(self.first)
        self.first.stop()
        self.backup = self.base / "journal.backup"
        shutil.copy(self.journal, self.backup)

    def restored(self) -> BrokerProcess:
        """With the backup put back, a broker starts and holds the letters."""
        shutil.copy(self.backup, self.journal)
        broker = self.broker("restored")
        broker.start()
        self.assertIn(f"{LETTERS} letters waiting", broker.run_log())
        self.assertEqual(sorted(self.receive_mail(broker)), sorted(self.letters))
        return broker

    def test_truncatedJournalRefused(self) -> None:
        """
        A journal truncated to 0 bytes between runs: the broker exits
        non-zero saying the journal is empty, that its letters are not in
        it, and to restore it or remove the marker; it leaves the file as
        it is. Put back, the letters are all there.
        """
        os.truncate(self.journal, 0)
        output = self.refused_start(self.broker("truncated"))
        self.assertIn(f"journal {self.journal} is empty (0 bytes: it was truncated)", output)
        self.assertIn("the letters and stream records it held are not in it", output)
        self.assertIn("Restore the journal file", output)
        self.assertIn(f"remove {self.marker}", output)
        self.assertEqual(self.journal.stat().st_size, 0)
        self.restored().stop()

    def test_deletedJournalRefused(self) -> None:
        """
        A deleted journal: the broker exits non-zero saying it is missing
        and makes no new one. Put back, the letters are all there; with the
        marker removed on purpose instead, a broker starts afresh.
        """
        self.journal.unlink()
        output = self.refused_start(self.broker("deleted"))
        self.assertIn(f"journal {self.journal} is missing", output)
        self.assertIn(f"remove {self.marker}", output)
        self.assertFalse(self.journal.exists())
        self.restored().stop()

        self.journal.unlink()
        self.marker.unlink()
        afresh = self.broker("afresh")
        afresh.start()
        self.assertIn("0 streams, 0 letters waiting", afresh.run_log())
        self.assertTrue(self.marker.exists())
        afresh.stop()


class BadStreamNameTests(JournalSafetyCase):
    skip = skip_slow

    def test_badStreamNameFailsNoLetter(self) -> None:
        """
        A writer whose stream name is the bytes ff 62 61 64 (not UTF-8)
        sends stream messages interleaved with another client's letters:
        every letter gets STORED 200 and reaches its recipient, and the
        broker says what it did with the bad name: the journal dropped
        those stream records alone (logged), or the door refused the name.
        """
        broker = self.broker("bad")
        broker.start()
        writer = self.peer(broker, version=1, address="")
        opened = writer.command(mlm.StreamWrite(BAD_STREAM))
        sender = self.peer(broker, address="tx")
        subjects = [f"letter-{i}" for i in range(LETTERS)]
        for subject in subjects:
            writer.send(mlm.StreamSend("tick", [b"x"]))
            self.post(broker, sender, subject)
        self.assertEqual(sorted(self.receive_mail(broker)), sorted(subjects))
        log = broker.log_text(tail=1_000_000)
        self.assertNotIn("journal write failed", log)
        if opened == mlm.Ok():
            # No door yet: the journal isolates the bad records.
            self.assertIn("stream record dropped: stream '\\udcffbad'", log)
        else:
            self.assertIsInstance(opened, mlm.Error)
        broker.stop()


class RefusedStartTests(JournalSafetyCase):
    skip = skip_slow

    def test_brokerProcessStartFails(self) -> None:
        """
        L{BrokerProcess.start} of a refused broker raises BrokerError with
        the exit status and the refusal in its message (what a script that
        starts brokers sees).
        """
        first = self.broker("first")
        first.start()
        with self.assertRaises(BrokerError) as caught:
            self.broker("second").start()
        self.assertIn("broker exited with 1", str(caught.exception))
        self.assertIn(f"process {first.pid} on ", str(caught.exception))
        first.stop()
