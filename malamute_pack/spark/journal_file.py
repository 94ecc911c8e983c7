"""
A broker's journal file read directly, offline and read-only (the
``journal`` option): the same ``status``, ``read_range`` and
``read_chunks`` (chunks packed as the broker packs them) as the bulk
client (L{malamute_pack.client.bulk.BulkClient}) answer from the broker,
made from the ``stream_messages`` table (``malamute_pack/journal/schema.py``)
and the ``streams`` table's highest numbers, with the broker's own queries
(:mod:`malamute_pack.journal.reads`).

The file is opened read-only (SQLite ``mode=ro``), so a journal a broker
is using can be read too (WAL readers do not block its writer). As the
broker does, a read that asks for numbers retention already removed gets a
L{RangeGap} for them first, and a pattern is matched here with the
broker's own matching engine. Every record is verified as the broker
verifies it (:mod:`malamute_pack.journal.verify`): a damaged one is never
read as good, and the stretch it leaves is a L{DamagedRange} (a
L{RangeGap} that says why) in its place.

Tests: ``tests/system/test_spark_units.py``, ``tests/system/test_spark.py``,
``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

from malamute_pack.client.bulk import ChunkDecoder, RangeChunk, RangeGap, StreamStatus, range_chunk
from malamute_pack.journal import reads
from malamute_pack.journal.verify import Found, StreamScan
from malamute_pack.matching import Pattern
from malamute_pack.matching.patterns import parse_pattern
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import ChunkRow, encode_chunk

CHUNK_RECORDS: Final = 4096
_SEQ: Final = itemgetter(0)

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class DamagedRange(RangeGap):
    """
    Records C{missed} to C{available - 1} are damaged in the journal file
    (their checksums do not match, or SQLite cannot read them: C{why}):
    not read, reported as a gap.
    """

    why: str = ""


class JournalFileError(Exception):
    """The journal file cannot be read: missing, not a journal, or damaged."""


class JournalFile:
    """One journal file open read-only. Use it in a ``with`` block, or call L{close}."""

    def __init__(self, path: str | Path, *, chunk_records: int = CHUNK_RECORDS) -> None:
        self.path = Path(path)
        self._chunk_records = chunk_records
        if not self.path.is_file():
            raise JournalFileError(f"journal file {self.path} does not exist")
        uri = f"file:{urllib.parse.quote(str(self.path.resolve()))}?mode=ro"
        try:
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            tables = {
                row[0]
                for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as e:
            raise JournalFileError(f"{self.path} is not a readable SQLite file: {e}") from e
        if not {"stream_messages", "streams"} <= tables:
            self._conn.close()
            raise JournalFileError(f"{self.path} is not a malamute journal (no stream_messages)")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JournalFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def streams(self) -> list[str]:
        """Every stream the journal has numbered records for, sorted."""
        return reads.stream_names(self._conn)

    def status(self, stream: str, whence: int = mlm.LATEST, position: int = 0) -> StreamStatus:
        """As L{BulkClient.status}: first retained, last written, and where C{whence} points."""
        conn = self._conn
        first_retained = reads.first_retained(conn, stream)
        last = max(reads.last_retained(conn, stream) or 0, reads.last_assigned(conn, stream) or 0)
        first = first_retained if first_retained is not None else last + 1
        if whence == mlm.EARLIEST:
            found = first
        elif whence == mlm.LATEST:
            found = last + 1
        elif whence == mlm.SEQUENCE:
            found = position
        elif whence == mlm.TIME:
            at = reads.first_at_time(conn, stream, position / 1000.0)
            found = at if at is not None else last + 1
        else:
            raise ValueError(f"whence {whence} is not 0, 1, 2 or 3")
        return StreamStatus(stream, first, last, found)

    def read_range(
        self, stream: str, first: int, last: int, pattern: str = ""
    ) -> Iterator[RangeChunk | RangeGap]:
        """As L{BulkClient.read_range}: the retained records C{first}..C{last}, in chunks."""
        return self.read_chunks(stream, first, last, range_chunk, pattern)

    def read_chunks(
        self, stream: str, first: int, last: int, decode: ChunkDecoder[C], pattern: str = ""
    ) -> Iterator[C | RangeGap]:
        """
        As L{BulkClient.read_chunks}: each chunk packed as the broker packs
        a STREAM_CHUNK, and made by C{decode}.
        """
        status = self.status(stream)
        first, last = max(first, 1), min(last, status.last)
        if first > last:
            return
        if first < status.first:
            yield RangeGap(stream, first, min(status.first, last + 1))
            first = status.first
        matcher = parse_pattern(pattern) if pattern else None
        found = Found()
        scan = StreamScan(self._conn, stream, first, last, found)
        try:
            while block := scan.next_block(self._chunk_records):
                start = 0
                # Stretches it cannot serve, each in its place among the records.
                spans, found.spans = sorted(found.spans), []
                for _, missed, upto, why in spans:
                    cut = bisect_left(block, missed, start, key=_SEQ)
                    yield from self._chunk(stream, block[start:cut], matcher, decode)
                    yield DamagedRange(stream, missed, upto + 1, why)
                    start = bisect_right(block, upto, cut, key=_SEQ)
                yield from self._chunk(stream, block[start:], matcher, decode)
            for _, missed, upto, why in sorted(found.spans):
                yield DamagedRange(stream, missed, upto + 1, why)
        finally:
            scan.close()

    @staticmethod
    def _chunk(
        stream: str,
        block: list[tuple[Any, ...]],
        matcher: Pattern | None,
        decode: ChunkDecoder[C],
    ) -> Iterator[C]:
        rows = [ChunkRow._make(row[:5]) for row in block]
        if matcher is not None:
            rows = [row for row in rows if matcher.matches(row.subject)]
        if rows:
            yield decode(stream, encode_chunk(rows), len(rows))[0]
