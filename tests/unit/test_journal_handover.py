"""
Tests for L{malamute_pack.journal.handover}: a reactor turn's operations
handed to the writer at once, a letter stored and removed in one turn kept
off the disk, and each batch's report finished (callbacks, counters, the
tail); through the journal, on a real writer thread and SQLite file.
"""

from __future__ import annotations

from typing import cast

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalError
from tests.clock_support import ThreadedClock
from tests.unit.test_journal_journal import Inline, append, open_journal


class HandOverTests(TestCase):
    @inlineCallbacks
    def test_burstIsBatched(self) -> Inline:
        """
        A burst of appends is written in far fewer transactions than records.
        """
        journal, _ = open_journal(self)
        append(journal, "s", 3000)
        self.assertEqual(journal.pending_writes, 3000)
        yield journal.flush()
        self.assertEqual(journal.counters.records_written, 3000)
        self.assertEqual(journal.pending_writes, 0)
        self.assertLessEqual(journal.counters.batches, 30)
        self.assertGreater(journal.counters.bytes_written, 3000 * 8)

    @inlineCallbacks
    def test_failingCallbackDoesNotStopOthers(self) -> Inline:
        """
        An on_durable callback that raises is logged; the batch's other
        callbacks still run.
        """
        journal, _ = open_journal(self)
        acks: list[JournalError | None] = []

        def broken(error: JournalError | None) -> None:
            raise RuntimeError("callback bug")

        journal.store_queued("mailbox", "m", "a", "s", "t", None, [], broken)
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [], acks.append)
        yield journal.flush()
        self.assertEqual(acks, [None])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    @inlineCallbacks
    def test_oneHandOverPerTurn(self) -> Inline:
        """
        What is queued in one reactor turn reaches the writer in one
        hand-over, at the end of the turn: the positions move on then.
        """
        clock = ThreadedClock(cast(IReactorFromThreads, reactor))
        journal, _ = open_journal(self, clock=cast(IReactorTime, clock))
        append(journal, "s", 3)
        journal.store_queued("mailbox", "m", "a", "s", "t", None, [b"x"], lambda e: None)
        self.assertEqual((journal.handed, journal.pending_writes), (0, 4))
        clock.advance(0)
        self.assertEqual(journal.handed, 4)
        yield journal.flush()
        self.assertEqual((journal.pending_writes, journal.counters.records_written), (0, 4))
        self.assertEqual(journal.durable_seq("s"), 3)

    @inlineCallbacks
    def test_storedAndRemovedInOneTurn(self) -> Inline:
        """
        A letter stored and removed in the same turn never goes to the
        writer; its on_durable hears success all the same.
        """
        clock = ThreadedClock(cast(IReactorFromThreads, reactor))
        journal, _ = open_journal(self, clock=cast(IReactorTime, clock))
        acks: list[JournalError | None] = []
        record = journal.store_queued("mailbox", "m", "a", "s", "t", None, [], acks.append)
        journal.remove_queued(record.id)
        self.assertEqual(journal.pending_writes, 0)
        clock.advance(0)
        self.assertEqual((acks, journal.handed), ([None], 0))
        yield journal.flush()
        self.assertEqual((yield journal.read_queued([record.id])), [])
