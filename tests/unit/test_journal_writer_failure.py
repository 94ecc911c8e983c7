"""
Tests for a journal whose writer thread meets an unexpected error outside
the statements it guards (a bug; issue 37), in
L{malamute_pack.journal.writer} and L{malamute_pack.journal.journal}: the
error is logged and reported once; whatever the thread had in hand and
everything handed to it later is answered (a batch fails as on a full
disk, a barrier is let through, statements fail, a prune finishes, a stop
closes); the writer stays broken until the journal opens again, which
takes the run for a crash; a writer whose thread has ended answers what
is submitted to it instead of queueing it for nobody; and the statistics
say the writer failed and why.

The errors are injected where the bug class lives: one of the writer's
own steps replaced on the instance (``self.patch``), or the reactor's
C{callFromThread} refusing one report; everything else is real (threads,
SQLite files, the reactor).
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any, NoReturn, cast

from twisted.internet import reactor
from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal import Journal, JournalError
from malamute_pack.journal.errors import WriterFailed
from malamute_pack.journal.writer import JournalWriter
from malamute_pack.protocol.records import ConsumerPosition
from tests.clock_support import ThreadedClock
from tests.ops_support import busy_broker
from tests.unit.test_journal_journal import Inline, new_path, open_journal

# Long enough that a test's joins never wait on a healthy thread for nothing:
# each is made once the thread has said it is ending.
_JOIN_S = 30.0


def _bug(*args: object) -> NoReturn:
    """A step of the writer with a bug in it."""
    raise RuntimeError("a bug in the writer")


def _killed(*args: object) -> NoReturn:
    """A step of the writer that ends its thread (what no writer code catches)."""
    raise SystemExit("the writer thread is killed")


def _writer(journal: Journal) -> JournalWriter:
    writer = journal._hand.writer
    assert writer is not None
    return writer


class _LosingClock(ThreadedClock):
    """The reactor's C{callFromThread} refusing the next call once C{lose_next} is set."""

    lose_next = False

    def callFromThread(self, f: Any, *args: object, **kwargs: object) -> None:
        if self.lose_next:
            self.lose_next = False
            raise RuntimeError("the reactor lost a call")
        super().callFromThread(f, *args, **kwargs)


class WriterFailureTests(TestCase):
    def broken(self, path: Path | None = None) -> Any:
        """
        Open a journal (at C{path}) whose writer breaks on a bug in its
        pruning step, then ask for a prune; fires with the journal, the
        errors C{on_error} heard, and the prune's failure.
        """
        journal, _ = open_journal(self, path)
        errors: list[JournalError] = []
        journal.on_error = errors.append
        self.patch(_writer(journal), "_prune_step", _bug)
        pruned = journal.prune()

        def failed(failure: Any) -> tuple[Journal, list[JournalError], JournalError]:
            self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
            return journal, errors, failure.value

        return pruned.addCallbacks(lambda _: self.fail("the prune succeeded"), failed)

    @inlineCallbacks
    def test_failureReportedOnce(self) -> Inline:
        """
        A bug outside the guarded statements is logged once (critical, with
        its traceback), reported once to on_error and counted as a journal
        error, and the journal says the writer failed and why; the prune
        the thread had in hand fails with a JournalError naming the bug.
        """
        journal, errors, prune_error = yield self.broken()
        self.assertIsInstance(prune_error, JournalError)
        cause = prune_error.__cause__
        assert isinstance(cause, WriterFailed)
        self.assertIsInstance(cause.error, RuntimeError)
        self.assertIn("a bug in the writer", str(prune_error))
        (failure,) = errors
        self.assertIs(journal.writer_failure, failure)
        self.assertIn("RuntimeError: a bug in the writer", str(failure))
        self.assertEqual(failure.reason, "the journal's writer failed (RuntimeError)")
        self.assertEqual(journal.counters.errors, 1)

    @inlineCallbacks
    def test_laterWritesFail(self) -> Inline:
        """
        After the failure every write fails as on a full disk: each
        on_durable (a letter's, an append's, a consumer's) gets a
        JournalError whose reason says the writer failed and names the
        error, each batch is a journal error, its stream records leave the
        uncommitted tail, and the backlog drains.
        """
        journal, errors, _ = yield self.broken()
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [b"letter"], acks.append)
        journal.append_batch("s", "a", [("x", [b"1"])], 1.0, "key", [], acks.append)
        position = ConsumerPosition("s", "reader", "r", 1, b"", 1.0, "")
        journal.save_consumer(position, acks.append)
        journal.append_stream("t", "a", "b", [b"record"], 1.0)
        yield journal.flush()
        self.assertEqual(len(acks), 3)
        for ack in acks:
            assert isinstance(ack, JournalError)
            self.assertEqual(ack.reason, "the journal's writer failed (RuntimeError)")
            self.assertIn("a bug in the writer", str(ack))
            self.assertIsInstance(ack.__cause__, WriterFailed)
        self.assertGreater(len(errors), 1)
        self.assertEqual(journal.counters.records_written, 0)
        self.assertEqual((journal.pending_writes, journal.backlog_bytes), (0, 0))
        self.assertEqual((yield journal.read_stream("t", 1, 10)), [])

    @inlineCallbacks
    def test_controlsAnswered(self) -> Inline:
        """
        A broken writer still answers every control operation: a barrier
        fires, a last-values mark lets its read go on, statements fail with
        the JournalError (nothing of them written), a prune finishes with
        the error.
        """
        path = new_path(self)
        journal, _, _ = yield self.broken(path)
        yield journal.flush()
        self.assertEqual((yield journal.read_last_values("s")), [])
        statement = ("INSERT INTO journal_counters (name, value) VALUES ('probe', 1)", ())
        ran: Deferred[Any] = journal.execute([statement])
        failure = yield self.assertFailure(ran, JournalError)
        self.assertIsInstance(failure.__cause__, WriterFailed)
        pruned = yield self.assertFailure(journal.prune(), JournalError)
        self.assertIsInstance(pruned.__cause__, WriterFailed)
        yield journal.close()
        with closing(sqlite3.connect(path)) as conn:
            found = conn.execute("SELECT * FROM journal_counters WHERE name = 'probe'").fetchall()
        self.assertEqual(found, [])

    @inlineCallbacks
    def test_stopAnsweredThenReopens(self) -> Inline:
        """
        Closing a journal whose writer broke is answered and ends the
        thread; nothing was marked clean, so the next open takes the run
        for a crash, and its new writer writes again.
        """
        path = new_path(self)
        journal, _, _ = yield self.broken(path)
        writer = _writer(journal)
        yield journal.close()
        writer.join(_JOIN_S)
        self.assertFalse(writer.alive)
        journal, _ = open_journal(self, path)
        self.assertTrue(journal.crashed)
        self.assertIsNone(journal.writer_failure)
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [b"letter"], acks.append)
        yield journal.flush()
        self.assertEqual(acks, [None])

    @inlineCallbacks
    def test_statementsInHandAnswered(self) -> Inline:
        """
        Statements whose run meets a bug are answered with the JournalError,
        and the writer is broken from then on.
        """
        journal, _ = open_journal(self)
        self.patch(_writer(journal), "_execute", _bug)
        failure = yield self.assertFailure(journal.execute([]), JournalError)
        self.assertIsInstance(failure.__cause__, WriterFailed)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        broke = journal.writer_failure
        assert broke is not None
        self.assertIs(failure.__cause__, broke.__cause__)
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [], acks.append)
        yield journal.flush()
        self.assertIsInstance(acks[0], JournalError)

    @inlineCallbacks
    def test_stopInHandAnswered(self) -> Inline:
        """
        A bug met while stopping (its insert process's stop) still closes
        the connection and answers the stop: the close fires and the
        thread ends.
        """
        journal, _ = open_journal(self)
        writer = _writer(journal)
        inserts = writer._inserts
        assert inserts is not None
        self.patch(inserts, "stop", _bug)
        yield journal.close()
        writer.join(_JOIN_S)
        self.assertFalse(writer.alive)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    @inlineCallbacks
    def test_lostReportFailsItsBatch(self) -> Inline:
        """
        A batch whose report the reactor lost (its C{callFromThread}
        failing) is answered again, failed, though it may have committed
        (no durability the writer cannot vouch for is claimed), and what
        came with it is answered too.
        """
        clock = _LosingClock(cast(IReactorFromThreads, reactor))
        journal, _ = open_journal(self, clock=cast(IReactorTime, clock))
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [b"letter"], acks.append)
        clock.lose_next = True
        yield journal.flush()
        self.assertEqual(len(acks), 1)
        assert isinstance(acks[0], JournalError)
        self.assertIn("the reactor lost a call", str(acks[0]))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual((journal.pending_writes, journal.backlog_bytes), (0, 0))

    @inlineCallbacks
    def test_deadThreadAnswersSubmissions(self) -> Inline:
        """
        A writer thread that ended all the same (a BaseException) answers
        what it had on its way out; what is submitted to it afterwards is
        failed with a JournalError, in the reactor thread, instead of
        queued for nobody, and closing the journal still finishes.
        """
        journal, _ = open_journal(self)
        writer = _writer(journal)
        self.patch(writer, "_prune_step", _killed)
        yield self.assertFailure(journal.prune(), JournalError)
        writer.join(_JOIN_S)
        self.assertFalse(writer.alive)
        self.assertEqual(len(self.flushLoggedErrors(SystemExit)), 1)
        acks: list[JournalError | None] = []
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [b"letter"], acks.append)
        yield journal.flush()
        self.assertEqual(len(acks), 1)
        assert isinstance(acks[0], JournalError)
        self.assertIn("SystemExit", acks[0].reason)
        self.assertEqual((journal.pending_writes, journal.backlog_bytes), (0, 0))
        yield journal.close()


class OperatorsTests(SynchronousTestCase):
    def test_statisticsSayWhy(self) -> None:
        """
        The journal's section of the broker's statistics says the writer
        failed and why (None while it works), and counts the failure among
        the journal's errors, as a full disk's failed batches are.
        """
        directory = Path(self.mktemp())
        directory.mkdir()
        harness, statistics = busy_broker(self, directory / "journal.sqlite")
        harness.settle()
        journal = harness.journal
        assert journal is not None
        self.assertIsNone(statistics.journal()["writer_failure"])
        errors = statistics.journal()["errors"]
        self.patch(_writer(journal), "_prune_step", _bug)
        failures: list[Failure] = []
        journal.prune().addErrback(failures.append)
        harness.clock.run_thread_calls(lambda: bool(failures))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        section = statistics.journal()
        self.assertIn("RuntimeError: a bug in the writer", section["writer_failure"])
        self.assertEqual(section["errors"], errors + 1)
