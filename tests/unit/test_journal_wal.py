"""
Tests for L{malamute_pack.journal.wal}: a journal's write-ahead log as a
kill -9 leaves it (copied while the journal is open) is checked before
SQLite reads it. Whole, it opens as it is; a bit flipped in a frame or in
its header is repaired, so the writes after it are kept (without the
repair SQLite silently drops them) and the damaged record, if any, is
told as lost; cut short, the journal refuses to open, saying what to do,
and opens with what is left once the index file is removed.
"""

from __future__ import annotations

import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import Journal, JournalConfig
from malamute_pack.journal.wal import FRAME_HEADER, WAL_HEADER, WalCut, check, shm_path, wal_path
from tests.support import capture_log

Inline = Any
RECORDS = 300
CONFIG = JournalConfig(prune_interval_s=3600, crash_skip=1000)


def body(seq: int) -> bytes:
    return b"MARK%05d-" % seq + b"x" * 80


def flip_byte(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


class WalTests(TestCase):
    """A killed journal's write-ahead log, whole, damaged or cut short."""

    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.path = self.dir / "journal.sqlite"

    def journal(self, path: Path) -> Journal:
        journal = Journal(path, reactor, CONFIG)
        self.addCleanup(lambda: journal.close() if journal.is_open else None)
        return journal

    @inlineCallbacks
    def killed(self) -> Inline:
        """
        Records 1..RECORDS of stream C{s} written, and the journal's files
        copied while it is open (as a kill -9 leaves them, its log not
        checkpointed): the copy's path.
        """
        journal = self.journal(self.path)
        journal.open()
        for seq in range(1, RECORDS + 1):
            journal.append_stream("s", "w", f"n{seq}", [body(seq)], 1000.0 + seq)
            if seq % 50 == 0:
                yield journal.flush()  # several commits: several frames of the log
        yield journal.flush()
        copy = self.dir / "killed" / "journal.sqlite"
        copy.parent.mkdir()
        for suffix in ("", "-wal", "-shm"):
            shutil.copy(f"{self.path}{suffix}", f"{copy}{suffix}")
        yield journal.close()
        self.assertGreater(wal_path(copy).stat().st_size, WAL_HEADER)
        return copy

    @inlineCallbacks
    def served(self, path: Path) -> Inline:
        """The journal at C{path} opened: the numbers it serves, and those it says are lost."""
        journal = self.journal(path)
        journal.open()
        records = yield journal.read_stream("s", 1, RECORDS + 10)
        for record in records:
            self.assertEqual(list(record.content), [body(record.seq)], record.seq)
        served = {r.seq for r in records}
        lost = {seq for a, b in journal.lost("s", 1, RECORDS) for seq in range(a, b + 1)}
        yield journal.close()
        return served, lost

    def frame_of(self, path: Path, marker: bytes) -> int:
        """The offset in the log of the last frame that holds C{marker}."""
        data = wal_path(path).read_bytes()
        state = check(path)
        size = FRAME_HEADER + state.page_size
        offset = data.rindex(marker)
        return WAL_HEADER + (offset - WAL_HEADER) // size * size

    @inlineCallbacks
    def test_wholeLogOpens(self) -> Inline:
        """A whole log is left alone: every record is served, nothing is repaired."""
        copy = yield self.killed()
        state = check(copy)
        self.assertFalse(state.damaged)
        self.assertFalse(state.cut)
        self.assertEqual(state.committed, state.valid)
        served, lost = yield self.served(copy)
        self.assertEqual(served, set(range(1, RECORDS + 1)))
        self.assertEqual(lost, set())

    @inlineCallbacks
    def test_flippedFrameRepaired(self) -> Inline:
        """
        One bit flipped in a frame's page, early in the log: SQLite alone
        would drop every later frame (shown on a copy); repaired, every
        record is either served intact or told as lost, the later ones
        served, and the repair is logged.
        """
        copy = yield self.killed()
        at = self.frame_of(copy, b"MARK00100-")
        # The record's own bytes: found by its checksum as damaged.
        offset = wal_path(copy).read_bytes().index(b"MARK00100-", at) + 2
        flip_byte(wal_path(copy), offset)
        state = check(copy)
        self.assertTrue(state.damaged)
        self.assertLess(state.valid, state.ours)

        plain = self.dir / "plain"
        plain.mkdir()
        for suffix in ("", "-wal"):
            shutil.copy(f"{copy}{suffix}", plain / f"journal.sqlite{suffix}")
        with closing(sqlite3.connect(plain / "journal.sqlite")) as conn:
            (kept,) = conn.execute("SELECT count(*) FROM stream_messages").fetchone()
        self.assertLess(kept, RECORDS - 1, "SQLite alone should have dropped the later frames")

        events = capture_log(self)
        served, lost = yield self.served(copy)
        self.assertEqual(served | lost, set(range(1, RECORDS + 1)))
        self.assertIn(RECORDS, served)
        self.assertLessEqual(len(lost), 50)
        self.assertIn("write-ahead log was damaged", "\n".join(map(str, events)))

    @inlineCallbacks
    def test_flippedHeaderRepaired(self) -> Inline:
        """A bit flipped in the log's header: repaired, every record is served."""
        copy = yield self.killed()
        flip_byte(wal_path(copy), 17)  # in salt-1
        self.assertTrue(check(copy).damaged)
        served, lost = yield self.served(copy)
        self.assertEqual(served, set(range(1, RECORDS + 1)))
        self.assertEqual(lost, set())

    @inlineCallbacks
    def test_cutLogRefused(self) -> Inline:
        """
        A log cut short is refused, naming its index file; the files are
        left as they were. With the index removed on purpose, the journal
        opens with what is left.
        """
        copy = yield self.killed()
        wal = wal_path(copy)
        with wal.open("r+b") as f:
            f.truncate(wal.stat().st_size * 9 // 10)
        before = wal.read_bytes()
        self.assertTrue(check(copy).cut)
        with self.assertRaises(WalCut) as caught:
            self.journal(copy).open()
        message = str(caught.exception)
        self.assertIn("was cut short", message)
        self.assertIn(f"remove {shm_path(copy)}", message)
        self.assertEqual(wal.read_bytes(), before)

        shm_path(copy).unlink()
        served, _lost = yield self.served(copy)
        self.assertTrue(served)
        self.assertEqual(served, set(range(1, max(served) + 1)))
        self.assertLess(max(served), RECORDS)
