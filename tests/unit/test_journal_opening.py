"""
Tests for L{malamute_pack.journal.opening}: opening a journal file and
recovering what it holds (numbers that go on across restarts, the crash's
skip, every stream numbered listed), through L{Journal.open} and directly.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal import JournalConfig
from malamute_pack.journal.opening import open_journal as open_file
from malamute_pack.journal.opening import recover
from malamute_pack.journal.schema import migrate
from tests.journal_support import ids_before
from tests.unit.test_journal_journal import Inline, append, new_path, open_journal, seqs


class RecoveryTests(TestCase):
    @inlineCallbacks
    def test_seqWithoutGapsAcrossRestarts(self) -> Inline:
        """
        Sequence numbers start at 1 per stream, have no gaps, and go on
        from where they were after the journal is closed and reopened.
        """
        path = new_path(self)
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {})
        self.assertEqual(append(journal, "a", 3), [1, 2, 3])
        self.assertEqual(append(journal, "b", 1), [1])
        yield journal.close()

        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {"a": (1, 3), "b": (1, 1)})
        self.assertEqual((journal.first_seq("a"), journal.last_seq("a")), (1, 3))
        self.assertEqual(append(journal, "a", 2), [4, 5])
        records = yield journal.read_stream("a", 1, 100)
        self.assertEqual(seqs(records), [1, 2, 3, 4, 5])

    @inlineCallbacks
    def test_crashSkipsNumbering(self) -> Inline:
        """
        After a crash (the database left marked as open) sequence numbers
        and letter ids jump by C{crash_skip}, so none handed out before the
        crash can come again, a stream the journal does not know included;
        after a clean close they go on densely.
        """
        path = new_path(self)
        config = JournalConfig(crash_skip=1000)
        crashed, _ = open_journal(self, path, config)
        base = ids_before(path)  # its letter ids start past its creation time
        append(crashed, "a", 3)
        append(crashed, "empty", 1)
        crashed.store_queued("mailbox", "rx", "tx", "s", "", None, [], lambda error: None)
        yield crashed.flush()
        # A second journal opens the file while the first still has it open:
        # what a restart after kill -9 finds.
        journal, recovered = open_journal(self, path, config)
        self.assertTrue(journal.crashed)
        self.assertEqual(recovered.streams["a"], (1, 1003))
        self.assertEqual(append(journal, "a", 1), [1004])
        records = yield journal.read_stream("a", 4, 10)
        self.assertEqual(seqs(records), [1004])
        self.assertEqual(journal.first_seq("empty"), 1)
        # A stream none of whose records was committed (its numbers may
        # have reached readers live) starts past the skip too.
        self.assertEqual(append(journal, "never-written", 1), [1001])
        record = journal.store_queued("mailbox", "rx", "tx", "s", "", None, [], lambda e: None)
        self.assertEqual(record.id, base + 1 + 1000 + 1)
        yield journal.close()
        journal, _ = open_journal(self, path, config)
        self.assertFalse(journal.crashed)
        self.assertEqual(append(journal, "a", 1), [1005])

    @inlineCallbacks
    def test_everyStreamListed(self) -> Inline:
        """
        Every stream the journal numbered is recovered, a stream whose
        records were all deleted too (first past last), and the journal
        lists their names at once.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        append(journal, "kept", 2)
        append(journal, "emptied", 3)
        yield journal.delete_stream("emptied")
        yield journal.close()
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {"kept": (1, 2), "emptied": (4, 3)})
        self.assertEqual(journal.stream_names(), ["emptied", "kept"])


class OpenFileTests(SynchronousTestCase):
    def test_opensAndMarksRunning(self) -> None:
        """
        Opening a new file creates it, finds nothing, and marks it running:
        opened again without a clean close, it counts as crashed.
        """
        path = new_path(self)
        opened = open_file(path, None, 100)
        self.assertEqual((opened.recovered.streams, opened.recovered.queued), ({}, []))
        self.assertFalse(opened.crashed)
        opened.conn.close()
        opened.reader.close()
        again = open_file(path, None, 100)
        self.addCleanup(again.conn.close)
        self.addCleanup(again.reader.close)
        self.assertTrue(again.crashed)
        self.assertEqual(again.last_id, ids_before(path) + 100)
        self.assertEqual(again.identity, opened.identity)

    def test_readerIsReadOnly(self) -> None:
        """The reader's connection refuses writes."""
        opened = open_file(new_path(self), None, 100)
        self.addCleanup(opened.conn.close)
        self.addCleanup(opened.reader.close)
        with self.assertRaises(sqlite3.OperationalError):
            opened.reader.execute("DELETE FROM streams")

    def test_notADatabase(self) -> None:
        """
        A file that is not SQLite is damaged: it is salvaged (kept aside, a
        new journal opened in its place), and since no stream's name could
        be read, a stream the journal does not know starts past the crash
        skip: no number is given twice.
        """
        path = new_path(self)
        path.parent.mkdir(parents=True)
        path.write_bytes(b"not a database" * 100)
        opened = open_file(path, None, 100)
        self.addCleanup(opened.conn.close)
        self.addCleanup(opened.reader.close)
        assert opened.salvage is not None
        self.assertEqual(opened.salvage.aside.read_bytes(), b"not a database" * 100)
        self.assertTrue(opened.salvage.streams_unknown)
        self.assertEqual(opened.recovered.stream_floor, 100)

    def test_takeoverSkips(self) -> None:
        """
        A takeover skips numbering as a crash does; C{lasts} and C{last_id}
        keep the numbers from before the skip.
        """
        path = new_path(self)
        path.parent.mkdir(parents=True)
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            migrate(conn)
            conn.execute(
                "INSERT INTO streams (stream, last_seq, message_count, total_bytes)"
                " VALUES ('s', 7, 0, 0)"
            )
            recovered, crashed, last_id = recover(conn, 50, takeover=True)
        base = ids_before(path)
        self.assertFalse(crashed)
        self.assertEqual(recovered.streams, {"s": (58, 57)})
        self.assertEqual((recovered.lasts, recovered.last_id, last_id), ({"s": 7}, base, base + 50))
