"""
Tests for L{malamute_pack.journal.journal} and L{malamute_pack.journal.writer}
with the real reactor, real threads and real SQLite files: sequence numbers,
reads that include uncommitted records, group commit, durable callbacks,
recovery, and failed batches.

Also holds L{open_journal}, which the other journal test modules use.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Generator
from contextlib import closing
from pathlib import Path
from typing import Any, cast

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal import (
    Journal,
    JournalConfig,
    JournalError,
    QueuedRecord,
    Recovered,
    StreamRecord,
)
from malamute_pack.journal import writer as writer_module
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.schema import migrate
from malamute_pack.journal.writer import (
    Barrier,
    BatchOutcome,
    JournalWriter,
    PruneOutcome,
    QueuedStore,
    Stop,
)
from malamute_pack.protocol.records import StreamRow

Inline = Generator[Deferred[Any], Any, None]

# Long enough that records are certainly still uncommitted when a test looks.
SLOW_COMMIT = JournalConfig(commit_interval_s=0.4)


def new_path(case: SynchronousTestCase) -> Path:
    """A journal path in a new directory of the test's own."""
    return Path(case.mktemp()) / "journal.db"


def open_journal(
    case: SynchronousTestCase,
    path: Path | None = None,
    config: JournalConfig | None = None,
    clock: IReactorTime = reactor,
) -> tuple[Journal, Recovered]:
    """Open a journal (at a new path by default) that the test closes at cleanup."""
    journal = Journal(path if path is not None else new_path(case), clock, config)
    recovered = journal.open()
    case.addCleanup(journal.close)
    return journal, recovered


def append(journal: Journal, stream: str, n: int, timestamp: float = 1000.0) -> list[int]:
    """Append ``n`` numbered messages to ``stream``; return their seqs."""
    return [
        journal.append_stream(stream, "sender", f"subject.{i}", [b"body", b"%d" % i], timestamp)
        for i in range(n)
    ]


def seqs(records: list[StreamRecord]) -> list[int]:
    return [record.seq for record in records]


class StreamTests(TestCase):
    @inlineCallbacks
    def test_seqAtTime(self) -> Inline:
        """
        seq_at_time is the first seq whose timestamp is at or after the
        time, committed or not, and last_seq + 1 when there is none.
        """
        journal, _ = open_journal(self, config=SLOW_COMMIT)
        for i in range(5):
            journal.append_stream("s", "x", "y", [], 100.0 + i)
        yield journal.flush()
        for i in range(5, 10):
            journal.append_stream("s", "x", "y", [], 100.0 + i)
        self.assertEqual((yield journal.seq_at_time("s", 0.0)), 1)
        self.assertEqual((yield journal.seq_at_time("s", 102.5)), 4)
        self.assertEqual((yield journal.seq_at_time("s", 103.0)), 4)
        self.assertEqual((yield journal.seq_at_time("s", 107.0)), 8)
        self.assertEqual((yield journal.seq_at_time("s", 500.0)), 11)


class GroupCommitTests(TestCase):
    @inlineCallbacks
    def test_maxBatchOfOne(self) -> Inline:
        """
        With commit_max_batch 1 every record is its own transaction.
        """
        journal, _ = open_journal(self, config=JournalConfig(commit_max_batch=1))
        append(journal, "s", 20)
        yield journal.flush()
        self.assertEqual(journal.counters.batches, 20)

    @inlineCallbacks
    def test_synchronousPerBatch(self) -> Inline:
        """
        Before each transaction the writer sets PRAGMA synchronous to the
        strongest level its records need: the stream level for streams
        only, the queue level as soon as a queued record is in the batch.
        """
        path = new_path(self)
        path.parent.mkdir()
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        migrate(conn)
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        config = JournalConfig(stream_synchronous="OFF", queue_synchronous="EXTRA")
        batches: list[BatchOutcome] = []
        prunes: list[PruneOutcome] = []
        writer = JournalWriter(
            conn,
            path,
            config,
            cast(IReactorFromThreads, reactor).callFromThread,
            batches.append,
            prunes.append,
        )
        writer.start()

        def barrier() -> Deferred[None]:
            done: Deferred[None] = Deferred()
            writer.submit(Barrier(lambda: done.callback(None)))
            return done

        def stream_record(seq: int) -> StreamRow:
            return stream_row("s", seq, 1.0, "a", "b", ())

        def queued_store(rid: int) -> QueuedStore:
            record = QueuedRecord(rid, "mailbox", "m", "a", "b", "t", None, 1.0, ())
            return QueuedStore(record, lambda error: None)

        writer.submit(stream_record(1))
        yield barrier()
        writer.submit(stream_record(2))
        writer.submit(queued_store(1))
        yield barrier()
        writer.submit(stream_record(3))
        yield barrier()
        stopped: Deferred[None] = Deferred()
        writer.submit(Stop(lambda: stopped.callback(None)))
        yield stopped
        pragmas = [s for s in statements if s.startswith(("PRAGMA synchronous", "BEGIN"))]
        self.assertEqual(
            pragmas,
            [
                "PRAGMA synchronous = OFF",
                "BEGIN",
                "PRAGMA synchronous = EXTRA",
                "BEGIN",
                "PRAGMA synchronous = OFF",
                "BEGIN",
            ],
        )
        self.assertEqual([b.error for b in batches], [None, None, None])


class QueuedTests(TestCase):
    def store(
        self, journal: Journal, address: str, acks: list[tuple[int, JournalError | None]]
    ) -> QueuedRecord:
        holder: list[QueuedRecord] = []
        record = journal.store_queued(
            "mailbox",
            address,
            "alice",
            "hello",
            "track-1",
            2000.5,
            [b"hi", b""],
            lambda error: acks.append((holder[0].id, error)),
        )
        holder.append(record)
        return record

    @inlineCallbacks
    def test_onDurableOnlyAfterCommit(self) -> Inline:
        """
        on_durable is not called by store_queued; when it is called (with
        None) the record is already visible to another connection.
        """
        journal, _ = open_journal(self, config=SLOW_COMMIT)
        durable: Deferred[bool] = Deferred()

        def on_durable(error: JournalError | None) -> None:
            self.assertIsNone(error)
            with closing(sqlite3.connect(journal.path)) as other:
                row = other.execute("SELECT id FROM queued_messages WHERE id = ?", (record.id,))
                durable.callback(row.fetchone() is not None)

        record = journal.store_queued("service", "echo", "c", "s", "t", None, [b"x"], on_durable)
        self.assertFalse(durable.called)
        with closing(sqlite3.connect(journal.path)) as other:
            self.assertEqual(other.execute("SELECT count(*) FROM queued_messages").fetchone(), (0,))
        self.assertTrue((yield durable))

    @inlineCallbacks
    def test_journalMadeAfreshGivesNewIds(self) -> Inline:
        """
        A journal made afresh where another was (its files removed) gives
        its letters ids past every id the earlier one gave: a client that
        stayed connected, and drops a letter whose id it already had as a
        repeat, does not drop them (found by the soak: ids began at 1 again).
        """
        path = new_path(self)
        acks: list[tuple[int, JournalError | None]] = []
        journal, _ = open_journal(self, path)
        earlier = [self.store(journal, "box", acks).id for _ in range(3)]
        yield journal.close()
        for file in path.parent.glob(path.name + "*"):
            file.unlink()
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.queued, [])
        self.assertGreater(self.store(journal, "box", acks).id, max(earlier))

    @inlineCallbacks
    def test_recoveryReturnsQueuedMinusRemoved(self) -> Inline:
        """
        Reopening returns the stored records that were not removed, in id
        order and field for field, and ids go on after the highest ever
        assigned even when that one was removed.
        """
        path = new_path(self)
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.queued, [])
        acks: list[tuple[int, JournalError | None]] = []
        records = [self.store(journal, f"box{i}", acks) for i in range(5)]
        # A new journal's ids start past its creation time (in millionths of a second).
        first = records[0].id
        self.assertGreater(first, int(time.time() - 60) * 1_000_000)
        self.assertEqual([r.id for r in records], [first + i for i in range(5)])
        yield journal.flush()
        self.assertEqual(acks, [(r.id, None) for r in records])
        for record in (records[1], records[3], records[4]):
            journal.remove_queued(record.id)
        yield journal.close()

        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.queued, [records[0], records[2]])
        self.assertEqual(recovered.queued[0].content, (b"hi", b""))
        self.assertEqual(recovered.queued[0].deadline, 2000.5)
        self.assertEqual(self.store(journal, "next", acks).id, first + 5)

    def test_kindChecked(self) -> None:
        """
        store_queued accepts only the kinds "mailbox" and "service".
        """
        journal, _ = open_journal(self)
        with self.assertRaises(ValueError):
            journal.store_queued("inbox", "a", "b", "c", "d", None, [], lambda e: None)

    @inlineCallbacks
    def test_failedBatch(self) -> Inline:
        """
        A batch that fails with what the writer takes for the storage's
        failure (as a full disk is; here any failure is taken so) is rolled
        back whole: every on_durable in it gets the JournalError, on_error
        hears of it once, counters.errors counts it, its stream records are
        gone from reads and their seqs are not handed out again, not even
        after a restart; the next batch is written as usual.
        (tests/unit/test_journal_isolation.py has a failure of one record.)
        """
        self.patch(writer_module, "storage_failure", lambda exc: True)
        path = new_path(self)
        journal, _ = open_journal(self, path, SLOW_COMMIT)
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            # A real SQLite failure on demand: a record with this subject aborts.
            conn.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON queued_messages "
                "WHEN new.subject = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END"
            )
        errors: list[JournalError] = []
        journal.on_error = errors.append
        acks: list[JournalError | None] = []
        append(journal, "s", 2)
        journal.store_queued("mailbox", "m", "a", "fine", "t", None, [b"1"], acks.append)
        journal.store_queued("mailbox", "m", "a", "poison", "t", None, [b"2"], acks.append)
        yield journal.flush()
        self.assertEqual(len(acks), 2)
        self.assertIsInstance(acks[0], JournalError)
        self.assertIs(acks[0], acks[1])
        self.assertEqual(errors, [acks[0]])
        self.assertIn("poisoned", str(errors[0]))
        self.assertEqual(journal.counters.errors, 1)
        self.assertEqual(journal.counters.records_written, 0)
        self.assertEqual((yield journal.read_stream("s", 1, 10)), [])

        self.assertEqual(append(journal, "s", 1), [3])
        kept = journal.store_queued("mailbox", "m", "a", "fine", "t", None, [b"3"], acks.append)
        yield journal.flush()
        self.assertEqual(acks[2:], [None])
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 10))), [3])
        yield journal.close()

        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {"s": (3, 3)})
        self.assertEqual([r.id for r in recovered.queued], [kept.id])


class LifecycleTests(TestCase):
    @inlineCallbacks
    def test_closeWritesEverything(self) -> Inline:
        """
        close() writes every queued record before it fires, however long
        the commit interval.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path, JournalConfig(commit_interval_s=30.0))
        append(journal, "s", 10)
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [], lambda e: None)
        yield journal.close()
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {"s": (1, 10)})
        self.assertEqual(len(recovered.queued), 1)

    @inlineCallbacks
    def test_closedJournalRefuses(self) -> Inline:
        """
        A journal not open (yet or any more) raises JournalError on writes
        and reads; closing twice is harmless.
        """
        journal = Journal(new_path(self), reactor)
        with self.assertRaises(JournalError):
            journal.append_stream("s", "a", "b", [], 1.0)
        journal.open()
        yield journal.close()
        yield journal.close()
        with self.assertRaises(JournalError):
            journal.remove_queued(1)
        with self.assertRaises(JournalError):
            journal.store_queued("mailbox", "m", "a", "s", "t", None, [], lambda e: None)
        with self.assertRaises(JournalError):
            journal.read_stream("s", 1, 10)

    def test_openTwiceRefused(self) -> None:
        """
        open() on a journal already open raises JournalError.
        """
        journal, _ = open_journal(self)
        with self.assertRaises(JournalError):
            journal.open()

    def test_configChecked(self) -> None:
        """
        JournalConfig refuses unknown synchronous levels and nonsensical
        batch and interval settings.
        """
        for bad in (
            {"stream_synchronous": "SOMETIMES"},
            {"queue_synchronous": "normal"},
            {"commit_max_batch": 0},
            {"commit_interval_s": -1.0},
            {"prune_interval_s": 0.0},
            {"prune_chunk_rows": 0},
        ):
            with self.assertRaises(ValueError, msg=repr(bad)):
                JournalConfig(**bad)
