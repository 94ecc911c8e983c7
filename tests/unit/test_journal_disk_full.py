"""
Tests for L{malamute_pack.journal} on a full disk: a journal on a small
tmpfs whose space runs out reports SQLITE_FULL as a JournalError to
on_durable and on_error, loses nothing it had acknowledged, writes nothing
handed over before the reactor heard of a failure, writes again once
space is freed, and never gives again after a clean close the numbers it
gave to what the full disk refused.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalError
from tests.support import fill_disk, mount_tmpfs, skip_slow
from tests.unit.test_journal_journal import Inline, open_journal, seqs


class DiskFullTests(TestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.mount = Path(self.mktemp()).resolve()
        # Registered first, so it is unmounted after the journal's own close.
        mount_tmpfs(self, self.mount, "512k")

    @inlineCallbacks
    def test_fullDiskReportedAndRecovered(self) -> Inline:
        """
        With the disk full, a batch fails with a JournalError flagged
        disk_full that reaches every on_durable of the batch and on_error;
        the journal keeps serving, and after space is freed the next batch
        commits, while the failed records are not in the database and
        their sequence numbers are not reused.
        """
        path = self.mount / "journal.db"
        journal, _ = open_journal(self, path)
        errors: list[JournalError] = []
        journal.on_error = errors.append
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "before", "t", None, [b"ok"], acks.append)
        yield journal.flush()
        self.assertEqual(acks, [None])

        filler = self.mount / "filler"
        fill_disk(filler)
        self.assertEqual(journal.append_stream("s", "a", "b", [b"x" * 65536], 1.0), 1)
        journal.store_queued("mailbox", "m", "a", "lost", "t", None, [b"y" * 65536], acks.append)
        yield journal.flush()
        self.assertEqual(len(acks), 2)
        failure = acks[1]
        assert isinstance(failure, JournalError)
        self.assertTrue(failure.disk_full, str(failure))
        self.assertEqual(failure.sqlite_error, "SQLITE_FULL")
        self.assertIn("disk is full", str(failure))
        self.assertEqual(errors, [failure])
        self.assertEqual(journal.counters.errors, 1)
        # Still serving: reads work, and writes are accepted (and fail) while full.
        self.assertEqual((yield journal.read_stream("s", 1, 10)), [])
        journal.store_queued("mailbox", "m", "a", "lost", "t", None, [b"z" * 65536], acks.append)
        yield journal.flush()
        self.assertIsInstance(acks[2], JournalError)
        self.assertEqual(journal.counters.errors, 2)

        filler.unlink()
        self.assertEqual(journal.append_stream("s", "a", "b", [b"x"], 2.0), 2)
        journal.store_queued("mailbox", "m", "a", "after", "t", None, [b"ok"], acks.append)
        yield journal.flush()
        self.assertEqual(acks[3:], [None])
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 10))), [2])
        yield journal.close()

        journal, recovered = open_journal(self, path)
        self.assertEqual([r.subject for r in recovered.queued], ["before", "after"])
        self.assertEqual(recovered.streams, {"s": (2, 2)})
        self.assertEqual(journal.append_stream("s", "a", "b", [], 3.0), 3)

    @inlineCallbacks
    def test_writesBeforeTheFailureWasHeardFail(self) -> Inline:
        """
        A batch fails on the full disk; space frees, and a second batch is
        handed over before the reactor has heard of the failure: it fails
        too, unwritten, with the first one's reason (written, it would
        land before the first one's retry: out of order). What is handed
        over once the reactor heard is written.
        """
        path = self.mount / "journal.db"
        journal, _ = open_journal(self, path)
        errors: list[JournalError] = []
        journal.on_error = errors.append
        writer = journal._hand.writer
        assert writer is not None
        reported = threading.Event()
        call_from_thread = writer._call_from_thread

        def report(f: Any, *args: Any) -> None:
            call_from_thread(f, *args)
            reported.set()

        writer._call_from_thread = report
        filler = self.mount / "filler"
        fill_disk(filler)
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "first", "t", None, [b"y" * 65536], acks.append)
        journal._hand.hand_over()
        # The writer reported the failure; the reactor (this thread) has not run it.
        self.assertTrue(reported.wait(30))
        filler.unlink()
        journal.append_stream("s", "a", "b", [b"x"], 1.0)
        journal.store_queued("mailbox", "m", "a", "second", "t", None, [b"ok"], acks.append)
        journal._hand.hand_over()
        yield journal.flush()
        self.assertEqual(len(acks), 2)
        first, second = acks
        assert isinstance(first, JournalError) and isinstance(second, JournalError)
        self.assertTrue(first.disk_full)
        self.assertTrue(second.disk_full)
        self.assertIn("came after one that failed", str(second))
        self.assertEqual(second.reason, first.reason)
        self.assertEqual(len(errors), 2)
        self.assertEqual((yield journal.read_stream("s", 1, 10)), [])

        journal.append_stream("s", "a", "b", [b"x"], 2.0)
        journal.store_queued("mailbox", "m", "a", "third", "t", None, [b"ok"], acks.append)
        yield journal.flush()
        self.assertEqual(acks[2:], [None])
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 10))), [2])
        yield journal.close()

    @inlineCallbacks
    def test_numbersOfFailedWritesNotGivenAgainAfterACleanClose(self) -> Inline:
        """
        Letters and stream records fail on the full disk; space frees and
        the journal closes cleanly with no write committed since: opened
        again, it gives neither a letter id nor a stream number that the
        failed ones had (a client that saw a letter id drops a later letter
        with the same one as a repeat: the soak lost letters so, after a
        broker's clean restart that followed a full disk).
        """
        path = self.mount / "journal.db"
        journal, _ = open_journal(self, path)
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "before", "t", None, [b"ok"], acks.append)
        self.assertEqual(journal.append_stream("s", "a", "b", [b"ok"], 1.0), 1)
        yield journal.flush()
        self.assertEqual(acks, [None])

        filler = self.mount / "filler"
        fill_disk(filler)
        failed = [
            journal.store_queued(
                "mailbox", "m", "a", "lost", "t", None, [b"y" * 65536], acks.append
            ).id
            for _ in range(3)
        ]
        self.assertEqual(journal.append_stream("s", "a", "b", [b"x" * 65536], 2.0), 2)
        self.assertEqual(journal.append_stream("s", "a", "b", [b"x" * 65536], 3.0), 3)
        yield journal.flush()
        self.assertEqual(len(acks), 4)
        self.assertTrue(all(isinstance(ack, JournalError) for ack in acks[1:]), acks)
        filler.unlink()
        yield journal.close()

        journal, recovered = open_journal(self, path)
        self.assertEqual([r.subject for r in recovered.queued], ["before"])
        after = journal.store_queued("mailbox", "m", "a", "after", "t", None, [b"ok"], acks.append)
        self.assertGreater(after.id, max(failed))
        self.assertGreater(journal.append_stream("s", "a", "b", [b"ok"], 4.0), 3)
        yield journal.flush()
        self.assertEqual(acks[4:], [None])
