"""
Tests for L{malamute_pack.journal.pruning}: prunes run in turn on the
writer, the timer prunes with the reactor's time and stops when the journal
closes, and a prune of a closed journal is refused.
"""

from __future__ import annotations

from typing import cast

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalConfig, JournalError, RetentionPolicy
from tests.clock_support import ThreadedClock
from tests.unit.test_journal_journal import Inline, append, open_journal


class PruningTests(TestCase):
    @inlineCallbacks
    def test_overlappingPrunesRunInTurn(self) -> Inline:
        """
        A prune asked for while another is under way runs after it, with its
        own time; closing fires the Deferred of a prune cut short.
        """
        policy = RetentionPolicy(max_age_s=5.0)
        journal, _ = open_journal(self, config=JournalConfig(retention=policy, prune_chunk_rows=1))
        for i in range(10):
            journal.append_stream("s", "a", "b", [], 1000.0 + i)
        yield journal.flush()
        first, second = journal.prune(now=1007.0), journal.prune(now=1010.0)
        self.assertEqual([(yield first), (yield second)], [2, 3])
        self.assertEqual(journal.first_seq("s"), 6)
        cut_short = journal.prune(now=2000.0)
        yield journal.close()
        self.assertLess((yield cut_short), 5)

    @inlineCallbacks
    def test_timerPrunesWithReactorTime(self) -> Inline:
        """
        Every prune_interval_s the journal prunes with the reactor's time as
        now; closing stops the timer.
        """
        # The journal's timers and time are the clock's; its threads report to the reactor.
        clock = ThreadedClock(cast(IReactorFromThreads, reactor))
        config = JournalConfig(retention=RetentionPolicy(max_age_s=10.0), prune_interval_s=5.0)
        journal, _ = open_journal(self, config=config, clock=cast(IReactorTime, clock))
        for i in range(5):
            journal.append_stream("s", "a", "b", [], float(i))
        yield journal.flush()
        for _ in range(2):
            clock.advance(5.0)  # now 5, then 10: cutoff -5, then 0: nothing to prune
            yield journal.flush()
        self.assertEqual(journal.first_seq("s"), 1)
        clock.advance(5.0)  # now 15, cutoff 5: all five go
        yield journal.flush()
        self.assertEqual(journal.first_seq("s"), 6)
        self.assertEqual(journal.counters.pruned, 5)
        yield journal.close()
        self.assertEqual(clock.getDelayedCalls(), [])

    @inlineCallbacks
    def test_closedRefuses(self) -> Inline:
        """A prune asked of a closed journal fails at once with a JournalError."""
        journal, _ = open_journal(self)
        append(journal, "s", 1)
        yield journal.close()
        self.assertRaises(JournalError, journal.prune)

    @inlineCallbacks
    def test_tickWhilePruningSkipped(self) -> Inline:
        """
        A timer tick while the last prune still runs asks for none: one
        prune at a time comes from the timer.
        """
        clock = ThreadedClock(cast(IReactorFromThreads, reactor))
        config = JournalConfig(retention=RetentionPolicy(max_age_s=1.0), prune_interval_s=1.0)
        journal, _ = open_journal(self, config=config, clock=cast(IReactorTime, clock))
        append(journal, "s", 3, timestamp=0.0)
        yield journal.flush()
        clock.advance(5.0)
        clock.advance(1.0)  # the first prune has not reported back: no second one
        yield journal.flush()
        self.assertEqual((journal.counters.pruned, journal.first_seq("s")), (3, 4))
