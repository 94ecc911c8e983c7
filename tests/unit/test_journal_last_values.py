"""
Tests for L{malamute_pack.journal.last_values} through the journal: a
last-value stream keeps each subject's latest record in the transaction
that writes it (a stream that is not compacted keeps nothing), the bound
on subjects, the snapshot read as of the call (uncommitted records
included, later updates left at their value as of the call), retention
that never removes a latest record and keeps the totals right, compaction
turned on (rebuilt) and off through the journal and from the config at
open, and an operator's delete.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import Journal, JournalConfig, RetentionPolicy, StreamRecord
from malamute_pack.journal.writer import CompactSet
from tests.unit.test_journal_journal import Inline, new_path, open_journal

LV = "ticks"
COMPACTED = JournalConfig(compacted=frozenset({LV}))


def write(journal: Journal, stream: str, subjects: str, timestamp: float = 1000.0) -> list[int]:
    """One record per letter of C{subjects}, the letter its subject and body."""
    return [
        journal.append_stream(stream, "w", subject, [subject.encode()], timestamp)
        for subject in subjects
    ]


def latest(records: list[StreamRecord]) -> list[tuple[str, int]]:
    return [(record.subject, record.seq) for record in records]


def kept_rows(path: Path) -> list[tuple[str, str, int]]:
    """The stream_last_values table, sorted."""
    with closing(sqlite3.connect(path)) as conn:
        return sorted(conn.execute("SELECT stream, subject, seq FROM stream_last_values"))


def stored(path: Path, stream: str) -> list[int]:
    with closing(sqlite3.connect(path)) as conn:
        rows = conn.execute(
            "SELECT seq FROM stream_messages WHERE stream = ? ORDER BY seq", (stream,)
        )
        return [seq for (seq,) in rows]


class KeepTests(TestCase):
    @inlineCallbacks
    def test_latestOfEachSubject(self) -> Inline:
        """
        Each subject's latest record is kept, in the table and in the
        stream's snapshot (sequence order); the stream counts its subjects.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path, COMPACTED)
        write(journal, LV, "abacb")
        yield journal.flush()
        self.assertEqual(kept_rows(path), [(LV, "a", 3), (LV, "b", 5), (LV, "c", 4)])
        self.assertEqual(
            latest((yield journal.read_last_values(LV))), [("a", 3), ("c", 4), ("b", 5)]
        )
        self.assertEqual(journal.last_value_stats(LV), (3, 0))
        self.assertTrue(journal.compacted(LV))

    @inlineCallbacks
    def test_otherStreamsKeepNothing(self) -> Inline:
        """A stream that is not compacted keeps no last values."""
        path = new_path(self)
        journal, _ = open_journal(self, path, COMPACTED)
        write(journal, "plain", "abab")
        yield journal.flush()
        self.assertEqual(kept_rows(path), [])
        self.assertFalse(journal.compacted("plain"))
        self.assertEqual(journal.last_value_stats("plain"), (0, 0))

    @inlineCallbacks
    def test_appendsKeepTheirLastValues(self) -> Inline:
        """The records of an idempotent append are kept as the others are."""
        journal, _ = open_journal(self, config=COMPACTED)
        done: list[object] = []
        journal.append_batch(
            LV, "w", [("a", [b"1"]), ("b", [b"2"]), ("a", [b"3"])], 1.0, "k", [], done.append
        )
        yield journal.flush()
        self.assertEqual(done, [None])
        self.assertEqual(latest((yield journal.read_last_values(LV))), [("b", 2), ("a", 3)])

    @inlineCallbacks
    def test_limitOfSubjects(self) -> Inline:
        """
        Past the limit, a record of a new subject is stored but not kept as
        a last value, and counted; the subjects kept still move on.
        """
        config = JournalConfig(compacted=frozenset({LV}), last_value_subjects=2)
        path = new_path(self)
        journal, _ = open_journal(self, path, config)
        write(journal, LV, "abcca")
        yield journal.flush()
        self.assertEqual(latest((yield journal.read_last_values(LV))), [("b", 2), ("a", 5)])
        self.assertEqual(journal.last_value_stats(LV), (2, 2))
        self.assertEqual(stored(path, LV), [1, 2, 3, 4, 5])


class SnapshotTests(TestCase):
    @inlineCallbacks
    def test_asOfTheCall(self) -> Inline:
        """
        The snapshot holds the records written before the call, committed
        or not (commits here take 0.4 s), each subject at its value then:
        none written after it.
        """
        config = JournalConfig(commit_interval_s=0.4, compacted=frozenset({LV}))
        journal, _ = open_journal(self, config=config)
        write(journal, LV, "ab")
        yield journal.flush()
        write(journal, LV, "ca")
        reading = journal.read_last_values(LV)
        write(journal, LV, "bd")
        self.assertEqual(latest((yield reading)), [("b", 2), ("c", 3), ("a", 4)])

    @inlineCallbacks
    def test_updateCommittedBeforeTheRead(self) -> Inline:
        """
        A subject updated after the call, and committed before the read
        looks, is in the snapshot at its value as of the call (the writer
        noted it); a subject new since is not in it.
        """
        journal, _ = open_journal(self, config=COMPACTED)
        write(journal, LV, "abc")
        yield journal.flush()
        # Hold the reader thread, so that the read runs after the updates commit.
        release = threading.Event()
        held = journal._reader.read(lambda _conn: release.wait(10))
        reading = journal.read_last_values(LV)
        write(journal, LV, "bdb")
        yield journal.flush()
        release.set()
        yield held
        self.assertEqual(latest((yield reading)), [("a", 1), ("b", 2), ("c", 3)])
        self.assertEqual(
            latest((yield journal.read_last_values(LV))),
            [("a", 1), ("c", 3), ("d", 5), ("b", 6)],
        )


class RetentionTests(TestCase):
    @inlineCallbacks
    def test_latestRecordsStay(self) -> Inline:
        """
        Retention removes the oldest records that are not their subject's
        latest, stepping over those that are (the stream may then hold
        more than its limit); the totals follow, and a record superseded
        since the last prune goes at the next.
        """
        config = JournalConfig(
            compacted=frozenset({LV}), per_stream_retention={LV: RetentionPolicy(max_count=2)}
        )
        path = new_path(self)
        journal, _ = open_journal(self, path, config)
        write(journal, LV, "abcaba")
        yield journal.flush()
        self.assertEqual((yield journal.prune()), 3)
        self.assertEqual(stored(path, LV), [3, 5, 6])
        self.assertEqual(journal.first_seq(LV), 3)
        self.assertEqual((yield journal.stream_totals())[LV], (3, 15))
        write(journal, LV, "c")
        yield journal.flush()
        self.assertEqual((yield journal.prune()), 1)
        self.assertEqual(stored(path, LV), [5, 6, 7])
        self.assertEqual((yield journal.stream_totals())[LV], (3, 15))
        self.assertEqual(
            latest((yield journal.read_last_values(LV))), [("b", 5), ("a", 6), ("c", 7)]
        )

    @inlineCallbacks
    def test_byAgeInSteps(self) -> Inline:
        """
        By age, in steps of a few records: every record too old goes but
        the latest of each subject, however many steps it takes.
        """
        config = JournalConfig(
            compacted=frozenset({LV}),
            retention=RetentionPolicy(max_age_s=10.0),
            prune_chunk_rows=2,
        )
        path = new_path(self)
        journal, _ = open_journal(self, path, config)
        write(journal, LV, "abcdabcdab", timestamp=100.0)
        write(journal, LV, "e", timestamp=200.0)
        yield journal.flush()
        self.assertEqual((yield journal.prune(now=205.0)), 6)
        self.assertEqual(stored(path, LV), [7, 8, 9, 10, 11])


class CompactionTests(TestCase):
    @inlineCallbacks
    def test_turnedOnAndOff(self) -> Inline:
        """
        Turned on, a stream's last values are built from its retained
        records; turned off, they are forgotten.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        write(journal, "s", "abab")
        self.assertEqual((yield journal.set_compaction("s", True)), 2)
        self.assertTrue(journal.compacted("s"))
        self.assertEqual(kept_rows(path), [("s", "a", 3), ("s", "b", 4)])
        write(journal, "s", "a")
        yield journal.flush()
        self.assertEqual(latest((yield journal.read_last_values("s"))), [("b", 4), ("a", 5)])
        self.assertEqual((yield journal.set_compaction("s", False)), 0)
        self.assertFalse(journal.compacted("s"))
        self.assertEqual(kept_rows(path), [])

    @inlineCallbacks
    def test_configAtOpen(self) -> Inline:
        """
        At open the config says which streams are compacted: one the file
        compacted and the config does not is turned off; one the config
        adds is built; one both compact is kept as it is.
        """
        path = new_path(self)
        journal = Journal(path, reactor, COMPACTED)
        journal.open()
        write(journal, LV, "aba")
        yield journal.close()
        plain = Journal(path, reactor)
        plain.open()
        yield plain.flush()
        self.assertEqual(kept_rows(path), [])
        yield plain.close()
        again = Journal(path, reactor, COMPACTED)
        again.open()
        self.addCleanup(again.close)
        yield again.flush()
        self.assertEqual(kept_rows(path), [(LV, "a", 3), (LV, "b", 2)])
        self.assertEqual(again.last_value_stats(LV), (2, 0))

    @inlineCallbacks
    def test_keptAcrossARestart(self) -> Inline:
        """A stream compacted before and after a restart keeps its last values and count."""
        path = new_path(self)
        journal = Journal(path, reactor, COMPACTED)
        journal.open()
        write(journal, LV, "abc")
        yield journal.close()
        again = Journal(path, reactor, COMPACTED)
        again.open()
        self.addCleanup(again.close)
        self.assertEqual(again.last_value_stats(LV), (3, 0))
        self.assertEqual(latest((yield again.read_last_values(LV))), [("a", 1), ("b", 2), ("c", 3)])

    @inlineCallbacks
    def test_deleteForgetsThem(self) -> Inline:
        """An operator's delete of a last-value stream deletes its last values too."""
        path = new_path(self)
        journal, _ = open_journal(self, path, COMPACTED)
        write(journal, LV, "ab")
        yield journal.delete_stream(LV)
        self.assertEqual(kept_rows(path), [])
        self.assertEqual(journal.last_value_stats(LV), (0, 0))
        write(journal, LV, "a")
        yield journal.flush()
        self.assertEqual(latest((yield journal.read_last_values(LV))), [("a", 3)])

    @inlineCallbacks
    def test_appliedAsShipped(self) -> Inline:
        """
        A pair's partner applies a change of the compacted streams (with
        a rebuild) as its active wrote it: the same last values.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        write(journal, "s", "aab")
        journal.apply([CompactSet(frozenset({"s"}), rebuild=True)])
        yield journal.flush()
        self.assertTrue(journal.compacted("s"))
        self.assertEqual(kept_rows(path), [("s", "a", 2), ("s", "b", 3)])
