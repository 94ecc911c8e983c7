"""
Salvaging a damaged journal file (:mod:`malamute_pack.journal.checking`
found it damaged, or SQLite failed on it as it opened): a fresh journal
with the same identity, holding every row of the damaged one that can be
read and verifies, and a report of exactly what could not be saved.

1. A new file is built beside the journal (``journal.sqlite.salvaging``),
   made by the schema's migrations, while the damaged file is read
   read-only (its WAL too: frames committed before a kill -9 are saved).
2. Each table is read by its rowid, stepping over what SQLite cannot read
   (:class:`~malamute_pack.journal.scan.RowidScan`); a stream record or a
   letter is copied only if its checksum matches (one written before
   checksums, if its columns are a record's), the other tables' rows if
   their types are the table's.
3. What was lost is found by the keys: each stream's records the stream's
   index still lists (or the stretches of it that cannot be read) and
   that were not copied, the numbers between the records saved around
   each record that could not be (records are written in the order of
   their numbers, so the rowid order tells), less the numbers the stream
   skipped (``stream_skips``: never given to a record), and the letters
   by id. The lost stretches go into
   ``journal_losses``, so that every read of them tells its reader of a
   gap (:mod:`malamute_pack.journal.damage`), and a pair's catch-up fills
   them from the partner (:mod:`malamute_pack.pair.replication`).
4. No number is given twice: each stream's high-water mark is the largest
   of what the damaged ``streams`` table said and what its records and
   index show, the letters' the largest id seen or counted, and the new
   file is marked as after a crash, so that numbering jumps
   ``crash_skip`` past them when it opens. If some streams' names could
   not be read at all, every stream the journal does not know starts past
   the highest number seen (or that the journal's ``streams_numbered``
   counter says it gave), plus ``crash_skip`` (``stream_floor``).
5. The last-value streams' latest records are found again from the records
   saved.
6. Only then are the files renamed: the damaged one (with its ``-wal`` and
   ``-shm``) to ``journal.sqlite.damaged-<UTC time>`` beside it, kept, and
   the new one to the journal's name. A salvage cut short by a crash is
   done again, or its last rename finished (:func:`finish_interrupted`).

Tests: ``tests/unit/test_journal_damage.py``, ``tests/system/test_journal_damage.py``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, suppress
from dataclasses import dataclass, field
from operator import eq
from pathlib import Path
from typing import Any, Final

from malamute_pack.journal.checking import read_only
from malamute_pack.journal.checksums import CHECKSUM_ERRORS, stream_checksums
from malamute_pack.journal.scan import (
    DAMAGE_ERRORS,
    MAX_KEY,
    RowidScan,
    Unreadable,
    next_readable,
)
from malamute_pack.journal.schema import (
    ADD_SKIP,
    QUEUED_LAST_ID,
    RUNNING,
    STREAM_FLOOR,
    STREAMS_NUMBERED,
    migrate,
)
from malamute_pack.journal.verify import letter_good, sane_record
from malamute_pack.text import plural

BUILDING: Final = ".salvaging"
# A copy of a file cut short, made whole to be read (removed after).
_COPY: Final = ".salvage-source"
_HEADER: Final = 100
# Pages a header may count that a whole copy is made up to, at most (the
# in-header count of a damaged header can be anything: 64 GiB of 16 KiB pages).
_MOST_PAGES: Final = 1 << 22
DAMAGED: Final = ".damaged-"
_SIDES: Final = ("-wal", "-shm")
_BLOCK: Final = 512
_LAST_VALUE: Final = "subject"

# Per table, its columns as the current schema has them, and each one's
# value for a row of a file older than it.
_TABLES: Final[dict[str, tuple[tuple[str, Any], ...]]] = {
    "stream_appends": (
        ("stream", None),
        ("key", None),
        ("first_seq", None),
        ("last_seq", None),
        ("created", None),
    ),
    "stream_consumers": (
        ("stream", None),
        ("kind", None),
        ("name", None),
        ("seq", None),
        ("acked", b""),
        ("updated", 0.0),
        ("owner", ""),
    ),
    "address_owners": (("address", None), ("user", None), ("claimed", None)),
    "pair_state": (("name", None), ("value", None)),
    "journal_losses": (
        ("stream", None),
        ("first_seq", None),
        ("last_seq", None),
        ("found", None),
        ("reason", None),
    ),
}
_RECORD_COLUMNS: Final = (
    ("stream", None),
    ("seq", None),
    ("ts", None),
    ("sender", None),
    ("subject", None),
    ("content", None),
    ("origin", ""),
    ("origin_seq", 0),
    ("checksum", None),
)
_LETTER_COLUMNS: Final = (
    ("id", None),
    ("kind", None),
    ("address", None),
    ("sender", None),
    ("subject", None),
    ("tracker", None),
    ("deadline", None),
    ("created", None),
    ("content", None),
    ("relay_origin", ""),
    ("relay_id", 0),
    ("checksum", None),
)
_INSERT_RECORD: Final = (
    "INSERT OR IGNORE INTO stream_messages (stream, seq, ts, sender, subject, content, bytes,"
    " origin, origin_seq, checksum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_NAME_AFTER: Final = "SELECT stream FROM stream_messages WHERE stream > ? ORDER BY stream LIMIT 1"
_KEYS_AFTER: Final = (
    "SELECT seq FROM stream_messages WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?"
)
# The whole index, walked in its order (SQLite reads it alone: it covers both).
_ALL_KEYS: Final = "SELECT stream, seq FROM stream_messages ORDER BY stream, seq"
_KEY_FROM: Final = (
    "SELECT seq FROM stream_messages WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT 1"
)

# Per other table, how many of its first columns are its key.
_KEY_COLUMNS: Final = {
    "stream_appends": 2,
    "stream_consumers": 3,
    "address_owners": 1,
    "pair_state": 1,
    "journal_losses": 2,
}
# What the log calls their rows.
_NAMES: Final = {
    "stream_appends": "append keys (stream, key)",
    "stream_consumers": "consumer positions (stream, kind, name)",
    "address_owners": "owners of addresses",
    "pair_state": "pair state values",
    "journal_losses": "earlier losses (stream, first)",
}

Runs = list[list[int]]  # sorted disjoint [first, last] runs
# What the new file refuses of a row whose values are not the table's types.
_REFUSED: Final = (sqlite3.IntegrityError, sqlite3.InterfaceError, OverflowError, ValueError)


@dataclass(slots=True)
class Salvage:
    """
    What a salvage of a damaged journal did: why it ran, where the damaged
    file went, the rows it copied per table, and what it could not save:
    per stream the stretches of records, the letters by id (and stretches
    of ids it could not read), the other tables' rows it could not read or
    verify, whether some streams' names were lost (then ``floor``: where a
    stream it does not know starts after).
    """

    reason: str
    aside: Path
    copied: dict[str, int] = field(default_factory=dict)
    lost: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    letters: list[int] = field(default_factory=list)
    letter_stretches: list[tuple[int, int]] = field(default_factory=list)
    unreadable: dict[str, int] = field(default_factory=dict)
    # Per other table, the keys of the rows lost that its index still lists.
    lost_rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=dict)
    streams_unknown: bool = False
    floor: int = 0

    def report(self) -> list[str]:
        """What it lost, line by line, for the log."""
        lines: list[str] = []
        for stream, stretches in sorted(self.lost.items()):
            shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in stretches[:20])
            more = f" and {len(stretches) - 20} more stretches" if len(stretches) > 20 else ""
            count = plural(sum(b - a + 1 for a, b in stretches), "number")
            lines.append(f"stream {stream!r}: records {shown}{more} lost (up to {count})")
        if self.letters:
            ids = ", ".join(map(str, self.letters[:50]))
            more = f" and {len(self.letters) - 50} more" if len(self.letters) > 50 else ""
            lines.append(f"letters lost (damaged): ids {ids}{more}")
        for first, last in self.letter_stretches:
            lines.append(f"letters lost (unreadable): any with ids {first}-{last}")
        for table, rows in sorted(self.unreadable.items()):
            lines.append(f"{table}: {plural(rows, 'row')} (or unreadable stretches) not saved")
        for table, keys in sorted(self.lost_rows.items()):
            shown = ", ".join(map(repr, keys[:20]))
            more = f" and {len(keys) - 20} more" if len(keys) > 20 else ""
            lines.append(f"{_NAMES.get(table, table)} lost: {shown}{more}")
        if self.streams_unknown:
            lines.append(
                "some streams' names could not be read: a stream this journal does not"
                f" know starts its numbers after {self.floor}"
            )
        return lines or ["nothing was lost"]


def aside_name(path: Path, now: float) -> Path:
    """Where the damaged file at C{path} goes: beside it, named for the time (UTC)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    aside = path.with_name(f"{path.name}{DAMAGED}{stamp}")
    n = 1
    while aside.exists():
        n += 1
        aside = path.with_name(f"{path.name}{DAMAGED}{stamp}.{n}")
    return aside


def finish_interrupted(path: Path) -> None:
    """
    A salvage cut short between its renames left the damaged file aside and
    the new one built: put the new one in place (the damaged file's WAL
    goes with it, aside).
    """
    building = path.with_name(path.name + BUILDING)
    if path.exists() or not building.exists():
        return
    asides = sorted(
        aside
        for aside in path.parent.glob(f"{path.name}{DAMAGED}*")
        if not aside.name.endswith(_SIDES)
    )
    for side in _SIDES:
        stray = Path(f"{path}{side}")
        if stray.exists() and asides:
            os.replace(stray, Path(f"{asides[-1]}{side}"))
    os.replace(building, path)
    _sync_directory(path.parent)


def salvage(
    path: Path,
    reason: str,
    identity: str | None,
    crash_skip: int,
    now: float,
    given: tuple[int, int] = (0, 0),
) -> Salvage:
    """
    Salvage the damaged journal at C{path} (see the module): a new journal
    there, the damaged file aside; what was done and lost. C{identity}: the
    journal's identity if the damaged file no longer says it, and C{given},
    the highest stream number and letter id it may have given (the data
    directory's marker's).
    """
    building = path.with_name(path.name + BUILDING)
    for name in (building, *(Path(f"{building}{side}") for side in _SIDES)):
        with suppress(FileNotFoundError):
            name.unlink()
    report = Salvage(reason, aside_name(path, now))
    with closing(sqlite3.connect(building, isolation_level=None)) as target:
        migrate(target)
        target.execute("PRAGMA synchronous = FULL")
        target.execute("BEGIN")
        copier = _Copier(target, report, now)
        source = _open_source(path)
        if source is None:
            report.streams_unknown = True
        else:
            with closing(source):
                copier.copy(source)
        _remove_copy(path)
        copier.finish(identity, crash_skip, given)
        target.execute("COMMIT")
        target.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.replace(path, report.aside)
    for side in _SIDES:
        with suppress(FileNotFoundError):
            os.replace(Path(f"{path}{side}"), Path(f"{report.aside}{side}"))
    os.replace(building, path)
    for side in _SIDES:
        with suppress(FileNotFoundError):
            os.replace(Path(f"{building}{side}"), Path(f"{path}{side}"))
    _sync_directory(path.parent)
    return report


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_source(path: Path) -> sqlite3.Connection | None:
    """
    The damaged file, read-only; None if SQLite cannot read it as a database
    at all. A file cut short (SQLite refuses one whose length is not its
    pages') is read from a copy made whole again with zeros
    (L{_whole_copy}), so that what is left of it can be read.
    """
    if _cut_short(path):
        copy = _whole_copy(path)
        return None if copy is None else _readable(copy)
    return _readable(path)


def _cut_short(path: Path) -> bool:
    """Whether the file is shorter than its header says, or not whole pages."""
    with path.open("rb") as f:
        header = f.read(_HEADER)
    size = path.stat().st_size
    if len(header) < _HEADER:
        return False
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        return False
    return size % page != 0 or size < int.from_bytes(header[28:32], "big") * page


def _readable(path: Path) -> sqlite3.Connection | None:
    try:
        conn = read_only(path)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA cell_size_check = ON")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except DAMAGE_ERRORS:
        conn.close()
        return None
    return conn


def _whole_copy(path: Path) -> Path | None:
    """
    A copy of the file at C{path} (and its WAL) beside it, zeros added up to
    the pages its header counts (and a whole last page); None if it has no
    header. Removed by L{_remove_copy}.
    """
    with path.open("rb") as f:
        header = f.read(_HEADER)
    if len(header) < _HEADER or not header.startswith(b"SQLite format 3\0"):
        return None
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page & (page - 1):
        return None
    size = path.stat().st_size
    pages = int.from_bytes(header[28:32], "big")
    whole = max(-(-size // page) * page, min(pages, _MOST_PAGES) * page)
    copy = path.with_name(path.name + _COPY)
    _remove_copy(path)
    with path.open("rb") as source, copy.open("wb") as target:
        while chunk := source.read(1 << 20):
            target.write(chunk)
        target.truncate(whole)
    wal = Path(f"{path}-wal")
    if wal.exists():
        with wal.open("rb") as source, Path(f"{copy}-wal").open("wb") as target:
            while chunk := source.read(1 << 20):
                target.write(chunk)
    return copy


def _remove_copy(path: Path) -> None:
    copy = path.with_name(path.name + _COPY)
    for name in (copy, *(Path(f"{copy}{side}") for side in _SIDES)):
        with suppress(FileNotFoundError):
            name.unlink()


def _columns(source: sqlite3.Connection, table: str) -> set[str] | None:
    """The columns C{table} has in the damaged file (None: it has no such table, or unreadable)."""
    try:
        names = {str(row[1]) for row in source.execute(f"PRAGMA table_info({table})")}
    except DAMAGE_ERRORS:
        return None
    return names or None


def _select(wanted: Sequence[tuple[str, Any]], have: set[str]) -> str:
    """The select list of C{wanted}'s columns, each missing one as its value for old rows."""
    return ", ".join(name if name in have else _literal(default) for name, default in wanted)


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def _add_run(runs: Runs, seq: int) -> None:
    if runs and runs[-1][1] + 1 == seq:
        runs[-1][1] = seq
    else:
        runs.append([seq, seq])


def _merged(runs: Sequence[list[int]]) -> Runs:
    merged: Runs = []
    for first, last in sorted(runs):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return merged


def _minus(runs: Runs, taken: Runs) -> Iterator[tuple[int, int]]:
    """The parts of C{runs} that C{taken} does not cover (both merged)."""
    i = 0
    for first, last in runs:
        start = first
        while i < len(taken) and taken[i][1] < start:
            i += 1
        j = i
        while start <= last:
            if j >= len(taken) or taken[j][0] > last:
                yield (start, last)
                break
            if taken[j][0] > start:
                yield (start, taken[j][0] - 1)
            start = max(start, taken[j][1] + 1)
            j += 1


class _Copier:
    """Copies what can be saved of a damaged file into C{target}, noting it in C{report}."""

    def __init__(self, target: sqlite3.Connection, report: Salvage, now: float) -> None:
        self._target = target
        self._report = report
        self._now = now
        self.identity: tuple[str, float] | None = None
        # Per stream: the high-water mark the damaged file said, its compaction.
        self.streams: dict[str, tuple[int, str]] = {}
        self.copied: dict[str, Runs] = {}
        self.counts: dict[str, list[int]] = {}  # stream -> [records, bytes] copied
        # Per stream, the numbers that may have been lost: between the
        # records saved around each record that could not be (in the order
        # they were written); the last number saved so far; holes open.
        self.missing: dict[str, Runs] = {}
        self.last_seen: dict[str, int] = {}
        self.holes: dict[str, int] = {}
        self.keys_seen: dict[str, int] = {}
        self.counters: dict[str, int] = {}
        self.last_id = 0
        # Per stream, the numbers it skipped (never given to a committed record).
        self.skips: dict[str, Runs] = {}

    def _unreadable(self, table: str, n: int = 1) -> None:
        self._report.unreadable[table] = self._report.unreadable.get(table, 0) + n

    def _count(self, table: str, n: int) -> None:
        self._report.copied[table] = self._report.copied.get(table, 0) + n

    def copy(self, source: sqlite3.Connection) -> None:
        self._identity(source)
        self._streams(source)
        self._records(source)
        self._skips(source)
        self._keys(source)
        self._letters(source)
        self._counters(source)
        for table, columns in _TABLES.items():
            self._table(source, table, columns)

    # The tables.

    def _identity(self, source: sqlite3.Connection) -> None:
        with suppress(*DAMAGE_ERRORS):
            row = source.execute(
                "SELECT identity, created FROM journal_identity WHERE id = 1"
            ).fetchone()
            if row is not None and isinstance(row[0], str) and isinstance(row[1], float):
                self.identity = (row[0], row[1])

    def _streams(self, source: sqlite3.Connection) -> None:
        have = _columns(source, "streams")
        if have is None:
            self._report.streams_unknown = True
            return
        select = _select((("stream", None), ("last_seq", None), ("compact", "")), have)
        for item in RowidScan(source, "streams", select):
            if isinstance(item, Unreadable):
                self._report.streams_unknown = True
                continue
            _, stream, last, compact = item
            if isinstance(stream, str) and isinstance(last, int) and isinstance(compact, str):
                self.streams[stream] = (max(last, 0), compact)
            else:
                self._report.streams_unknown = True

    def _records(self, source: sqlite3.Connection) -> None:
        have = _columns(source, "stream_messages")
        if have is None:
            self._report.streams_unknown = True
            return
        block: list[tuple[Any, ...]] = []
        for item in RowidScan(source, "stream_messages", _select(_RECORD_COLUMNS, have)):
            if isinstance(item, Unreadable):
                self._copy_records(block)
                block = []
                self._unreadable("stream_messages")
                self._hole()
                continue
            block.append(item[1:])
            if len(block) >= _BLOCK:
                self._copy_records(block)
                block = []
        self._copy_records(block)
        for stream, after in self.holes.items():
            # Open to the end: whatever followed its last record saved.
            self.missing.setdefault(stream, []).append([after + 1, MAX_KEY])
        self.holes = {}

    def _copy_records(self, block: list[tuple[Any, ...]]) -> None:
        """
        Copy the good records of C{block} (rows in rowid order); each
        record that is not is a hole in that order (L{_hole}).
        """
        if not block:
            return
        checks = _record_checks(block)
        rows = [
            (*row[:6], len(row[5]), *row[6:]) for row, ok in zip(block, checks, strict=True) if ok
        ]
        try:
            self._target.executemany(_INSERT_RECORD, rows)
        except _REFUSED:  # a value of the wrong type after all: row by row
            kept = iter([self._insert(None, _INSERT_RECORD, row) for row in rows])
            checks = [ok and next(kept) for ok in checks]
        copied = 0
        for row, ok in zip(block, checks, strict=True):
            if not ok:
                self._unreadable("stream_messages (damaged records)")
                self._hole()
                continue
            stream, seq = row[0], row[1]
            self._seen(stream, seq)
            _add_run(self.copied.setdefault(stream, []), seq)
            counts = self.counts.setdefault(stream, [0, 0])
            counts[0] += 1
            counts[1] += len(row[5])
            copied += 1
        self._count("stream_messages", copied)

    def _hole(self) -> None:
        """
        A record in rowid order could not be saved (damaged, or unreadable:
        which stream it was of is unknown). Records are written in order of
        their numbers, so each stream may have lost the numbers after its
        last record saved so far, up to its next one saved.
        """
        for stream, seq in self.last_seen.items():
            self.holes.setdefault(stream, seq)

    def _seen(self, stream: str, seq: int) -> None:
        after = self.holes.pop(stream, None)
        if after is not None and seq - 1 > after:
            self.missing.setdefault(stream, []).append([after + 1, seq - 1])
        self.last_seen[stream] = seq

    def _skips(self, source: sqlite3.Connection) -> None:
        """
        The numbers each stream skipped, copied: not lost (an unreadable
        one is counted lost if nothing else shows it was skipped).
        """
        if _columns(source, "stream_skips") is None:
            return
        copied = 0
        for item in RowidScan(source, "stream_skips", "stream, first_seq, last_seq"):
            if isinstance(item, Unreadable):
                self._unreadable("stream_skips")
                continue
            _, stream, first, last = item
            if not (isinstance(stream, str) and isinstance(first, int) and isinstance(last, int)):
                self._unreadable("stream_skips")
                continue
            self._target.execute(ADD_SKIP, (stream, first, last))
            self.skips.setdefault(stream, []).append([first, last])
            copied += 1
        self._count("stream_skips", copied)

    def _keys(self, source: sqlite3.Connection) -> None:
        """Every stream's keys in its index: those not copied were lost."""
        names = set(self.streams) | set(self.copied)
        walked = _walk_keys(source)
        if walked is not None:
            for stream in sorted(names | set(walked)):
                self._lost(stream, walked.get(stream, []), [])
            return
        after = ""
        # The names the index shows (the streams table names every stream
        # numbered: this finds those whose row in it was lost).
        with suppress(*DAMAGE_ERRORS):
            while (row := source.execute(_NAME_AFTER, (after,)).fetchone()) is not None:
                after = str(row[0])
                names.add(after)
        for stream in sorted(names):
            # The index is damaged: a search in it may end early, or skip,
            # without a word, and the first records may be gone from it and
            # from the table alike. Every number up to the high-water mark
            # that was not saved (nor skipped) counts as lost, from the first
            # (found by the soak: a file that lost its first pages looked
            # like a stream pruned up to its first saved record; a pair's
            # partner, told that it retained nothing before, deleted its
            # copies).
            listed, _ = _search_keys(source, stream)
            self._lost(stream, listed, [[1, MAX_KEY]])

    def _lost(self, stream: str, listed: Runs, stretches: Runs) -> None:
        """
        What C{stream} lost: the keys its index C{listed}, the C{stretches}
        of it that could not be read, and the numbers around records that
        could not be saved, less the records saved.
        """
        listed = _merged(listed)
        if listed:
            self.keys_seen[stream] = listed[-1][1]
        copied = _merged(self.copied.get(stream, []))
        self.copied[stream] = copied
        high = self._high(stream)
        maybe = stretches + self.missing.get(stream, [])
        wanted = _merged(listed + [[a, min(b, high)] for a, b in maybe if a <= high])
        lost = list(_minus(wanted, _merged(copied + self.skips.get(stream, []))))
        if lost:
            self._report.lost[stream] = lost

    def _high(self, stream: str) -> int:
        """The highest number C{stream} is known to have given."""
        copied = self.copied.get(stream)
        return max(
            self.streams.get(stream, (0, ""))[0],
            copied[-1][1] if copied else 0,
            self.keys_seen.get(stream, 0),
        )

    def _letters(self, source: sqlite3.Connection) -> None:
        have = _columns(source, "queued_messages")
        if have is None:
            return
        select = _select(_LETTER_COLUMNS, have)
        marks = ", ".join("?" * len(_LETTER_COLUMNS))
        names = ", ".join(name for name, _ in _LETTER_COLUMNS)
        insert = f"INSERT OR IGNORE INTO queued_messages ({names}) VALUES ({marks})"
        report = self._report
        for item in RowidScan(source, "queued_messages", select):
            if isinstance(item, Unreadable):
                if item.before - item.after == 2:
                    report.letters.append(item.after + 1)
                else:
                    report.letter_stretches.append((item.after + 1, min(item.before - 1, MAX_KEY)))
                if item.before < MAX_KEY:
                    self.last_id = max(self.last_id, item.before - 1)
                continue
            rid, row = item[0], item[1:]
            self.last_id = max(self.last_id, rid)
            if letter_good(row) and self._insert("queued_messages", insert, row):
                continue
            report.letters.append(rid)

    def _insert(self, table: str | None, sql: str, row: Sequence[Any]) -> bool:
        """
        Insert C{row} (the target's STRICT types check it), counted for
        C{table} (None: not); whether it went in.
        """
        try:
            self._target.execute(sql, tuple(row))
        except _REFUSED:
            return False
        if table is not None:
            self._count(table, 1)
        return True

    def _counters(self, source: sqlite3.Connection) -> None:
        if _columns(source, "journal_counters") is None:
            return
        for item in RowidScan(source, "journal_counters", "name, value"):
            if isinstance(item, Unreadable):
                self._unreadable("journal_counters")
                self._report.streams_unknown = True  # a floor it had may be lost
                continue
            _, name, value = item
            if isinstance(name, str) and isinstance(value, int):
                self.counters[name] = value

    def _table(
        self, source: sqlite3.Connection, table: str, columns: tuple[tuple[str, Any], ...]
    ) -> None:
        have = _columns(source, table)
        if have is None:
            return
        names = ", ".join(name for name, _ in columns)
        marks = ", ".join("?" * len(columns))
        insert = f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({marks})"
        saved: set[tuple[Any, ...]] = set()
        keys = _KEY_COLUMNS[table]
        for item in RowidScan(source, table, _select(columns, have)):
            if isinstance(item, Unreadable) or not self._insert(table, insert, item[1:]):
                self._unreadable(table)
            else:
                saved.add(item[1 : 1 + keys])
        if table in self._report.unreadable:
            # Which rows: those its key's index lists and that were not saved.
            listed = _index_keys(source, table, [name for name, _ in columns[:keys]])
            lost = sorted(listed - saved, key=repr)
            if lost:
                self._report.lost_rows[table] = lost

    # The new journal's numbers.

    def finish(self, identity: str | None, crash_skip: int, given: tuple[int, int]) -> None:
        target, report = self._target, self._report
        if self.identity is not None:
            target.execute(
                "UPDATE journal_identity SET identity = ?, created = ? WHERE id = 1", self.identity
            )
        elif identity is not None:
            target.execute("UPDATE journal_identity SET identity = ? WHERE id = 1", (identity,))
        highest = 0
        for stream in sorted(set(self.streams) | set(self.copied) | set(report.lost)):
            high = self._high(stream)
            highest = max(highest, high)
            records, size = self.counts.get(stream, (0, 0))
            compact = self.streams.get(stream, (0, ""))[1]
            target.execute(
                "INSERT INTO streams (stream, last_seq, message_count, total_bytes, compact)"
                " VALUES (?, ?, ?, ?, ?)",
                (stream, high, records, size, compact),
            )
            if compact == _LAST_VALUE:
                target.execute(
                    "INSERT INTO stream_last_values (stream, subject, seq) SELECT stream,"
                    " subject, max(seq) FROM stream_messages WHERE stream = ? GROUP BY subject",
                    (stream,),
                )
        reason = f"lost in a salvage of a damaged journal ({report.reason[:80]})"
        for stream, stretches in report.lost.items():
            target.executemany(
                "INSERT OR REPLACE INTO journal_losses (stream, first_seq, last_seq, found,"
                " reason) VALUES (?, ?, ?, ?, ?)",
                [(stream, a, b, self._now, reason) for a, b in stretches],
            )
        counters = dict(self.counters)
        counters[QUEUED_LAST_ID] = max(counters.get(QUEUED_LAST_ID, 0), self.last_id, given[1])
        floor = counters.get(STREAM_FLOOR, 0)
        numbered = max(counters.get(STREAMS_NUMBERED, 0), highest, given[0])
        counters[STREAMS_NUMBERED] = numbered
        if report.streams_unknown:
            floor = max(floor, numbered + crash_skip)
        if floor:
            counters[STREAM_FLOOR] = floor
        report.floor = floor
        counters[RUNNING] = 1  # as after a crash: numbering jumps past what was seen
        target.executemany(
            "INSERT OR REPLACE INTO journal_counters (name, value) VALUES (?, ?)",
            sorted(counters.items()),
        )


def _index_keys(source: sqlite3.Connection, table: str, keys: list[str]) -> set[tuple[Any, ...]]:
    """The keys of C{table}'s rows its key's index lists (what can be read of it)."""
    names = ", ".join(keys)
    found: set[tuple[Any, ...]] = set()
    with suppress(*DAMAGE_ERRORS):
        for row in source.execute(f"SELECT {names} FROM {table} ORDER BY {names}"):
            found.add(tuple(row))
    return found


def _walk_keys(source: sqlite3.Connection) -> dict[str, Runs] | None:
    """
    Every stream's numbers as its index lists them, by a walk of the whole
    index (a damaged key in an inner page misleads a search, not a walk);
    None if the walk meets a page SQLite cannot read.
    """
    keys: dict[str, Runs] = {}
    try:
        cursor = source.execute(_ALL_KEYS)
        while block := cursor.fetchmany(4096):
            for stream, seq in block:
                if isinstance(stream, str) and isinstance(seq, int):
                    _add_run(keys.setdefault(stream, []), seq)
    except DAMAGE_ERRORS:
        return None
    return keys


def _search_keys(source: sqlite3.Connection, stream: str) -> tuple[Runs, Runs]:
    """
    C{stream}'s numbers as its index lists them, searched a block at a
    time, and the stretches of it that could not be read (stepped over).
    """
    listed: Runs = []
    stretches: Runs = []
    after = 0

    def probe(key: int) -> int | None:
        found = source.execute(_KEY_FROM, (stream, key)).fetchone()
        if found is None:
            return None
        if not isinstance(found[0], int) or found[0] < key:
            raise sqlite3.DatabaseError("keys out of order (a damaged index)")
        return int(found[0])

    while after < MAX_KEY:
        try:
            keys = [k for (k,) in source.execute(_KEYS_AFTER, (stream, after, _BLOCK))]
        except DAMAGE_ERRORS:
            # Key by key past the block that failed, stepping over what cannot be read.
            try:
                next_key = probe(after + 1)
            except DAMAGE_ERRORS:
                skipped = next_readable(probe, after + 2, MAX_KEY)
                if skipped is None:  # nothing readable to the end
                    stretches.append([after + 1, MAX_KEY])
                    break
                readable_from, next_key = skipped
                stretches.append([after + 1, (readable_from if next_key is None else next_key) - 1])
            if next_key is None or next_key <= after:
                break
            _add_run(listed, next_key)
            after = next_key
            continue
        for key in keys:
            _add_run(listed, key)
        if len(keys) < _BLOCK:
            break
        after = keys[-1]
    return listed, stretches


def _record_checks(block: list[tuple[Any, ...]]) -> list[bool]:
    """Per record row (L{_RECORD_COLUMNS}) of C{block}: whether it can be saved as it is."""
    streams, seqs, stamps, senders, subjects, contents, origins, oseqs, sums = zip(
        *block, strict=True
    )
    try:
        computed = stream_checksums(
            streams, seqs, stamps, senders, subjects, contents, origins, oseqs
        )
        matches = list(map(eq, computed, sums))
    except CHECKSUM_ERRORS:  # a column of the wrong type: row by row
        matches = [_record_check(row) for row in block]
    return [
        match or (row[8] is None and isinstance(row[0], str) and sane_record(row[1:]))
        for row, match in zip(block, matches, strict=True)
    ]


def _record_check(row: tuple[Any, ...]) -> bool:
    """Whether one record row's checksum matches (L{_record_checks}, alone)."""
    try:
        (computed,) = stream_checksums(*((value,) for value in row[:8]))
    except CHECKSUM_ERRORS:
        return False
    return bool(computed == row[8])
