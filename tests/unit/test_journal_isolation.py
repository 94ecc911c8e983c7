"""
Tests for L{malamute_pack.journal.writer} and L{malamute_pack.journal.errors}:
one record that cannot be written (text that is not valid UTF-8, a value
SQLite refuses) fails that record only, never the other records of its
batch nor any later batch, while a failure of the storage still fails the
whole batch.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, cast

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal import Journal, JournalError, QueuedRecord
from malamute_pack.journal.errors import storage_failure
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.writer import (
    QueuedStore,
)
from malamute_pack.protocol.records import StreamRow
from tests.journal_support import WriterCase, ids_before
from tests.support import capture_log
from tests.unit.test_journal_journal import SLOW_COMMIT, Inline, new_path, open_journal, seqs

# Stream name bytes ff 62 61 64 as the codec decodes them (surrogateescape).
BAD_TEXT = b"\xffbad".decode("utf-8", "surrogateescape")


def letter(
    journal: Journal,
    acks: dict[int, JournalError | None],
    address: str = "box",
    subject: str = "hello",
    sender: object = "alice",
) -> QueuedRecord:
    """Store a mailbox letter whose on_durable sets its id's entry in C{acks}."""
    ids: list[int] = []

    def on_durable(error: JournalError | None) -> None:
        acks[ids[0]] = error

    record = journal.store_queued(
        "mailbox", address, cast(str, sender), subject, "", None, [b"body"], on_durable
    )
    ids.append(record.id)
    return record


class RecordIsolationTests(TestCase):
    """Through the journal's facade, with the real reactor and files."""

    def setUp(self) -> None:
        self.path = new_path(self)
        # Slow commits: everything a test does in one reactor turn is one batch.
        self.journal, _ = open_journal(self, self.path, SLOW_COMMIT)
        # Letters are numbered here from the journal's first id (its ids
        # start past its creation time).
        self.base = ids_before(self.path)
        self.errors: list[JournalError] = []
        self.journal.on_error = self.errors.append
        self.log = capture_log(self)

    def numbered(self, acks: dict[int, JournalError | None]) -> dict[int, JournalError | None]:
        """C{acks} by each letter's number in the journal (1 for its first)."""
        return {rid - self.base: error for rid, error in acks.items()}

    @inlineCallbacks
    def test_badStreamRecordDroppedAlone(self) -> Inline:
        """
        A batch holding good stream records, good letters and one stream
        record whose stream name is not valid UTF-8: the good records are
        stored and the letters acknowledged with None; the bad record is
        dropped (gone from reads), counted in stream_records_dropped and
        logged with its stream and seq; it is no journal error (on_error is
        not called). The next batch is written as usual, and after a
        restart the good records are there.
        """
        journal = self.journal
        acks: dict[int, JournalError | None] = {}
        self.assertEqual(journal.append_stream("s", "w", "a", [b"1"], 1.0), 1)
        letter(journal, acks)
        self.assertEqual(journal.append_stream(BAD_TEXT, "w", "a", [b"x"], 1.0), 1)
        self.assertEqual(journal.append_stream("s", "w", "b", [b"2"], 1.0), 2)
        letter(journal, acks)
        yield journal.flush()
        self.assertEqual(self.numbered(acks), {1: None, 2: None})
        counters = journal.counters
        self.assertEqual((counters.batches, counters.records_written), (1, 4))
        self.assertEqual((counters.stream_records_dropped, counters.errors), (1, 0))
        self.assertEqual(self.errors, [])
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 10))), [1, 2])
        self.assertEqual((yield journal.read_stream(BAD_TEXT, 1, 10)), [])
        [dropped] = [e for e in self.log if "stream record dropped" in e.get("log_format", "")]
        self.assertEqual((dropped["stream"], dropped["seq"]), (ascii(BAD_TEXT), 1))

        self.assertEqual(journal.append_stream("s", "w", "c", [b"3"], 1.0), 3)
        letter(journal, acks)
        yield journal.flush()
        self.assertEqual(self.numbered(acks), {1: None, 2: None, 3: None})
        self.assertEqual((counters.batches, counters.records_written), (2, 6))
        self.assertEqual((counters.stream_records_dropped, counters.errors), (1, 0))
        yield journal.close()

        _, recovered = open_journal(self, self.path)
        self.assertEqual(recovered.streams, {"s": (1, 3)})
        self.assertEqual([r.id - self.base for r in recovered.queued], [1, 2, 3])

    @inlineCallbacks
    def test_badLetterRefusedAlone(self) -> Inline:
        """
        A letter whose address is not valid UTF-8, in a batch with good
        letters and stream records: its own on_durable gets a JournalError
        marked record_refused whose client reason says why; every other
        letter gets None, and the stream records are stored. It is counted
        in letters_refused, not as a journal error, and its id is not
        handed out again after a restart.
        """
        journal = self.journal
        acks: dict[int, JournalError | None] = {}
        letter(journal, acks)
        journal.append_stream("s", "w", "a", [b"1"], 1.0)
        letter(journal, acks, address=BAD_TEXT)
        letter(journal, acks)
        yield journal.flush()
        self.assertEqual((acks[self.base + 1], acks[self.base + 3]), (None, None))
        refusal = acks[self.base + 2]
        assert isinstance(refusal, JournalError)
        self.assertTrue(refusal.record_refused)
        self.assertFalse(refusal.disk_full)
        self.assertEqual(refusal.reason, "record refused: text that is not valid UTF-8")
        self.assertIn(f"letter {self.base + 2} for mailbox", str(refusal))
        self.assertIsInstance(refusal.__cause__, UnicodeEncodeError)
        counters = journal.counters
        self.assertEqual((counters.letters_refused, counters.errors), (1, 0))
        self.assertEqual((counters.batches, counters.records_written), (1, 3))
        self.assertEqual(self.errors, [])
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 10))), [1])
        yield journal.close()

        reopened, recovered = open_journal(self, self.path)
        self.assertEqual([r.id - self.base for r in recovered.queued], [1, 3])
        self.assertEqual(letter(reopened, acks).id - self.base, 4)

    @inlineCallbacks
    def test_recordSQLiteRefusesFailsAlone(self) -> Inline:
        """
        Records that SQLite itself refuses (a trigger's ABORT, a value of
        the wrong type for a STRICT column) fail alone, each with its own
        error naming SQLite's reason; the other letters of the batch are
        stored.
        """
        with closing(sqlite3.connect(self.path, isolation_level=None)) as conn:
            conn.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON queued_messages "
                "WHEN new.subject = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
            )
        journal = self.journal
        acks: dict[int, JournalError | None] = {}
        for subject in ("fine", "poison", "fine"):
            letter(journal, acks, subject=subject)
        letter(journal, acks, sender=b"not text")
        yield journal.flush()
        self.assertEqual((acks[self.base + 1], acks[self.base + 3]), (None, None))
        poisoned, mistyped = acks[self.base + 2], acks[self.base + 4]
        assert isinstance(poisoned, JournalError) and isinstance(mistyped, JournalError)
        self.assertEqual(poisoned.reason, "record refused: poisoned")
        self.assertIn("cannot store BLOB value in TEXT column", mistyped.reason)
        self.assertEqual(journal.counters.letters_refused, 2)
        self.assertEqual(self.errors, [])
        yield journal.close()
        _, recovered = open_journal(self, self.path)
        self.assertEqual([r.id - self.base for r in recovered.queued], [1, 3])

    @inlineCallbacks
    def test_badStreamDeleteFailsAlone(self) -> Inline:
        """
        An operator's delete of a stream whose name SQLite cannot take fails
        alone, its Deferred with an error that names it; the letters and the
        other stream's delete of its batch are written.
        """
        journal = self.journal
        acks: dict[int, JournalError | None] = {}
        journal.append_stream("s", "w", "a", [b"1"], 1.0)
        journal.append_stream(BAD_TEXT, "w", "a", [b"1"], 1.0)
        yield journal.flush()
        letter(journal, acks)
        bad = journal.delete_stream(BAD_TEXT)
        good = journal.delete_stream("s")
        letter(journal, acks)
        failure = yield self.assertFailure(bad, JournalError)
        self.assertEqual((yield good), (1, 4 + 1))
        self.assertEqual(self.numbered(acks), {1: None, 2: None})
        self.assertTrue(failure.record_refused)
        self.assertIn("deleting stream", str(failure))
        self.assertEqual(journal.counters.errors, 0)
        self.assertEqual((yield journal.read_stream("s", 1, 10)), [])

    @inlineCallbacks
    def test_badSubjectKeepsStreamNumbering(self) -> Inline:
        """
        A stream record dropped for its subject, in a stream whose name is
        fine: its sequence number is still saved as the stream's last, so
        it is not handed out again after a restart.
        """
        journal = self.journal
        journal.append_stream("s", "w", "fine", [b"1"], 1.0)
        journal.append_stream("s", "w", BAD_TEXT, [b"2"], 1.0)
        yield journal.flush()
        self.assertEqual(journal.counters.stream_records_dropped, 1)
        yield journal.close()
        reopened, recovered = open_journal(self, self.path)
        self.assertEqual(recovered.streams, {"s": (1, 2)})
        self.assertEqual(reopened.append_stream("s", "w", "next", [], 2.0), 3)


class WriterTests(WriterCase):
    """The writer thread alone, on a connection the test controls."""

    config = SLOW_COMMIT

    def row(self, stream: str, seq: int) -> StreamRow:
        return stream_row(stream, seq, 1.0, "w", "subject", [b"x"])

    def store(self, rid: int, acks: list[Any]) -> QueuedStore:
        record = QueuedRecord(rid, "mailbox", "box", "a", "s", "", None, 1.0, (b"x",))
        return QueuedStore(record, acks.append)

    def savepoints(self) -> int:
        return sum(1 for s in self.statements if s.startswith("SAVEPOINT"))

    @inlineCallbacks
    def test_nothingSticks(self) -> Inline:
        """
        After a batch with a record whose stream name cannot be stored, the
        next batches take the fast path again (no savepoints): nothing of
        that stream, not even its high-water mark, is retried.
        """
        yield self.write(self.row("s", 1), self.row(BAD_TEXT, 1), self.row("s", 2))
        self.assertGreater(self.savepoints(), 0)
        [outcome] = self.batches
        self.assertEqual([(d.stream, d.seq) for d in outcome.dropped], [(BAD_TEXT, 1)])
        self.assertEqual(outcome.stream_last, {"s": 2, BAD_TEXT: 1})
        for seq in (3, 4):
            yield self.write(self.row("s", seq))
            self.assertEqual(self.savepoints(), 0, self.statements)
        self.assertEqual([b.error for b in self.batches], [None] * 3)
        self.assertEqual([len(b.dropped) for b in self.batches], [1, 0, 0])
        rows = self.conn.execute("SELECT stream, last_seq, message_count FROM streams").fetchall()
        self.assertEqual(rows, [("s", 4, 4)])

    @inlineCallbacks
    def test_largeBatchOneBadRecord(self) -> Inline:
        """
        In a batch of many chunks, only the chunk holding the bad record is
        retried row by row: every other record is written, in one
        savepoint per chunk.
        """
        rows = [self.row("s", seq) for seq in range(1, 301)]
        rows[150] = self.row(BAD_TEXT, 1)
        yield self.write(*rows)
        [outcome] = self.batches
        self.assertEqual(outcome.records, 299)
        self.assertEqual(len(outcome.dropped), 1)
        # Three chunks, then the failed chunk's 128 rows one by one, then
        # the high-water marks of the two streams, one by one.
        self.assertEqual(self.savepoints(), 3 + 128 + 2)
        (count,) = self.conn.execute("SELECT count(*) FROM stream_messages").fetchone()
        self.assertEqual(count, 299)

    @inlineCallbacks
    def test_storageFailureFailsWholeBatch(self) -> Inline:
        """
        A failure of the storage (here SQLITE_BUSY: another connection holds
        the write lock) fails the whole batch as before: every letter's
        on_durable gets the batch's error, no record is tried alone, and
        once the lock is gone the next batch commits.
        """
        self.conn.execute("PRAGMA busy_timeout = 0")
        acks: list[Any] = []
        with closing(sqlite3.connect(self.path, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            yield self.write(self.row("s", 1), self.store(1, acks), self.store(2, acks))
            other.execute("ROLLBACK")
        [outcome] = self.batches
        error = outcome.error
        assert error is not None
        self.assertEqual(error.sqlite_error, "SQLITE_BUSY")
        self.assertFalse(error.record_refused)
        self.assertEqual((outcome.refused, outcome.dropped), ([], []))
        self.assertEqual(self.savepoints(), 0)
        for callback in outcome.callbacks:
            callback(outcome.error)
        self.assertEqual(acks, [error, error])

        yield self.write(self.row("s", 2), self.store(3, acks))
        self.assertIsNone(self.batches[1].error)
        for callback in self.batches[1].callbacks:
            callback(None)
        self.assertEqual(acks[2:], [None])
        # The failed batch's high-water marks were saved with this one.
        self.assertEqual(
            self.conn.execute("SELECT last_seq FROM streams WHERE stream = 's'").fetchone(), (2,)
        )


class ClassificationTests(SynchronousTestCase):
    def test_storageFailures(self) -> None:
        """
        OS errors, no memory and SQLite's codes for a full disk, an I/O
        error, a corrupt, read-only or busy database are the storage's
        failures; invalid text, numbers out of range, constraints and
        binding errors are one record's.
        """
        for code in (
            sqlite3.SQLITE_FULL,
            sqlite3.SQLITE_IOERR | (1 << 8),  # an extended I/O error code
            sqlite3.SQLITE_CORRUPT,
            sqlite3.SQLITE_READONLY,
            sqlite3.SQLITE_BUSY,
        ):
            error = sqlite3.OperationalError("storage")
            error.sqlite_errorcode = code
            self.assertTrue(storage_failure(error), code)
        self.assertTrue(storage_failure(OSError(28, "No space left on device")))
        self.assertTrue(storage_failure(MemoryError()))
        constraint = sqlite3.IntegrityError("constraint")
        constraint.sqlite_errorcode = sqlite3.SQLITE_CONSTRAINT | (12 << 8)
        record_failures: list[Exception] = [
            OverflowError("Python int too large to convert to SQLite INTEGER"),
            constraint,
            sqlite3.ProgrammingError("Error binding parameter 1"),
        ]
        try:
            BAD_TEXT.encode()
        except UnicodeEncodeError as e:
            record_failures.append(e)
        self.assertEqual(len(record_failures), 4)
        for failure in record_failures:
            self.assertFalse(storage_failure(failure), failure)

    def test_refusedMessage(self) -> None:
        """
        JournalError.refused names the journal and the record in its
        message, gives clients a short reason without the path, and is
        chained to its cause.
        """
        cause = OverflowError("Python int too large to convert to SQLite INTEGER")
        error = JournalError.refused(cause, Path("/data/journal.sqlite"), "letter 7")
        self.assertEqual(
            str(error),
            "journal /data/journal.sqlite: letter 7 cannot be written: OverflowError: "
            "Python int too large to convert to SQLite INTEGER",
        )
        self.assertEqual(
            error.reason, "record refused: Python int too large to convert to SQLite INTEGER"
        )
        self.assertIs(error.__cause__, cause)
        self.assertTrue(error.record_refused)
