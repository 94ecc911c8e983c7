"""
Tests for where a journaled stream record came from (``origin`` and
``origin_seq`` in L{malamute_pack.journal.journal} and L{malamute_pack.journal.reads},
L{malamute_pack.journal.writer} and L{malamute_pack.journal.schema}): records
forwarded by a peer and local ones read back with their origin, uncommitted
and committed; a journal made before the columns existed is migrated with
its records kept as local ones; and L{Journal.origin_marks}.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Generator
from contextlib import closing
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import Journal, JournalConfig, RetentionPolicy, StreamRecord
from malamute_pack.journal.reads import FIRST_ORIGIN, NEXT_ORIGIN, ORIGIN_MARK
from malamute_pack.journal.schema import MIGRATIONS, ORIGIN_INDEX, migrate
from tests.unit.test_journal_journal import SLOW_COMMIT, new_path, open_journal

Inline = Generator[Deferred[Any], Any, None]

# The schema version before stream records had an origin.
BEFORE_ORIGIN = 3


def write_mixed(journal: Journal, stream: str = "s") -> list[int]:
    """A local record, two from peer "b1" and one from "b2"; their seqs here."""
    return [
        journal.append_stream(stream, "w", "local", [b"l"], 1.0),
        journal.append_stream(stream, "w", "fwd.1", [b"f", b"1"], 2.0, "b1", 40),
        journal.append_stream(stream, "w", "fwd.2", [], 3.0, origin="b1", origin_seq=41),
        journal.append_stream(stream, "v", "fwd.3", [b"g"], 4.0, "b2", 7),
    ]


MIXED = [
    StreamRecord("s", 1, 1.0, "w", "local", (b"l",), "", 0),
    StreamRecord("s", 2, 2.0, "w", "fwd.1", (b"f", b"1"), "b1", 40),
    StreamRecord("s", 3, 3.0, "w", "fwd.2", (), "b1", 41),
    StreamRecord("s", 4, 4.0, "v", "fwd.3", (b"g",), "b2", 7),
]


class OriginRecordTests(TestCase):
    @inlineCallbacks
    def test_uncommittedCarryOrigin(self) -> Inline:
        """
        Records still in the in-memory tail read back with their origin and
        origin_seq; a local one with "" and 0.
        """
        journal, _ = open_journal(self, config=SLOW_COMMIT)
        self.assertEqual(write_mixed(journal), [1, 2, 3, 4])
        self.assertEqual(journal.pending_writes, 4)
        self.assertEqual((yield journal.read_stream("s", 1, 10)), MIXED)
        self.assertEqual((yield journal.read_stream("s", 3, 1)), MIXED[2:3])

    @inlineCallbacks
    def test_committedCarryOrigin(self) -> Inline:
        """
        Committed records read back from the database with their origin and
        origin_seq, before and after the journal is reopened, and a read
        that joins committed records with the tail keeps both kinds.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        write_mixed(journal)
        yield journal.flush()
        self.assertEqual((yield journal.read_stream("s", 1, 10)), MIXED)
        yield journal.close()

        journal, _ = open_journal(self, path, SLOW_COMMIT)
        self.assertEqual((yield journal.read_stream("s", 1, 10)), MIXED)
        journal.append_stream("s", "w", "fwd.4", [b"h"], 5.0, "b2", 8)
        records = yield journal.read_stream("s", 2, 10)
        self.assertEqual(
            records, [*MIXED[1:], StreamRecord("s", 5, 5.0, "w", "fwd.4", (b"h",), "b2", 8)]
        )

    @inlineCallbacks
    def test_storedColumns(self) -> Inline:
        """
        The rows hold the origin columns: "" and 0 for a local write.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        write_mixed(journal)
        yield journal.flush()
        with closing(sqlite3.connect(path)) as conn:
            rows = conn.execute(
                "SELECT seq, origin, origin_seq FROM stream_messages ORDER BY seq"
            ).fetchall()
        self.assertEqual(rows, [(1, "", 0), (2, "b1", 40), (3, "b1", 41), (4, "b2", 7)])


class MigrationTests(TestCase):
    def old_journal(self) -> Path:
        """A journal file at the schema before origins, with two records of stream "s"."""
        path = new_path(self)
        path.parent.mkdir(parents=True)
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            self.assertEqual(migrate(conn, MIGRATIONS[:BEFORE_ORIGIN]), BEFORE_ORIGIN)
            conn.executemany(
                "INSERT INTO stream_messages (stream, seq, ts, sender, subject, content, bytes) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [("s", 1, 1.0, "w", "a", b"", 0), ("s", 2, 2.0, "w", "b", b"", 0)],
            )
            conn.execute(
                "INSERT INTO streams (stream, last_seq, message_count, total_bytes) "
                "VALUES ('s', 2, 2, 0)"
            )
        return path

    @inlineCallbacks
    def test_oldRecordsBecomeLocal(self) -> Inline:
        """
        Opening a journal made before origins migrates it: its records are
        kept, read back as local ones, and numbering goes on after them;
        records written afterwards keep their origin.
        """
        path = self.old_journal()
        journal, recovered = open_journal(self, path)
        self.assertEqual(recovered.streams, {"s": (1, 2)})
        self.assertEqual(journal.append_stream("s", "w", "c", [], 3.0, "b1", 9), 3)
        yield journal.flush()
        self.assertEqual(
            (yield journal.read_stream("s", 1, 10)),
            [
                StreamRecord("s", 1, 1.0, "w", "a", (), "", 0),
                StreamRecord("s", 2, 2.0, "w", "b", (), "", 0),
                StreamRecord("s", 3, 3.0, "w", "c", (), "b1", 9),
            ],
        )
        self.assertEqual(journal.origin_marks(), {("s", "b1"): 9})

    def test_schema(self) -> None:
        """
        The migrated table stays STRICT, has the two columns NOT NULL with
        their defaults, and its origin index is partial (only records with
        an origin are in it) and answers origin_marks' queries by seeking.
        """
        path = self.old_journal()
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            self.assertEqual(migrate(conn), len(MIGRATIONS))
            (strict,) = conn.execute(
                "SELECT strict FROM pragma_table_list WHERE name = 'stream_messages'"
            ).fetchone()
            columns = {
                name: (kind, notnull, default)
                for _, name, kind, notnull, default, _ in conn.execute(
                    "PRAGMA table_info(stream_messages)"
                )
            }
            (index_sql,) = conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?",
                (ORIGIN_INDEX,),
            ).fetchone()
            plans = [
                conn.execute(
                    "EXPLAIN QUERY PLAN " + query, ("s", "b1", 1)[: query.count("?")]
                ).fetchone()[3]
                for query in (FIRST_ORIGIN, ORIGIN_MARK, NEXT_ORIGIN)
            ]
        self.assertEqual(strict, 1)
        self.assertEqual(columns["origin"], ("TEXT", 1, "''"))
        self.assertEqual(columns["origin_seq"], ("INTEGER", 1, "0"))
        self.assertIn("(stream, origin, origin_seq) WHERE origin != ''", index_sql)
        for plan in plans:
            self.assertIn(f"COVERING INDEX {ORIGIN_INDEX}", plan)
        self.assertIn("SEARCH", plans[1])
        self.assertIn("(stream,origin,origin_seq)>(?,?,?)", plans[2])


class OriginMarksTests(TestCase):
    def test_empty(self) -> None:
        """
        A journal without forwarded records has no marks, local records
        or not.
        """
        journal, _ = open_journal(self)
        self.assertEqual(journal.origin_marks(), {})
        journal.append_stream("s", "w", "local", [], 1.0)
        self.assertEqual(journal.origin_marks(), {})

    @inlineCallbacks
    def test_highestPerStreamAndOrigin(self) -> Inline:
        """
        Per (stream, origin) the highest origin_seq, whatever the order the
        records came in, uncommitted, committed, and after a reopen.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path, SLOW_COMMIT)
        write_mixed(journal, "s")
        journal.append_stream("t", "w", "x", [], 5.0, "b1", 12)
        journal.append_stream("t", "w", "x", [], 6.0, "b1", 10)
        expected = {("s", "b1"): 41, ("s", "b2"): 7, ("t", "b1"): 12}
        self.assertEqual(journal.pending_writes, 6)
        self.assertEqual(journal.origin_marks(), expected)
        yield journal.flush()
        self.assertEqual(journal.origin_marks(), expected)
        # Half committed, half in the tail: the answer joins both.
        journal.append_stream("s", "w", "y", [], 7.0, "b2", 8)
        journal.append_stream("u", "w", "y", [], 7.0, "b3", 1)
        self.assertEqual(journal.origin_marks(), {**expected, ("s", "b2"): 8, ("u", "b3"): 1})
        yield journal.close()
        journal, _ = open_journal(self, path)
        self.assertEqual(journal.origin_marks(), {**expected, ("s", "b2"): 8, ("u", "b3"): 1})

    @inlineCallbacks
    def test_prunedOriginForgotten(self) -> Inline:
        """
        Marks count retained records only: an origin whose records were all
        pruned has no mark, one with records left has the highest retained.
        """
        config = JournalConfig(retention=RetentionPolicy(max_count=2))
        journal, _ = open_journal(self, config=config)
        write_mixed(journal)  # keeps seqs 3 and 4: b1's 41 and b2's 7
        journal.append_stream("t", "w", "x", [], 1.0, "b3", 5)
        for _ in range(2):
            journal.append_stream("t", "w", "x", [], 1.0)
        yield journal.flush()
        self.assertEqual((yield journal.prune()), 3)
        self.assertEqual(journal.origin_marks(), {("s", "b1"): 41, ("s", "b2"): 7})


class QueuedRelayTests(TestCase):
    @inlineCallbacks
    def test_relayRecovered(self) -> Inline:
        """
        A queued letter a pack peer handed over is recovered with its relay
        origin and id; another one with "" and 0.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        done: list[object] = []
        journal.store_queued("mailbox", "bob", "al", "hi", "", None, [b"x"], done.append)
        journal.store_queued(
            "service", "echo", "al", "job", "t", None, [b"y"], done.append, "B1", 42
        )
        yield journal.flush()
        self.assertEqual(done, [None, None])
        yield journal.close()
        _, recovered = open_journal(self, path)
        self.assertEqual(
            [(r.address, r.relay_origin, r.relay_id) for r in recovered.queued],
            [("bob", "", 0), ("echo", "B1", 42)],
        )
