"""
Tests for L{malamute_pack.spark.chunk_arrow}: a STREAM_CHUNK's bytes made
the source's record batch with numpy, the same batch as the row-by-row
decoding (L{malamute_pack.protocol.chunks.decode_chunk} then
L{tests.spark_reference.chunk_batch}) makes, and malformed chunks
refused alike.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.bulk import RangeChunk
from malamute_pack.protocol import chunks
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.mlm import MalformedMessage
from malamute_pack.spark.chunk_arrow import chunk_record_batch
from malamute_pack.spark.schema import ARROW_SCHEMA
from tests.spark_reference import chunk_batch

texts = st.sampled_from(["", "w", "ann", "a.b", "a=1;b", "k=1;k=2", "é=ü", "x;", "t" * 255])
frame_lists = st.lists(st.binary(max_size=12), max_size=3)


def row(seq: int, sender: str, subject: str, frames: list[bytes]) -> ChunkRow:
    return ChunkRow(
        seq, 1_700_000_000.123456 + seq / 7, sender, subject, chunks.encode_frames(frames)
    )


class ChunkRecordBatchTests(SynchronousTestCase):
    def assertSameBatch(self, rows: list[ChunkRow]) -> None:
        data = chunks.encode_chunk(rows)
        expected = chunk_batch(RangeChunk("s", *chunks.decode_chunk(data, len(rows))))
        batch, last = chunk_record_batch("s", data, len(rows))
        self.assertEqual(batch.schema, ARROW_SCHEMA)
        self.assertTrue(batch.equals(expected), (batch.to_pylist(), expected.to_pylist()))
        self.assertEqual(last, rows[-1].seq if rows else 0)

    @settings(max_examples=200)
    @given(st.lists(st.tuples(texts, texts, frame_lists), max_size=12))
    def test_anyRecords(self, records: list[tuple[str, str, list[bytes]]]) -> None:
        """Any senders, subjects and frames (none, empty, several): the row-by-row batch."""
        self.assertSameBatch([row(i + 1, *record) for i, record in enumerate(records)])

    @given(st.integers(1, 50), st.integers(0, 300), texts)
    def test_evenRecords(self, count: int, size: int, subject: str) -> None:
        """Records all of one size (the strided path): the row-by-row batch."""
        self.assertSameBatch([row(i + 9, "w", subject, [b"%d" % i * size]) for i in range(count)])

    def test_evenButNotUniform(self) -> None:
        """Records whose sizes add up as if even, but are not, are still found one by one."""
        rows = [row(1, "w", "ab", [b"x"]), row(2, "w", "a", [b"xy"])]
        self.assertSameBatch(rows)

    def test_malformed(self) -> None:
        """Every truncation, a wrong count, and bytes to spare are MalformedMessage."""
        rows = [row(1, "writer", "a=1", [b"x", b"yz"]), row(2, "writer", "subject", [b"q"])]
        data = chunks.encode_chunk(rows)
        for end in range(len(data)):
            self.assertRaises(MalformedMessage, chunk_record_batch, "s", data[:end], 2)
        self.assertRaises(MalformedMessage, chunk_record_batch, "s", data, 1)
        self.assertRaises(MalformedMessage, chunk_record_batch, "s", data, 3)
        self.assertRaises(MalformedMessage, chunk_record_batch, "s", data + b"\x00", 2)

    def test_badFrames(self) -> None:
        """A record's frames whose lengths overrun them are MalformedMessage."""
        data = chunks.encode_chunk([ChunkRow(1, 0.0, "w", "s", b"\x00\x00\x00\x09ab")])
        self.assertRaises(MalformedMessage, chunk_record_batch, "s", data, 1)

    def test_notUtf8(self) -> None:
        """A sender that is not UTF-8 is MalformedMessage."""
        data = bytearray(chunks.encode_chunk([ChunkRow(1, 0.0, "w", "s", b"")]))
        data[17] = 0xFF
        self.assertRaises(MalformedMessage, chunk_record_batch, "s", bytes(data), 1)

    def test_empty(self) -> None:
        """No records: an empty batch of the schema, last 0."""
        batch, last = chunk_record_batch("s", b"", 0)
        self.assertEqual((batch.num_rows, batch.schema, last), (0, ARROW_SCHEMA, 0))
