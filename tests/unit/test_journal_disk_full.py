"""
Tests for L{malamute_pack.journal} on a full disk: a journal on a small
tmpfs whose space runs out reports SQLITE_FULL as a JournalError to
on_durable and on_error, loses nothing it had acknowledged, and writes again
once space is freed.
"""

from __future__ import annotations

from pathlib import Path

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
