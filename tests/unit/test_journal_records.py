"""
Tests for L{malamute_pack.journal.records} and L{malamute_pack.journal.errors}:
the content-frame BLOB encoding, stream records and rows with their origin,
and the JournalError wrapping of SQLite errors.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal import JournalError, StreamRecord, decode_frames, encode_frames
from malamute_pack.journal.records import row_record, stream_row

frames = st.lists(st.binary(max_size=300), max_size=8)


class FrameEncodingTests(SynchronousTestCase):
    @settings(max_examples=200)
    @given(frames)
    def test_roundTrip(self, content: list[bytes]) -> None:
        """
        Any list of frames, empty frames and no frames included, decodes
        from its BLOB to the same frames.
        """
        self.assertEqual(decode_frames(encode_frames(content)), tuple(content))

    def test_layout(self) -> None:
        """
        Each frame is its length as 4 big-endian bytes followed by its bytes;
        no frames is the empty BLOB.
        """
        self.assertEqual(encode_frames([b"ab", b""]), b"\x00\x00\x00\x02ab\x00\x00\x00\x00")
        self.assertEqual(encode_frames([]), b"")
        self.assertEqual(decode_frames(b""), ())

    @settings(max_examples=100)
    @given(frames.filter(bool), st.data())
    def test_truncatedRaises(self, content: list[bytes], data: st.DataObject) -> None:
        """
        A BLOB cut short anywhere inside its last frame raises ValueError
        instead of returning short frames.
        """
        blob = encode_frames(content)
        last_start = len(encode_frames(content[:-1]))
        cut = data.draw(st.integers(min_value=last_start + 1, max_value=len(blob) - 1))
        with self.assertRaises(ValueError):
            decode_frames(blob[:cut])

    def test_recordsAreValues(self) -> None:
        """
        Records compare by value and cannot be changed.
        """
        a = StreamRecord("s", 1, 2.0, "me", "subj", (b"x",))
        self.assertEqual(a, StreamRecord("s", 1, 2.0, "me", "subj", (b"x",)))
        with self.assertRaises(AttributeError):
            a.seq = 2  # type: ignore[misc]

    def test_recordOrigin(self) -> None:
        """
        A record made without an origin is local (origin "", origin_seq 0);
        one with an origin keeps it, through its row and back.
        """
        local = StreamRecord("s", 1, 2.0, "me", "subj", (b"x",))
        self.assertEqual((local.origin, local.origin_seq), ("", 0))
        self.assertEqual(row_record(stream_row("s", 1, 2.0, "me", "subj", [b"x"])), local)
        row = stream_row("s", 3, 2.0, "me", "subj", [b"x", b""], "peer", 17)
        self.assertEqual(row[7:], ("peer", 17))
        self.assertEqual(
            row_record(row), StreamRecord("s", 3, 2.0, "me", "subj", (b"x", b""), "peer", 17)
        )


class JournalErrorTests(SynchronousTestCase):
    def test_wrapsDiskFull(self) -> None:
        """
        A SQLITE_FULL error becomes a JournalError that names the journal and
        the operation, says the disk is full and keeps the original as cause.
        """
        original = sqlite3.OperationalError("database or disk is full")
        original.sqlite_errorcode = sqlite3.SQLITE_FULL
        original.sqlite_errorname = "SQLITE_FULL"
        error = JournalError.wrap(original, Path("/data/j.db"), "writing a batch of 3 records")
        self.assertTrue(error.disk_full)
        self.assertEqual(error.sqlite_error, "SQLITE_FULL")
        self.assertIs(error.__cause__, original)
        self.assertIn("/data/j.db", str(error))
        self.assertIn("writing a batch of 3 records", str(error))
        self.assertIn("disk is full", str(error))

    def test_wrapsOtherErrors(self) -> None:
        """
        An error that is not about space is wrapped without the disk-full flag.
        """
        error = JournalError.wrap(TypeError("bad frame"), Path("j.db"), "writing")
        self.assertFalse(error.disk_full)
        self.assertIsNone(error.sqlite_error)
        self.assertIn("TypeError: bad frame", str(error))
