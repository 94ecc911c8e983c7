"""
Tests for L{malamute_pack.protocol.rowblock}: a run of stream records
packed by column, as the pair link carries an append's records.
"""

from __future__ import annotations

import struct

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.records import stream_row
from malamute_pack.protocol.records import StreamRow
from malamute_pack.protocol.rowblock import decode_rows, encode_rows

U64_MAX = 2**64 - 1
NOT_UTF8 = b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")

ROWS: list[StreamRow] = [
    stream_row("weather", 7, 1700000000.25, "station-1", "temp.paris", [b"21.5"]),
    stream_row("weather", 8, 1700000000.5, "station-1", "temp.lyon", [b"", b"\x00" * 3]),
    stream_row("weather", U64_MAX, 0.0, NOT_UTF8, "", [], origin="pack-b", origin_seq=42),
]


class RoundTripTests(SynchronousTestCase):
    """What L{encode_rows} packs, L{decode_rows} gives back."""

    def test_rows(self) -> None:
        """Rows with shared and distinct texts, odd text and empty contents round-trip."""
        self.assertEqual(decode_rows(encode_rows(ROWS)), ROWS)

    def test_oneRow(self) -> None:
        """A single row round-trips."""
        self.assertEqual(decode_rows(encode_rows(ROWS[:1])), ROWS[:1])

    def test_noRows(self) -> None:
        """No rows are the count and four empty text columns."""
        self.assertEqual(encode_rows([]), bytes(20))
        self.assertEqual(decode_rows(bytes(20)), [])

    def test_layout(self) -> None:
        """
        Two rows: the count, the five columns of numbers, the text columns
        (a shared one as its value alone, a varying one with an index per
        row), then the contents.
        """
        rows: list[StreamRow] = [
            ("s", 1, 0.5, "u", "a", b"xy", 2, "", 0),
            ("s", 2, 1.0, "u", "b", b"z", 1, "", 9),
        ]
        self.assertEqual(
            encode_rows(rows),
            bytes.fromhex(
                "00000002"
                "0000000000000001 0000000000000002"  # seq
                "3fe0000000000000 3ff0000000000000"  # timestamp
                "0000000000000000 0000000000000009"  # origin_seq
                "0000000000000002 0000000000000001"  # size
                "0000000000000002 0000000000000001"  # content lengths
                "00000001 00000001 73"  # stream "s"
                "00000001 00000001 75"  # sender "u"
                "00000002 00000001 61 00000001 62 00000000 00000001"  # subject "a", "b"
                "00000001 00000000"  # origin ""
                "7879 7a"  # contents
            ),
        )

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(["s", "t", NOT_UTF8]),
                st.integers(0, U64_MAX),
                st.floats(allow_nan=False),
                st.text(max_size=5),
                st.sampled_from(["", "a", "b"]),
                st.lists(st.binary(max_size=8), max_size=3),
                st.text(max_size=3),
                st.integers(0, U64_MAX),
            ),
            max_size=6,
        )
    )
    def test_anyRows(
        self, specs: list[tuple[str, int, float, str, str, list[bytes], str, int]]
    ) -> None:
        """Any rows (any texts, numbers, contents) round-trip."""
        rows = [
            stream_row(s, q, t, u, j, c, origin=o, origin_seq=n) for s, q, t, u, j, c, o, n in specs
        ]
        self.assertEqual(decode_rows(encode_rows(rows)), rows)


class MalformedTests(SynchronousTestCase):
    """What is not a block raises ValueError."""

    def test_truncatedEveryLength(self) -> None:
        """A block cut short at any length does not decode."""
        block = encode_rows(ROWS)
        for cut in range(len(block)):
            self.assertRaises(ValueError, decode_rows, block[:cut])

    def test_trailingBytes(self) -> None:
        """Bytes after the last content do not decode."""
        self.assertRaises(ValueError, decode_rows, encode_rows(ROWS) + b"\x00")

    def test_sizeNotLength(self) -> None:
        """A row whose size is not its content's length does not decode."""
        stream, seq, ts, sender, subject, blob, size, origin, origin_seq = ROWS[0]
        for wrong in (size - 1, size + 1, 0, U64_MAX):
            bad: StreamRow = (stream, seq, ts, sender, subject, blob, wrong, origin, origin_seq)
            self.assertRaises(ValueError, decode_rows, encode_rows([bad, ROWS[1]]))

    def test_countOverruns(self) -> None:
        """A count of rows larger than the block holds does not decode."""
        block = encode_rows(ROWS)
        for count in (4, 0xFFFFFFFF):
            self.assertRaises(ValueError, decode_rows, struct.pack(">I", count) + block[4:])

    def test_textColumnCounts(self) -> None:
        """
        A text column with no value for rows, a value for no rows, or more
        values than rows does not decode.
        """
        one = encode_rows(ROWS[:1])
        stream_at = 4 + 40  # after the count and one row's numbers
        self.assertRaises(
            ValueError, decode_rows, one[:stream_at] + bytes(4) + one[stream_at + 4 :]
        )
        self.assertRaises(
            ValueError,
            decode_rows,
            one[:stream_at] + struct.pack(">I", 2) + one[stream_at + 4 :],
        )
        self.assertRaises(ValueError, decode_rows, bytes(4) + struct.pack(">I", 1) + bytes(12))

    def test_indexPastValues(self) -> None:
        """A row's text index past its column's values does not decode."""
        rows: list[StreamRow] = [
            ("s", 1, 0.0, "u", "a", b"", 0, "", 0),
            ("s", 2, 0.0, "u", "b", b"", 0, "", 0),
        ]
        block = encode_rows(rows)
        # The subject's last index, before the origin column (one value, "").
        at = len(block) - 8 - 4
        self.assertEqual(block[at:], bytes.fromhex("00000001 00000001 00000000"))
        for index in (2, 0xFFFFFFFF):
            patched = block[:at] + struct.pack(">I", index) + block[at + 4 :]
            self.assertRaises(ValueError, decode_rows, patched)
