"""
A run of stream records (L{StreamRow}s) packed by column, as the pair link
(:mod:`malamute_pack.protocol.pair`, version 3) carries an idempotent
append's records: one byte string whose parts C{struct} packs and unpacks
whole, so that neither end runs Python code per record (the rows are
rebuilt by C{zip}, their contents cut by C{map}).

The layout, numbers big-endian as everywhere in the link:

- the count of rows, n (4 bytes);
- the columns of numbers, n of each: sequence numbers (8 bytes), timestamps
  (doubles), origin sequence numbers (8 bytes), sizes (the journal's
  C{bytes} field, 8 bytes) and the contents' lengths (8 bytes; a row whose
  size is not its content's length does not decode);
- the columns of texts, each its distinct values in order of first use (a
  4-byte count k, then each as a 4-byte length and UTF-8, bytes that are
  not UTF-8 carried with C{surrogateescape}) and, when k > 1, each row's
  value as an index (4 bytes each): stream, sender, subject, origin;
- the contents, one after the other, to the end.

n = 0 is the count and four empty text columns. L{decode_rows} raises
ValueError for anything else that is not such a block.

Tests: ``tests/unit/test_protocol_rowblock.py``, ``tests/unit/test_protocol_pair.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, islice, repeat
from typing import Final

from malamute_pack.protocol.records import StreamRow

_COUNT: Final = struct.Struct(">I")
# The bytes per row of the number columns: four 8-byte numbers and a double.
_NUMBERS_PER_ROW: Final = 40
_EMPTY: Final = _COUNT.pack(0) * 5


def _text_column(values: Sequence[str], n: int) -> list[bytes]:
    """A column of texts: its distinct values, then (if several) each row's index."""
    distinct = dict.fromkeys(values)
    parts = [_COUNT.pack(len(distinct))]
    for value in distinct:
        raw = value.encode("utf-8", "surrogateescape")
        parts += (_COUNT.pack(len(raw)), raw)
    if len(distinct) > 1:
        index = {value: i for i, value in enumerate(distinct)}
        parts.append(struct.pack(f">{n}I", *map(index.__getitem__, values)))
    return parts


def encode_rows(rows: Sequence[StreamRow]) -> bytes:
    """C{rows} as a block; struct.error for a number out of range."""
    n = len(rows)
    if not n:
        return _EMPTY
    streams, seqs, stamps, senders, subjects, contents, sizes, origins, origin_seqs = zip(
        *rows, strict=True
    )
    q = f">{n}Q"
    parts = [
        _COUNT.pack(n),
        struct.pack(q, *seqs),
        struct.pack(f">{n}d", *stamps),
        struct.pack(q, *origin_seqs),
        struct.pack(q, *sizes),
        struct.pack(q, *map(len, contents)),
    ]
    for column in (streams, senders, subjects, origins):
        parts += _text_column(column, n)
    parts += contents
    return b"".join(parts)


def _read_texts(block: bytes, at: int, n: int) -> tuple[Iterable[str], int]:
    """The text column of C{n} rows at C{at} of C{block}, and where it ends."""
    end = len(block)
    if at + 4 > end:
        raise ValueError("no text column")
    k = _COUNT.unpack_from(block, at)[0]
    at += 4
    if (k == 0) != (n == 0) or k > n:
        raise ValueError(f"a text column of {k} values for {n} rows")
    table: list[str] = []
    for _ in range(k):
        if at + 4 > end:
            raise ValueError("a text runs past the end")
        size = _COUNT.unpack_from(block, at)[0]
        at += 4
        if at + size > end:
            raise ValueError("a text runs past the end")
        table.append(block[at : at + size].decode("utf-8", "surrogateescape"))
        at += size
    if k <= 1:
        return repeat(table[0] if table else "", n), at
    if at + 4 * n > end:
        raise ValueError("a text column's indexes run past the end")
    indexes = struct.unpack_from(f">{n}I", block, at)
    if max(indexes) >= k:
        raise ValueError(f"a text index past the column's {k} values")
    return map(table.__getitem__, indexes), at + 4 * n


def decode_rows(block: bytes) -> list[StreamRow]:
    """The rows L{encode_rows} made C{block} from; ValueError if it is not such a block."""
    if len(block) < 4:
        raise ValueError("no count of rows")
    n = _COUNT.unpack_from(block, 0)[0]
    at = 4
    if n * _NUMBERS_PER_ROW > len(block) - at:
        raise ValueError(f"{n} rows overrun the {len(block) - at} bytes left")
    q = f">{n}Q"
    step = 8 * n
    seqs = struct.unpack_from(q, block, at)
    stamps = struct.unpack_from(f">{n}d", block, at + step)
    origin_seqs = struct.unpack_from(q, block, at + 2 * step)
    sizes = struct.unpack_from(q, block, at + 3 * step)
    lengths = struct.unpack_from(q, block, at + 4 * step)
    at += 5 * step
    if sizes != lengths:
        raise ValueError("a row's size is not its content's length")
    columns: list[Iterable[str]] = []
    for _ in range(4):
        column, at = _read_texts(block, at, n)
        columns.append(column)
    streams, senders, subjects, origins = columns
    ends = list(accumulate(lengths, initial=at))
    if ends[-1] != len(block):
        raise ValueError(f"contents of {ends[-1] - at} bytes, {len(block) - at} given")
    contents: Iterator[bytes] = map(block.__getitem__, map(slice, ends, islice(ends, 1, None)))
    return list(
        zip(
            streams,
            seqs,
            stamps,
            senders,
            subjects,
            contents,
            sizes,
            origins,
            origin_seqs,
            strict=True,
        )
    )
