"""
Tests for L{malamute_pack.journal.retention} through the journal: pruning by
count, age and bytes, per-stream policies, pruning in bounded steps, the
prune timer on an injected clock, and sequence numbers after a stream has
been pruned empty.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalConfig, RetentionPolicy
from tests.unit.test_journal_journal import Inline, append, new_path, open_journal, seqs

UNLIMITED = RetentionPolicy()


class RetentionTests(TestCase):
    @inlineCallbacks
    def test_byCount(self) -> Inline:
        """
        A stream keeps its newest max_count records; first_seq advances and a
        read from below it starts at it.
        """
        journal, _ = open_journal(self, config=JournalConfig(retention=RetentionPolicy(3)))
        append(journal, "s", 10)
        yield journal.flush()
        self.assertEqual((yield journal.prune()), 7)
        self.assertEqual((journal.first_seq("s"), journal.last_seq("s")), (8, 10))
        self.assertEqual(seqs((yield journal.read_stream("s", 1, 100))), [8, 9, 10])
        self.assertEqual(journal.counters.pruned, 7)
        self.assertEqual((yield journal.prune()), 0)

    @inlineCallbacks
    def test_byAge(self) -> Inline:
        """
        Records older than max_age_s at the prune's time go; the rest stay.
        """
        policy = RetentionPolicy(max_age_s=5.0)
        journal, _ = open_journal(self, config=JournalConfig(retention=policy))
        for i in range(10):
            journal.append_stream("s", "a", "b", [b"x"], 1000.0 + i)
        yield journal.flush()
        self.assertEqual((yield journal.prune(now=1010.0)), 5)
        self.assertEqual(journal.first_seq("s"), 6)
        records = yield journal.read_stream("s", 1, 100)
        self.assertEqual([r.timestamp for r in records], [1005.0, 1006.0, 1007.0, 1008.0, 1009.0])

    @inlineCallbacks
    def test_byBytes(self) -> Inline:
        """
        The oldest records go until the stream's stored content is at most
        max_bytes (each record here stores 100 bytes: 4 + 96).
        """
        config = JournalConfig(retention=RetentionPolicy(max_bytes=350))
        journal, _ = open_journal(self, config=config)
        for _ in range(10):
            journal.append_stream("s", "a", "b", [b"x" * 96], 1.0)
        yield journal.flush()
        self.assertEqual((yield journal.prune()), 7)
        self.assertEqual(journal.first_seq("s"), 8)

    @inlineCallbacks
    def test_perStreamPolicy(self) -> Inline:
        """
        A stream with a policy of its own is pruned by it; others by the default.
        """
        config = JournalConfig(
            retention=UNLIMITED, per_stream_retention={"short": RetentionPolicy(max_count=1)}
        )
        journal, _ = open_journal(self, config=config)
        append(journal, "short", 5)
        append(journal, "long", 5)
        yield journal.flush()
        yield journal.prune()
        self.assertEqual(journal.first_seq("short"), 5)
        self.assertEqual(journal.first_seq("long"), 1)

    @inlineCallbacks
    def test_inBoundedSteps(self) -> Inline:
        """
        With prune_chunk_rows smaller than the work, a prune runs in several
        steps across streams and still ends with every stream within its
        policy; writes queued meanwhile are written.
        """
        config = JournalConfig(retention=RetentionPolicy(max_count=3), prune_chunk_rows=4)
        journal, _ = open_journal(self, config=config)
        append(journal, "a", 25)
        append(journal, "b", 10)
        yield journal.flush()
        pruning = journal.prune()
        append(journal, "c", 2)
        self.assertEqual((yield pruning), 22 + 7)
        self.assertEqual((journal.first_seq("a"), journal.first_seq("b")), (23, 8))
        yield journal.flush()
        self.assertEqual(seqs((yield journal.read_stream("c", 1, 10))), [1, 2])

    @inlineCallbacks
    def test_prunedEmptyKeepsNumbering(self) -> Inline:
        """
        A stream pruned of every record has first_seq last_seq + 1, and
        after a restart its numbers go on instead of starting again at 1.
        """
        path = new_path(self)
        config = JournalConfig(retention=RetentionPolicy(max_age_s=1.0))
        journal, _ = open_journal(self, path, config)
        append(journal, "s", 5, timestamp=100.0)
        yield journal.flush()
        self.assertEqual((yield journal.prune(now=200.0)), 5)
        self.assertEqual((journal.first_seq("s"), journal.last_seq("s")), (6, 5))
        self.assertEqual((yield journal.read_stream("s", 1, 10)), [])
        yield journal.close()

        journal, recovered = open_journal(self, path, config)
        self.assertEqual(recovered.streams, {"s": (6, 5)})
        self.assertEqual(append(journal, "s", 1), [6])
        self.assertEqual(journal.first_seq("s"), 6)
