"""
Tests for L{malamute_pack.journal.reads}, the journal's SQL for reading:
ranges with their byte cap, records, numbers, times, letters by id and
owners by page, on a journal file written by a real journal.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import reads
from tests.unit.test_journal_journal import Inline, append, new_path, open_journal


class ReadsTests(TestCase):
    @inlineCallbacks
    def written(self) -> Inline:
        """A journal file with streams a (5 records, 1000 to 1004) and b (1), committed."""
        self.path: Path = new_path(self)
        journal, _ = open_journal(self, self.path)
        for i in range(5):
            journal.append_stream("a", "w", f"x.{i}", [b"x" * 100], 1000.0 + i)
        append(journal, "b", 1)
        for i in range(3):
            journal.store_queued("mailbox", "m", "s", "x", "", None, [b"%d" % i], lambda e: None)
        journal.save_owner("z", "zed", 2.0)
        journal.save_owner("y", "why", 1.0)
        yield journal.flush()
        self.conn = sqlite3.connect(self.path)
        self.addCleanup(self.conn.close)

    @inlineCallbacks
    def test_streams(self) -> Inline:
        """Names, numbers retained and assigned, and the first at a time."""
        yield self.written()
        conn = self.conn
        self.assertEqual(reads.stream_names(conn), ["a", "b"])
        self.assertEqual(sorted(reads.stream_lasts(conn)), [("a", 5), ("b", 1)])
        self.assertEqual((reads.first_retained(conn, "a"), reads.last_retained(conn, "a")), (1, 5))
        self.assertEqual(reads.last_assigned(conn, "a"), 5)
        self.assertIsNone(reads.first_retained(conn, "none"))
        self.assertIsNone(reads.last_assigned(conn, "none"))
        self.assertEqual(reads.first_at_time(conn, "a", 1002.5), 4)
        self.assertIsNone(reads.first_at_time(conn, "a", 2000.0))
        self.assertEqual(reads.stream_totals(conn)["a"][0], 5)

    @inlineCallbacks
    def test_ranges(self) -> Inline:
        """
        A range is in order within its bounds, all of it without a limit;
        chunk rows stop at about the byte cap, one at least.
        """
        yield self.written()
        conn = self.conn
        self.assertEqual(
            [row[0] for row in reads.chunk_rows(conn, "a", 2, 4, 10, 10_000)], [2, 3, 4]
        )
        self.assertEqual([row[0] for row in reads.chunk_rows(conn, "a", 2, 9, 2, 10_000)], [2, 3])
        self.assertEqual([r.seq for r in reads.chunk_rows(conn, "a", 1, 5, 10, 1)], [1])
        self.assertEqual(len(reads.chunk_rows(conn, "a", 1, 5, 10, 10_000)), 5)
        self.assertEqual([r.seq for r in reads.stream_records(conn, "a", 4, 10)], [4, 5])
        self.assertEqual([r[1] for r in reads.full_rows(conn, "a", 2, 3, 10)], [2, 3])

    @inlineCallbacks
    def test_unencodableName(self) -> Inline:
        """A stream name SQLite cannot take reads as nothing stored."""
        yield self.written()
        name = "bad\udcff"
        self.assertEqual(reads.stream_records(self.conn, name, 1, 10), [])
        self.assertEqual(reads.chunk_rows(self.conn, name, 1, 10, 10, 100), [])
        self.assertIsNone(reads.first_at_time(self.conn, name, 0.0))

    @inlineCallbacks
    def test_lettersAndOwners(self) -> Inline:
        """Letters by id, all letters in order, and owners a page at a time."""
        yield self.written()
        conn = self.conn
        first = reads.all_queued(conn)[0].id
        self.assertEqual([r.id for r in reads.all_queued(conn)], [first, first + 1, first + 2])
        found = reads.queued_by_ids(conn, [first + 2, first, first + 99])
        self.assertEqual([r.id for r in found], [first, first + 2])
        self.assertEqual(reads.owners_page(conn, None, 1), [("y", "why", 1.0)])
        self.assertEqual(reads.owners_page(conn, "y", 5), [("z", "zed", 2.0)])
        self.assertEqual(len(reads.owners_page(conn, None, -1)), 2)

    @inlineCallbacks
    def test_manyIds(self) -> Inline:
        """More ids than one query takes are asked for in parts."""
        path = new_path(self)
        journal, _ = open_journal(self, path)
        ids = [
            journal.store_queued("mailbox", "m", "s", "x", "", None, [], lambda e: None).id
            for _ in range(1200)
        ]
        yield journal.flush()
        with closing(sqlite3.connect(path)) as conn:
            self.assertEqual([r.id for r in reads.queued_by_ids(conn, ids)], ids)
