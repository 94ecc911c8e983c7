"""
Tests for L{malamute_pack.protocol.chunks}: the packed records of
STREAM_CHUNK and STREAM_APPEND, and the frames encoding they share with
the journal.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import chunks
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.mlm import MalformedMessage

texts = st.text(max_size=40).filter(lambda t: len(t.encode("utf-8", "surrogateescape")) <= 255)
frame_lists = st.lists(st.binary(max_size=50), max_size=5)


class FramesTests(SynchronousTestCase):
    @given(frame_lists)
    def test_roundTrip(self, frames: list[bytes]) -> None:
        """Any list of frames, empty frames included, decodes to itself."""
        self.assertEqual(chunks.decode_frames(chunks.encode_frames(frames)), tuple(frames))

    def test_truncated(self) -> None:
        """A length that runs past the end is a ValueError."""
        self.assertRaises(ValueError, chunks.decode_frames, b"\x00\x00\x00\x05abc")


class ChunkTests(SynchronousTestCase):
    @given(st.lists(st.tuples(st.integers(1, 2**63), texts, texts, frame_lists), max_size=20))
    def test_roundTrip(self, records: list[tuple[int, str, str, list[bytes]]]) -> None:
        """Rows decode to the same columns: microsecond times, frames as encoded."""
        rows = [
            ChunkRow(seq, 1_700_000_000.25, sender, subject, chunks.encode_frames(frames))
            for seq, sender, subject, frames in records
        ]
        columns = chunks.decode_chunk(chunks.encode_chunk(rows), len(rows))
        self.assertEqual(columns.seq, [r.seq for r in rows])
        self.assertEqual(columns.timestamp_us, [1_700_000_000_250_000] * len(rows))
        self.assertEqual(columns.sender, [r.sender for r in rows])
        self.assertEqual(columns.subject, [r.subject for r in rows])
        self.assertEqual(
            [chunks.decode_frames(b) for b in columns.frames], [tuple(f) for *_, f in records]
        )

    def test_wrongCount(self) -> None:
        """A count that is not the number of records packed is malformed."""
        data = chunks.encode_chunk([ChunkRow(1, 0.0, "w", "s", b"")] * 2)
        self.assertRaises(MalformedMessage, chunks.decode_chunk, data, 1)
        self.assertRaises(MalformedMessage, chunks.decode_chunk, data, 3)

    def test_truncated(self) -> None:
        """Every truncation of a chunk is malformed, never an IndexError or a short read."""
        data = chunks.encode_chunk([ChunkRow(7, 1.0, "writer", "subject", b"\x00\x00\x00\x01x")])
        for end in range(len(data)):
            self.assertRaises(MalformedMessage, chunks.decode_chunk, data[:end], 1)

    def test_longString(self) -> None:
        """A subject longer than 255 bytes cannot be packed."""
        self.assertRaises(
            MalformedMessage, chunks.encode_chunk, [ChunkRow(1, 0.0, "", "x" * 256, b"")]
        )


class AppendTests(SynchronousTestCase):
    @given(st.lists(st.tuples(texts, frame_lists), max_size=20))
    def test_roundTrip(self, records: list[tuple[str, list[bytes]]]) -> None:
        """Records (subject, frames) decode to themselves."""
        decoded = chunks.decode_append(chunks.encode_append(records))
        self.assertEqual(decoded, [(s, tuple(f)) for s, f in records])

    def test_truncated(self) -> None:
        """Every truncation of an append (but the empty one) is malformed."""
        data = chunks.encode_append([("subject", [b"ab", b"c"])])
        for end in range(1, len(data)):
            self.assertRaises(MalformedMessage, chunks.decode_append, data[:end])

    def test_badFrames(self) -> None:
        """A record whose frames do not decode is malformed, and says which record."""
        data = b"\x01s\x00\x00\x00\x03\x00\x00\x00"
        with self.assertRaises(MalformedMessage) as ctx:
            chunks.decode_append(data)
        self.assertIn("record 1", str(ctx.exception))
