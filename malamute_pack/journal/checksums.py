"""
The checksum of every record the journal stores: a CRC-32 (``zlib.crc32``)
over a canonical encoding of the columns that carry its meaning, kept in
the row's ``checksum`` column and checked by every read
(:mod:`malamute_pack.journal.verify`), so that a record damaged on disk is
never served as good.

A stream record's encoding is its text columns (stream, sender, subject,
origin) joined by NUL and encoded as UTF-8, then its numbers packed
big-endian (sequence number and origin sequence number as 8-byte signed
integers, the timestamp as an IEEE double: ``>qdq``), then its content as
stored (the frames' BLOB); a letter's is its text columns (kind, address,
sender, subject, tracker, relay origin), then id, deadline (NaN for
none), creation time and relay id (``>qddq``), then its content. The CRC
runs over each part in turn: ``crc32(content, crc32(numbers,
crc32(text)))``. A CRC finds damage, not tampering (NUL in a name could
shift a field into the next without changing it).

Checksums are computed where rows are written, never in the reactor
thread: the writer thread (:mod:`malamute_pack.journal.writer`) and its
insert process (:mod:`malamute_pack.journal.inserts`), and a pair's
passive computes its own as it applies what its active shipped. Rows
written before the checksums came (schema migration 10) have NULL: they
cannot be verified, and are served as they are.

Column-wise, with builtins mapped over whole batches: no Python statement
runs per record. The standard library alone: the insert process
(``python -I -S inserts.py``) loads this file by its path.

Tests: ``tests/unit/test_journal_damage.py``, ``tests/unit/test_journal_inserts.py``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat, starmap
from operator import add, eq, itemgetter
from typing import Any, Final
from zlib import crc32

# A record's text columns, NUL between them, as UTF-8; its numbers packed.
_JOIN: Final = "\x00".join
# Sequence number, timestamp (an IEEE double), origin sequence number.
_STREAM_NUMBERS: Final = struct.Struct(">qdq").pack
# Id, deadline (NaN for none), creation time, relay id.
_LETTER_NUMBERS: Final = struct.Struct(">qddq").pack
_NO_DEADLINE: Final = math.nan
_UTF8: Final = "utf-8"
# Text SQLite never stores (a lone surrogate) still has a checksum: the
# record is refused by SQLite, not by its checksum.
_SURROGATES: Final = "surrogatepass"
# What computing a checksum raises for columns of the wrong types (damage).
CHECKSUM_ERRORS: Final = (TypeError, ValueError, OverflowError, struct.error)


def _encoded(texts: Iterable[str]) -> Iterator[bytes]:
    return map(str.encode, texts, repeat(_UTF8), repeat(_SURROGATES))


# A stream row's (records.StreamRow) text columns, numbers and content.
_ROW_TEXTS: Final = itemgetter(0, 3, 4, 7)
_ROW_NUMBERS: Final = itemgetter(1, 2, 8)
_ROW_CONTENT: Final = itemgetter(5)


def stream_checksums(
    streams: Iterable[Any],
    seqs: Iterable[Any],
    stamps: Iterable[Any],
    senders: Iterable[Any],
    subjects: Iterable[Any],
    contents: Iterable[Any],
    origins: Iterable[Any],
    origin_seqs: Iterable[Any],
) -> Iterator[int]:
    """
    The checksums of stream records given column by column (as written or
    as read). Lazy: iterating raises one of L{CHECKSUM_ERRORS} for a column
    of the wrong type.
    """
    # Not strict: a read gives its one stream as itertools.repeat.
    texts = _encoded(map(_JOIN, zip(streams, senders, subjects, origins, strict=False)))
    heads = map(crc32, map(_STREAM_NUMBERS, seqs, stamps, origin_seqs), map(crc32, texts))
    return map(crc32, contents, heads)


def row_checksums(rows: Sequence[tuple[Any, ...]]) -> list[int | None]:
    """
    The checksums of stream rows as the writer inserts them (stream, seq,
    timestamp, sender, subject, content, bytes, origin, origin_seq): what
    L{stream_checksums} gives for their columns, picked from each row in C.
    A row whose values are not a record's types gets None (SQLite refuses
    it alone, with its own reason).
    """
    try:
        names = list(map(_ROW_TEXTS, rows))
        texts = _text_checksums(names)
        heads = map(crc32, starmap(_STREAM_NUMBERS, map(_ROW_NUMBERS, rows)), map(texts, names))
        return list(map(crc32, map(_ROW_CONTENT, rows), heads))
    except CHECKSUM_ERRORS:  # a value of the wrong type: row by row
        return [_row_checksum(row) for row in rows]


def _text_checksums(names: list[tuple[Any, ...]]) -> Callable[[tuple[Any, ...]], int]:
    """
    The CRC of each distinct tuple of text columns of C{names}, as a lookup:
    a batch's records share a stream, a writer and a few subjects, so each
    is encoded and summed once, not once per record.
    """
    return {key: crc32(_JOIN(key).encode(_UTF8, _SURROGATES)) for key in set(names)}.__getitem__


# A read's row (verify.SCAN_COLUMNS: seq, ts, sender, subject, content,
# origin, origin_seq, checksum) of a stream it knows.
_SCAN_TEXTS: Final = itemgetter(2, 3, 5)
_SCAN_NUMBERS: Final = itemgetter(0, 1, 6)
_SCAN_CONTENT: Final = itemgetter(4)
_SCAN_SUMS: Final = itemgetter(7)


def scan_block_matches(stream: str, block: Sequence[tuple[Any, ...]]) -> bool:
    """
    Whether every row of a read's C{block} of C{stream} (seq, ts, sender,
    subject, content, origin, origin_seq, checksum) has the checksum its
    columns give: the fast check, with no Python statement per row; False
    for a block with any other row (a damaged one, one without a checksum,
    a value of the wrong type), which the reader then checks row by row.
    """
    try:
        names = list(map(_SCAN_TEXTS, block))
        texts = {key: crc32(_JOIN((stream, *key)).encode(_UTF8, _SURROGATES)) for key in set(names)}
        heads = map(
            crc32,
            starmap(_STREAM_NUMBERS, map(_SCAN_NUMBERS, block)),
            map(texts.__getitem__, names),
        )
        computed = map(crc32, map(_SCAN_CONTENT, block), heads)
        return all(map(eq, computed, map(_SCAN_SUMS, block)))
    except CHECKSUM_ERRORS:
        return False


def _row_checksum(row: tuple[Any, ...]) -> int | None:
    """
    One row's checksum; None for a row whose values are not a record's
    types (SQLite refuses it, with its own reason).
    """
    stream, seq, stamp, sender, subject, content, _, origin, origin_seq = row
    columns = (stream, seq, stamp, sender, subject, content, origin, origin_seq)
    try:
        (checksum,) = stream_checksums(*((value,) for value in columns))
    except CHECKSUM_ERRORS:
        return None
    return checksum


def with_checksums(rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Stream rows with their checksum added as a last column (the INSERT's)."""
    return list(map(add, rows, zip(row_checksums(rows))))


def letter_checksum(row: Sequence[Any]) -> int:
    """
    The checksum of a letter's row (id, kind, address, sender, subject,
    tracker, deadline, created, content, relay_origin, relay_id), as
    written or as read. Raises one of L{CHECKSUM_ERRORS} for a column of
    the wrong type.
    """
    rid, kind, address, sender, subject, tracker, deadline, created, content, origin, relay = row
    text = _JOIN((kind, address, sender, subject, tracker, origin)).encode(_UTF8, _SURROGATES)
    when = _NO_DEADLINE if deadline is None else deadline
    numbers = _LETTER_NUMBERS(rid, when, created, relay)
    return crc32(content, crc32(numbers, crc32(text)))
