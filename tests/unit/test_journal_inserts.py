"""
Tests for L{malamute_pack.journal.inserts}: a batch's rows inserted in a
few multi-row statements within SQLite's limit on parameters, and the
insert process that writes batches of many stream records outside the
broker's process: what it writes, what it refuses, how it ends; and,
through L{malamute_pack.journal.writer}, which batches the writer hands it
and how the writer goes on when it is lost.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

from twisted.internet.defer import inlineCallbacks
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.checksums import with_checksums
from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.inserts import (
    INSERT_STREAM,
    ROWS_PER_INSERT,
    InsertProcess,
    InsertProcessLost,
    InsertRefused,
    batch_committed,
    insert_all,
    rows_per_insert,
)
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.schema import migrate
from malamute_pack.protocol.records import StreamRow
from tests.journal_support import WriterCase
from tests.support import capture_log
from tests.unit.test_journal_journal import Inline, new_path

# Seconds a process that must end is given to, at most (a bound, not a timing).
_ENDS_WITHIN_S = 30.0
REPO = Path(__file__).resolve().parents[2]
# Batches the flooding child commits before it is killed.
_BATCHES_BEFORE_KILL = 20


def rows(stream: str, first: int, last: int) -> list[StreamRow]:
    """Records C{first} to C{last} of C{stream}."""
    return [
        stream_row(stream, seq, 1.0, "w", "subject", [b"x" * seq]) for seq in range(first, last + 1)
    ]


def size(batch: list[StreamRow]) -> int:
    """The content bytes of C{batch}, as the totals count them."""
    return sum(row[6] for row in batch)


def journal_file(case: SynchronousTestCase) -> Path:
    """A new journal file with its tables."""
    path = new_path(case)
    path.parent.mkdir()
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        migrate(conn)
    return path


def stored(path: Path) -> list[tuple[str, int, bytes]]:
    """Every stream record in the file at C{path}: (stream, seq, content)."""
    with closing(sqlite3.connect(path)) as conn:
        found = conn.execute(
            "SELECT stream, seq, content FROM stream_messages ORDER BY stream, seq"
        )
        return [(stream, seq, content) for stream, seq, content in found]


def totals(path: Path) -> list[tuple[str, int, int, int]]:
    """The ``streams`` table of the file at C{path}."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(
            "SELECT stream, last_seq, message_count, total_bytes FROM streams ORDER BY stream"
        ).fetchall()


def ended(pid: int) -> bool:
    """Whether our child C{pid} ends within L{_ENDS_WITHIN_S} (reaped if it does)."""
    deadline = time.monotonic() + _ENDS_WITHIN_S
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True  # reaped already
        if done:
            return True
        time.sleep(0.01)
    return False


def insert_processes(path: Path) -> list[int]:
    """The processes running an insert process for the journal at C{path}."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(b"inserts.py") for arg in command) and os.fsencode(path) in command:
            found.append(int(pid))
    return found


def flood_until_killed(path: Path) -> tuple[list[int], list[int]]:
    """
    Run the flooding child (``tests/journal_stream_child.py``) on C{path}
    until it has reported L{_BATCHES_BEFORE_KILL} batches, then SIGKILL it;
    the durable sequence numbers it printed, and its insert processes
    just before the kill.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.journal_stream_child", str(path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
    )
    assert child.stdout is not None
    lines = [child.stdout.readline() for _ in range(_BATCHES_BEFORE_KILL)]
    running = insert_processes(path)
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stdout.close()
    return [int(line) for line in lines if line.strip()], running


class InsertAllTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = journal_file(self)
        self.conn = sqlite3.connect(self.path, isolation_level=None)
        self.addCleanup(self.conn.close)
        self.statements: list[str] = []
        self.conn.set_trace_callback(self.statements.append)

    def inserts(self) -> list[int]:
        """The rows of each INSERT traced, in order."""
        return [s.count("(") - 1 for s in self.statements if s.startswith("INSERT")]

    def test_wholeChunksThenHalving(self) -> None:
        """
        Rows go in whole chunks of the most rows a statement takes, then
        the rest in chunks of halving sizes, in order.
        """
        batch = with_checksums(rows("s", 1, 21))
        insert_all(self.conn, INSERT_STREAM, batch, 8)
        self.assertEqual(self.inserts(), [8, 8, 4, 1])
        self.assertEqual([seq for _, seq, _ in stored(self.path)], list(range(1, 22)))

    def test_fullBatchOneStatement(self) -> None:
        """A batch of exactly the most rows a statement takes is one INSERT."""
        insert_all(self.conn, INSERT_STREAM, with_checksums(rows("s", 1, 1000)), 1000)
        self.assertEqual(self.inserts(), [1000])
        self.assertEqual(len(stored(self.path)), 1000)

    def test_rowsPerInsertWithinLimit(self) -> None:
        """
        A statement carries a whole batch, within SQLite's limit on its
        parameters, and at least the chunk an append's records need.
        """
        self.assertEqual(rows_per_insert(self.conn, INSERT_STREAM, 1000), 1000)
        self.assertEqual(rows_per_insert(self.conn, INSERT_STREAM, 1), ROWS_PER_INSERT)
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 100)
        self.assertEqual(rows_per_insert(self.conn, INSERT_STREAM, 1000), 10)

    def test_batchCommitted(self) -> None:
        """A batch is in the file when its last record is."""
        batch = rows("s", 1, 3)
        self.assertFalse(batch_committed(self.conn, batch))
        insert_all(self.conn, INSERT_STREAM, with_checksums(batch))
        self.assertTrue(batch_committed(self.conn, batch))


class InsertProcessTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = journal_file(self)
        self.process = InsertProcess(self.path, 100)
        self.addCleanup(self.process.stop)

    def test_writesInItsOwnProcess(self) -> None:
        """
        A batch is written, records and totals, by a process of its own,
        started at the first batch; closing its input ends it cleanly.
        """
        self.assertIsNone(self.process.pid)
        self.process.insert(rows("s", 1, 250), [("s", 250, 250, 31375)], "NORMAL")
        pid = self.process.pid
        self.assertIsNotNone(pid)
        self.assertNotEqual(pid, os.getpid())
        self.assertEqual(stored(self.path), [(r[0], r[1], r[5]) for r in rows("s", 1, 250)])
        self.assertEqual(totals(self.path), [("s", 250, 250, 31375)])
        self.process.insert(rows("s", 251, 252), [("s", 252, 2, 503)], "FULL")
        self.assertEqual(self.process.pid, pid)
        self.assertEqual(len(stored(self.path)), 252)
        self.assertEqual(self.process.stop(), 0)
        self.assertIsNone(self.process.pid)
        self.assertIsNone(self.process.stop())

    def test_refusedBatchLeavesNothing(self) -> None:
        """
        A batch that fails there (a record already written) is refused,
        nothing of it written, and the process goes on with the next one.
        """
        self.process.insert(rows("s", 5, 5), [], "NORMAL")
        pid = self.process.pid
        with self.assertRaises(InsertRefused) as refused:
            self.process.insert(rows("s", 1, 10), [("s", 10, 10, 55)], "NORMAL")
        self.assertIn("IntegrityError", str(refused.exception))
        self.assertEqual([seq for _, seq, _ in stored(self.path)], [5])
        self.assertEqual(totals(self.path), [])
        self.process.insert(rows("s", 6, 7), [], "NORMAL")
        self.assertEqual(self.process.pid, pid)
        self.assertEqual([seq for _, seq, _ in stored(self.path)], [5, 6, 7])

    def test_notMarshallableRefused(self) -> None:
        """A batch that cannot cross the pipe is refused before it is sent."""
        with self.assertRaises(InsertRefused):
            self.process.insert([("s", 1, object())], [], "NORMAL")
        self.assertIsNone(self.process.pid)

    def test_badLevelRefused(self) -> None:
        """A synchronous level that is not a word is refused there, not run as SQL."""
        with self.assertRaises(InsertRefused):
            self.process.insert(rows("s", 1, 1), [], "NORMAL; DROP TABLE streams")
        self.assertEqual(stored(self.path), [])

    def test_lostProcess(self) -> None:
        """
        A process that died is reported lost (the batch never reached it:
        not in doubt), and the next batch starts another one.
        """
        self.process.insert(rows("s", 1, 1), [], "NORMAL")
        pid = self.process.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        self.assertTrue(ended(pid))
        with self.assertRaises(InsertProcessLost) as lost:
            self.process.insert(rows("s", 2, 2), [], "NORMAL")
        self.assertFalse(lost.exception.in_doubt)
        self.assertIsNone(self.process.pid)
        self.process.insert(rows("s", 2, 3), [], "NORMAL")
        self.assertNotIn(self.process.pid, (None, pid))
        self.assertEqual([seq for _, seq, _ in stored(self.path)], [1, 2, 3])

    def test_endsWithItsThread(self) -> None:
        """
        The process ends when the thread that started it ends, without its
        input closed: a broker killed leaves no process writing its journal.
        """
        thread = threading.Thread(target=self.process.insert, args=(rows("s", 1, 1), [], "NORMAL"))
        thread.start()
        thread.join()
        pid = self.process.pid
        assert pid is not None
        self.assertTrue(ended(pid))
        self.assertEqual(len(stored(self.path)), 1)


class KilledTests(SynchronousTestCase):
    def test_floodSurvivesKill(self) -> None:
        """
        A journal whose batches its insert process writes, killed with
        SIGKILL mid-flood, leaves no insert process behind, and has every
        record it had reported durable, with no hole, when it is reopened.
        """
        path = journal_file(self).resolve()
        durable, running = flood_until_killed(path)
        self.assertEqual(len(durable), _BATCHES_BEFORE_KILL)
        self.assertEqual(len(running), 1)
        deadline = time.monotonic() + _ENDS_WITHIN_S
        while insert_processes(path) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(insert_processes(path), [])
        with closing(sqlite3.connect(path)) as conn:
            seqs = [seq for (seq,) in conn.execute("SELECT seq FROM stream_messages ORDER BY seq")]
        self.assertGreaterEqual(len(seqs), max(durable))
        self.assertEqual(seqs, list(range(1, len(seqs) + 1)))


class WriterTests(WriterCase):
    """The writer thread, handing batches of many stream records to its insert process."""

    config = JournalConfig(commit_interval_s=0.4, insert_process_rows=10)

    def inserted_here(self) -> bool:
        """Whether the last batch inserted stream records on the writer's own connection."""
        return any(s.startswith("INSERT INTO stream_messages") for s in self.statements)

    def process_pid(self) -> int | None:
        inserts = self.writer._inserts
        return None if inserts is None else inserts.pid

    @inlineCallbacks
    def test_manyRecordsThere(self) -> Inline:
        """
        A batch of many stream records alone is written by the insert
        process, totals included, and reported like any other; a smaller
        one, or one with anything else in it, is written by the thread.
        """
        yield self.write(*rows("s", 1, 20))
        self.assertFalse(self.inserted_here(), self.statements)
        self.assertIsNotNone(self.process_pid())
        [outcome] = self.batches
        self.assertEqual(
            (outcome.records, outcome.error, outcome.stream_last), (20, None, {"s": 20})
        )
        self.assertEqual(totals(self.path), [("s", 20, 20, size(rows("s", 1, 20)))])
        yield self.write(*rows("s", 21, 25))
        self.assertTrue(self.inserted_here())
        yield self.write(*rows("s", 26, 40), *rows("t", 1, 10))
        self.assertFalse(self.inserted_here(), self.statements)
        self.assertEqual(len(stored(self.path)), 50)
        self.assertEqual(
            totals(self.path),
            [("s", 40, 40, size(rows("s", 1, 40))), ("t", 10, 10, size(rows("t", 1, 10)))],
        )

    @inlineCallbacks
    def test_refusedThereWrittenHere(self) -> Inline:
        """
        A batch the process cannot write (one record already in the file)
        is written by the thread, which leaves out that record alone.
        """
        yield self.write(*rows("s", 5, 5))
        yield self.write(*rows("s", 1, 20))
        self.assertTrue(self.inserted_here())
        outcome = self.batches[-1]
        self.assertEqual([(d.stream, d.seq) for d in outcome.dropped], [("s", 5)])
        self.assertEqual([seq for _, seq, _ in stored(self.path)], list(range(1, 21)))
        self.assertIsNotNone(self.process_pid())

    @inlineCallbacks
    def test_lostProcessWrittenHere(self) -> Inline:
        """
        When the process is lost, the batch is written by the thread, and
        so are the later ones; that is logged once.
        """
        log = capture_log(self)
        yield self.write(*rows("s", 1, 20))
        pid = self.process_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        yield self.write(*rows("s", 21, 40))
        self.assertTrue(self.inserted_here())
        yield self.write(*rows("s", 41, 60))
        self.assertTrue(self.inserted_here())
        self.assertIsNone(self.writer._inserts)
        self.assertEqual([b.error for b in self.batches], [None] * 3)
        self.assertEqual([seq for _, seq, _ in stored(self.path)], list(range(1, 61)))
        self.assertEqual(totals(self.path), [("s", 60, 60, size(rows("s", 1, 60)))])
        lost = [formatEvent(e) for e in log if "writes every batch" in formatEvent(e)]
        self.assertEqual(len(lost), 1, lost)

    @inlineCallbacks
    def test_stopEndsProcess(self) -> Inline:
        """The writer's stop ends its insert process."""
        yield self.write(*rows("s", 1, 20))
        pid = self.process_pid()
        assert pid is not None
        yield self.stop()
        self.assertIsNone(self.process_pid())
        self.assertTrue(ended(pid))
