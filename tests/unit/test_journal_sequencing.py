"""
Tests for L{malamute_pack.journal.sequencing}: numbers handed out per
stream and per letter, the tail of records not yet committed and the reads
it answers, numbers followed from elsewhere, and numbering past a
ceiling (kept across a restart); through the journal
(L{Journal.read_stream}) and on a L{Sequencer} alone.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal.sequencing import Ceiling, Sequencer, merge_tail
from malamute_pack.protocol.records import StreamRecord
from tests.unit.test_journal_journal import (
    SLOW_COMMIT,
    Inline,
    append,
    new_path,
    open_journal,
    seqs,
)


class TailTests(TestCase):
    @inlineCallbacks
    def test_unknownStream(self) -> Inline:
        """
        A stream never written has first_seq 1 and last_seq 0, reads empty,
        and its seq_at_time is 1.
        """
        journal, _ = open_journal(self)
        self.assertEqual((journal.first_seq("x"), journal.last_seq("x")), (1, 0))
        self.assertEqual((yield journal.read_stream("x", 1, 10)), [])
        self.assertEqual((yield journal.seq_at_time("x", 0.0)), 1)

    @inlineCallbacks
    def test_readIncludesUncommitted(self) -> Inline:
        """
        read_stream returns records appended but not yet committed, with
        their content, in order and up to the limit.
        """
        journal, _ = open_journal(self, config=SLOW_COMMIT)
        append(journal, "s", 5)
        records = yield journal.read_stream("s", 2, 3)
        self.assertEqual(journal.counters.records_written, 0)
        self.assertEqual(seqs(records), [2, 3, 4])
        self.assertEqual(
            records[0], StreamRecord("s", 2, 1000.0, "sender", "subject.1", (b"body", b"1"))
        )

    @inlineCallbacks
    def test_readAcrossCommittedAndUncommitted(self) -> Inline:
        """
        A read that starts among committed records continues into the
        uncommitted ones without a gap or a repeat, and records read back
        from disk equal those appended.
        """
        journal, _ = open_journal(self, config=SLOW_COMMIT)
        append(journal, "s", 5)
        yield journal.flush()
        committed = yield journal.read_stream("s", 1, 5)
        append(journal, "s", 5)
        self.assertEqual(journal.counters.records_written, 5)
        records = yield journal.read_stream("s", 2, 6)
        self.assertEqual(seqs(records), [2, 3, 4, 5, 6, 7])
        records = yield journal.read_stream("s", 1, 100)
        self.assertEqual(seqs(records), list(range(1, 11)))
        self.assertEqual(records[:5], committed)
        self.assertEqual(records[7].content, (b"body", b"2"))


class NumberPastTests(TestCase):
    @inlineCallbacks
    def test_numberPastKept(self) -> Inline:
        """
        After number_past(C{n}, C{m}) every stream, known or new, numbers
        past C{n} and every letter past C{m}; so does the journal opened
        again after a clean close; numbering_ceiling says the highest stream
        number and letter id it may have given; the numbers each stream passed
        over are recorded as skipped.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        append(journal, "small", 2)
        append(journal, "big", 9)
        letters = journal.numbering_ceiling().letters  # past the journal's creation time
        self.assertEqual(journal.numbering_ceiling(), Ceiling(9, letters))
        yield journal.number_past(Ceiling(100, letters + 50))
        self.assertEqual(journal.numbering_ceiling(), Ceiling(100, letters + 50))
        # The numbers passed over are never given: a salvage counts none lost.
        with closing(sqlite3.connect(path)) as conn:
            skips = conn.execute("SELECT * FROM stream_skips ORDER BY stream").fetchall()
        self.assertEqual(skips, [("big", 10, 100), ("small", 3, 100)])
        self.assertEqual(append(journal, "small", 1), [101])
        self.assertEqual(append(journal, "new", 1), [101])
        yield journal.close()
        journal, _ = open_journal(self, path)
        self.assertEqual(append(journal, "big", 1), [101])
        self.assertEqual(append(journal, "other", 1), [101])
        letter = journal.store_queued("mailbox", "box", "s", "x", "", None, [b""], lambda _: None)
        self.assertEqual(letter.id, letters + 51)

    def test_sequencerCeiling(self) -> None:
        """
        A Sequencer's ceiling is its highest stream number and letter id
        given; number_past moves the streams past the one, letters past the
        other, never back.
        """
        sequence = Sequencer()
        sequence.recovered({"s": (1, 10)}, last_id=30)
        self.assertEqual(sequence.ceiling(), Ceiling(10, 30))
        sequence.number_past(Ceiling(50, 70))
        self.assertEqual((sequence.last_seq("s"), sequence.last_seq("t")), (50, 50))
        self.assertEqual(sequence.queued_id(), 71)
        sequence.number_past(Ceiling(5, 5))  # never back
        self.assertEqual(sequence.ceiling(), Ceiling(50, 71))


def record(seq: int) -> StreamRecord:
    return StreamRecord("s", seq, 1.0, "w", "x", (), "", 0)


class SequencerTests(SynchronousTestCase):
    def test_numbersPerStream(self) -> None:
        """
        Each stream numbers from 1 (or from what was recovered); letters
        have their own ids; the first retained number is the first given.
        """
        sequence = Sequencer()
        sequence.recovered({"old": (3, 9)}, last_id=4)
        self.assertEqual(sequence.stream_row("new", "w", "x", [b"a"], 1.0, "", 0)[1], 1)
        self.assertEqual(sequence.stream_row("old", "w", "x", [b"a"], 1.0, "", 0)[1], 10)
        rows = sequence.batch_rows("new", "w", [("a", [b"1"]), ("b", [b"2"])], 2.0)
        self.assertEqual([row[1] for row in rows], [2, 3])
        self.assertEqual((sequence.first_seq("new"), sequence.last_seq("new")), (1, 3))
        self.assertEqual((sequence.first_seq("old"), sequence.last_seq("old")), (3, 10))
        self.assertEqual([sequence.queued_id(), sequence.queued_id()], [5, 6])
        self.assertEqual(sequence.stream_names(), ["new", "old"])

    def test_tailUntilCommitted(self) -> None:
        """
        Records stay in the tail until their batch commits: durable_seq is
        the one before the tail's first, and reads within the tail are
        complete without the disk.
        """
        sequence = Sequencer()
        for _ in range(4):
            sequence.stream_row("s", "w", "x", [b"a"], 1.0, "", 0)
        self.assertEqual(sequence.durable_seq("s"), 0)
        found, complete = sequence.read_tail("s", 2, 2)
        self.assertEqual(([r.seq for r in found], complete), ([2, 3], True))
        sequence.committed({"s": 2})
        self.assertEqual(sequence.durable_seq("s"), 2)
        found, complete = sequence.read_tail("s", 1, 10)
        self.assertEqual(([r.seq for r in found], complete), ([3, 4], False))
        sequence.committed({"s": 4})
        self.assertEqual(sequence.durable_seq("s"), 4)
        self.assertEqual(sequence.read_tail("s", 1, 10), ([], False))

    def test_firstInTailAtTime(self) -> None:
        """The tail answers the first of its records at or after a time."""
        sequence = Sequencer()
        for t in (1.0, 2.0, 3.0):
            sequence.stream_row("s", "w", "x", [], t, "", 0)
        self.assertEqual(sequence.first_in_tail_at("s", 1.5), 2)
        self.assertIsNone(sequence.first_in_tail_at("s", 9.0))

    def test_tailOriginMarks(self) -> None:
        """Forwarded records in the tail raise their origin's mark; local ones do not."""
        sequence = Sequencer()
        sequence.stream_row("s", "w", "x", [], 1.0, "peer", 7)
        sequence.stream_row("s", "w", "x", [], 1.0, "", 0)
        marks = {("s", "peer"): 5, ("t", "other"): 9}
        sequence.tail_origin_marks(marks)
        self.assertEqual(marks, {("s", "peer"): 7, ("t", "other"): 9})

    def test_numbersMovedOn(self) -> None:
        """
        Deletes, prunes, truncation and numbers handed out elsewhere move
        the numbers on; a first retained number never moves back.
        """
        sequence = Sequencer()
        sequence.recovered({"s": (1, 10)}, last_id=0)
        self.assertEqual(sequence.delete_all("s"), 10)
        self.assertEqual(sequence.first_seq("s"), 11)
        sequence.pruned({"s": 5})
        self.assertEqual(sequence.first_seq("s"), 11)
        sequence.truncated("s", 8)
        self.assertEqual((sequence.first_seq("s"), sequence.last_seq("s")), (9, 8))
        sequence.note_counters({"s": 20, "t": 3}, last_id=40)
        self.assertEqual((sequence.last_seq("s"), sequence.last_seq("t")), (20, 3))
        self.assertEqual(sequence.queued_id(), 41)

    def test_following(self) -> None:
        """
        Records, appends, deletes and ids numbered elsewhere (a pair's
        partner) are followed: never numbered again here.
        """
        sequence = Sequencer()
        sequence.follow_row("s", 5)
        self.assertEqual((sequence.first_seq("s"), sequence.last_seq("s")), (5, 5))
        sequence.follow_append("s", 6, 9)
        sequence.follow_append("t", 2, 4)
        self.assertEqual((sequence.last_seq("s"), sequence.first_seq("t")), (9, 2))
        sequence.follow_delete("s", 12)
        self.assertEqual((sequence.first_seq("s"), sequence.last_seq("s")), (13, 12))
        sequence.follow_id(7)
        self.assertEqual(sequence.queued_id(), 8)

    def test_mergeTail(self) -> None:
        """
        Committed records go on with the tail snapshot's later ones, up to
        the limit; a snapshot's records already read are not repeated.
        """
        merged = merge_tail([record(1), record(2)], [record(2), record(3), record(4)], 1, 3)
        self.assertEqual([r.seq for r in merged], [1, 2, 3])
        self.assertEqual([r.seq for r in merge_tail([], [record(5)], 5, 3)], [5])
