"""
Verified reads: every record a read hands out has the checksum it was
written with (:mod:`malamute_pack.journal.checksums`), and a record whose
checksum does not match, whose columns cannot be decoded, or that SQLite
cannot read at all (a malformed page) is left out and reported as damaged
(:class:`Found`), never served as good.

:class:`StreamScan` reads a stream's records in sequence order a block at a
time. Each block is checked with builtins mapped over its columns (no
Python statement per record while every checksum matches). A record that
fails opens a damaged stretch, which the next good record closes: the
stretch is every number between the two good records around it (the
record's own number may be what was damaged). Where SQLite fails, the scan
goes on row by row, finds the next readable number by bisection over the
stream's index (:func:`~malamute_pack.journal.scan.next_readable`) and
reports what it stepped over. A stretch still open at the end reaches the
stream's last record that the file shows.

A row written before checksums were kept (NULL) cannot be verified: it is
served if its columns have the types and bounds a record has.

Letters (:func:`verified_letters`) are checked one by one (a letter is read
at recovery, or by id for a pair's partner), and a letter that fails is
reported by its id.

Tests: ``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter, lt
from typing import Any, Final

from malamute_pack.journal.checksums import (
    CHECKSUM_ERRORS,
    letter_checksum,
    scan_block_matches,
    stream_checksums,
)
from malamute_pack.journal.scan import (
    DAMAGE_ERRORS,
    MAX_KEY,
    RowidScan,
    Unreadable,
    describe,
    next_readable,
)
from malamute_pack.protocol.chunks import decode_frames

CHECKSUM_MISMATCH: Final = "checksum mismatch"

# The columns every stream scan reads, in this order (StreamScan rows).
SCAN_COLUMNS: Final = "seq, ts, sender, subject, content, origin, origin_seq, checksum"
_SCAN: Final = (
    f"SELECT {SCAN_COLUMNS} FROM stream_messages "
    "WHERE stream = ? AND seq > ? AND seq <= ? ORDER BY seq"
)
_ONE: Final = _SCAN + " LIMIT 1"
# From the stream's index alone (a covering index: no record is read).
_KEY_FROM: Final = (
    "SELECT seq FROM stream_messages WHERE stream = ? AND seq >= ? AND seq <= ? "
    "ORDER BY seq LIMIT 1"
)
_LAST_KEY: Final = "SELECT max(seq) FROM stream_messages WHERE stream = ? AND seq <= ?"
_LAST_ASSIGNED: Final = "SELECT last_seq FROM streams WHERE stream = ?"
_OUT_OF_ORDER: Final = "sequence numbers out of order (a damaged index)"
_SEQ: Final = itemgetter(0)
# A record's timestamp in microseconds must fit a chunk's 8 bytes.
_MAX_MICROS: Final = 1 << 64
_MAX_NAME: Final = 255


@dataclass(slots=True)
class Found:
    """
    The damage one read found, gathered in the reader thread for the journal
    (:mod:`malamute_pack.journal.damage`): per stream the stretches of
    numbers it could not serve (stream, first, last, why) and the numbers of
    the damaged records it met; the letters that failed (id, why) and the
    stretches of letter ids it could not read (after, before, why).
    """

    spans: list[tuple[str, int, int, str]] = field(default_factory=list)
    records: list[tuple[str, int]] = field(default_factory=list)
    letters: list[tuple[int, str]] = field(default_factory=list)
    letter_stretches: list[tuple[int, int, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.spans or self.records or self.letters or self.letter_stretches)


def _sane_text(value: object) -> bool:
    return isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) <= _MAX_NAME


def sane_record(row: Sequence[Any]) -> bool:
    """
    Whether a scan row (L{SCAN_COLUMNS}) without a checksum has the types
    and bounds a record has (it can be served: it cannot be verified).
    """
    seq, ts, sender, subject, content, origin, origin_seq = row[:7]
    if not (isinstance(seq, int) and 0 < seq <= MAX_KEY):
        return False
    if not (isinstance(ts, float) and math.isfinite(ts) and 0 <= ts * 1e6 < _MAX_MICROS):
        return False
    if not (_sane_text(sender) and _sane_text(subject) and isinstance(origin, str)):
        return False
    if not (isinstance(origin_seq, int) and isinstance(content, bytes)):
        return False
    try:
        decode_frames(content)
    except ValueError:
        return False
    return True


def _rising(block: list[tuple[Any, ...]], after: int) -> list[tuple[Any, ...]]:
    """The rows of C{block} up to the first whose number does not rise (all, in a sound index)."""
    seqs = list(map(_SEQ, block))
    try:
        if seqs[0] > after and all(map(lt, seqs, seqs[1:])):
            return block  # a sound index: no Python statement per row
    except TypeError:  # a number of another type
        pass
    for i, row in enumerate(block):
        seq = row[0]
        if not isinstance(seq, int) or seq <= after:
            return block[:i]
        after = seq
    return block


def _checks(stream: str, block: Sequence[tuple[Any, ...]]) -> list[bool] | None:
    """Per row of C{block}, whether its checksum matches; None if all of them do."""
    if scan_block_matches(stream, block):
        return None
    matches = [_row_matches(stream, row) for row in block]
    return None if all(matches) else matches


def _row_matches(stream: str, row: tuple[Any, ...]) -> bool:
    seq, ts, sender, subject, content, origin, oseq, checksum = row
    try:
        computed = stream_checksums(
            (stream,), (seq,), (ts,), (sender,), (subject,), (content,), (origin,), (oseq,)
        )
        return bool(next(computed) == checksum)
    except CHECKSUM_ERRORS:
        return False


def record_good(stream: str, row: tuple[Any, ...]) -> bool:
    """Whether one scan row (L{SCAN_COLUMNS}) of C{stream} can be served as it is."""
    if row[7] is None:
        return sane_record(row)
    return _row_matches(stream, row)


class StreamScan:
    """
    The verified records of C{stream} from C{first} to C{last} (rows of
    L{SCAN_COLUMNS}), in order, a block at a time (L{next_block}); the
    damage met goes to C{found}.
    """

    def __init__(
        self, conn: sqlite3.Connection, stream: str, first: int, last: int, found: Found
    ) -> None:
        self._conn = conn
        self.stream = stream
        self.last = min(last, MAX_KEY)
        self.found = found
        # The last number read (good or not), the last good one, and
        # whether a damaged stretch is open after it (and why).
        self.after = max(first, 1) - 1
        self.good = self.after
        self._open: str | None = None
        self._cursor: sqlite3.Cursor | None = None
        self.done = self.after >= self.last

    def next_block(self, size: int) -> list[tuple[Any, ...]]:
        """
        The next good records, at least one unless the scan is L{done}; at
        most about C{size} (fewer when records fail).
        """
        while not self.done:
            try:
                if self._cursor is None:
                    self._cursor = self._conn.execute(_SCAN, (self.stream, self.after, self.last))
                block = self._cursor.fetchmany(size)
            except DAMAGE_ERRORS:
                block = None
            if block is not None:
                if not block:
                    self._finish()
                    break
                rows = _rising(block, self.after)
                if rows:
                    self.after = rows[-1][0]
                    good = self._verify(rows)
                    if len(rows) == len(block):
                        if good:
                            return good
                        continue
                    if good:  # the rest from the next read on
                        self._cursor = None
                        return good
            # SQLite failed, or the numbers went back (a damaged index).
            self._cursor = None
            good = self._careful()
            if good:
                return good
        return []

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None

    def _verify(self, block: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        matches = _checks(self.stream, block)
        if matches is None:  # the common case: every record is good
            if self._open is not None:
                self._close(block[0][0] - 1)
            self.good = block[-1][0]
            return block
        good: list[tuple[Any, ...]] = []
        for row, match in zip(block, matches, strict=True):
            if match or (row[7] is None and sane_record(row)):
                if self._open is not None:
                    self._close(row[0] - 1)
                self.good = row[0]
                good.append(row)
            else:
                self.found.records.append((self.stream, row[0]))
                self._open = self._open or CHECKSUM_MISMATCH
        return good

    def _careful(self) -> list[tuple[Any, ...]]:
        """
        After a block SQLite failed to read: row by row until a good record
        (returned: the scan goes on in blocks after it) or the end.
        """
        conn, stream = self._conn, self.stream
        while self.after < self.last:
            try:
                row = conn.execute(_ONE, (stream, self.after, self.last)).fetchone()
                if row is not None and not (isinstance(row[0], int) and row[0] > self.after):
                    raise sqlite3.DatabaseError(_OUT_OF_ORDER)
            except DAMAGE_ERRORS as exc:
                self._open = self._open or describe(exc)
                self._step_over()
                continue
            if row is None:
                break
            self.after = row[0]
            good = self._verify([row])
            if good:
                return good
        self._finish()
        return []

    def _step_over(self) -> None:
        """The record after L{after} cannot be read: go on after it, or past what cannot be."""
        stream, last = self.stream, self.last

        def probe(key: int) -> int | None:
            found = self._conn.execute(_KEY_FROM, (stream, key, last)).fetchone()
            if found is None:
                return None
            if not isinstance(found[0], int) or found[0] < key:
                raise sqlite3.DatabaseError(_OUT_OF_ORDER)
            return int(found[0])

        try:
            key = probe(self.after + 1)
        except DAMAGE_ERRORS:
            skipped = next_readable(probe, self.after + 2, last)
            if skipped is None or skipped[1] is None:  # nothing readable up to the end
                self.after = self.last
                self._finish()
                return
            self.after = skipped[1] - 1  # read that record next
            return
        if key is None:
            self.after = self.last
            self._finish()
            return
        self.found.records.append((stream, key))
        self.after = key

    def _finish(self) -> None:
        """The scan is over: a stretch still open reaches the last record the file shows."""
        self.done = True
        if self._open is None:
            return
        self._close(max(self.after, self._last_shown()))

    def _last_shown(self) -> int:
        conn, stream = self._conn, self.stream
        for query, parameters in ((_LAST_KEY, (stream, self.last)), (_LAST_ASSIGNED, (stream,))):
            try:
                row = conn.execute(query, parameters).fetchone()
            except DAMAGE_ERRORS:
                continue
            if row is not None and isinstance(row[0], int):
                return min(int(row[0]), self.last)
        return self.after

    def _close(self, upto: int) -> None:
        why, self._open = self._open, None
        if upto > self.good and why is not None:
            self.found.spans.append((self.stream, self.good + 1, upto, why))


def scan_all(
    conn: sqlite3.Connection, stream: str, first: int, last: int, found: Found, limit: int
) -> list[tuple[Any, ...]]:
    """Up to C{limit} verified records of C{stream} from C{first} to C{last} (L{StreamScan})."""
    scan = StreamScan(conn, stream, first, last, found)
    rows: list[tuple[Any, ...]] = []
    try:
        while len(rows) < limit and not scan.done:
            rows += scan.next_block(min(limit - len(rows), 1024))
    finally:
        scan.close()
    return rows[:limit]


# Letters.


def letter_good(row: Sequence[Any]) -> bool:
    """
    Whether a letter's row (its columns, then its checksum) is as written:
    its checksum matches, or it has none (written before checksums) and
    its content decodes.
    """
    checksum = row[-1]
    try:
        if checksum is None:
            decode_frames(row[8])
            return True
        return bool(letter_checksum(row[:-1]) == checksum)
    except (*CHECKSUM_ERRORS, IndexError):
        return False


def verified_letters(
    rows: Iterable[tuple[Any, ...]], found: Found, make: Callable[[tuple[Any, ...]], Any]
) -> list[Any]:
    """C{make} of each good letter row of C{rows}; the others go to C{found} by id."""
    made: list[Any] = []
    for row in rows:
        if letter_good(row):
            try:
                made.append(make(row[:-1]))
                continue
            except (TypeError, ValueError):
                pass
        found.letters.append((int(row[0]), CHECKSUM_MISMATCH))
    return made


def scan_letters(
    conn: sqlite3.Connection, columns: str, found: Found, make: Callable[[tuple[Any, ...]], Any]
) -> list[Any]:
    """
    Every good letter of the file (C{columns} then the checksum, selected
    by id), stepping over what cannot be read (to C{found}).
    """
    made: list[Any] = []
    for item in RowidScan(conn, "queued_messages", f"{columns}, checksum"):
        if isinstance(item, Unreadable):
            if item.before - item.after == 2:
                found.letters.append((item.after + 1, item.why))
            else:
                found.letter_stretches.append((item.after, item.before, item.why))
            continue
        made += verified_letters([item[1:]], found, make)
    return made
