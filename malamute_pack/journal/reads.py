"""
The SQL that reads a journal file, in one place: ranges and streams of
stream records, their numbers, a last-value stream's latest records,
queued letters, append keys, owners and the forwarded records' origin marks. Each function takes the
``sqlite3.Connection`` to read on and runs there (the journal's reader
thread, :mod:`malamute_pack.journal.reader`; its opening and recovery,
:mod:`malamute_pack.journal.opening`; or a journal file read offline,
:mod:`malamute_pack.spark.journal_file`).

A stream name SQLite cannot take (not valid UTF-8) has nothing stored: its
records were dropped as they came, so a read of it finds nothing.

Every read of records or letters verifies each one against its checksum
(:mod:`malamute_pack.journal.verify`): a damaged one is left out and told
to the read's ``found`` (a :class:`~malamute_pack.journal.verify.Found`),
and where SQLite fails on a page the read goes on past it.

Tests: ``tests/unit/test_journal_reads.py``, ``tests/unit/test_journal_origin.py``,
``tests/unit/test_journal_last_values.py``, ``tests/system/test_spark_units.py``,
``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_left
from collections.abc import Mapping
from functools import partial
from itertools import accumulate, repeat
from operator import add, attrgetter, itemgetter
from typing import Any, Final, cast

from malamute_pack.journal.scan import DAMAGE_ERRORS, MAX_KEY, describe
from malamute_pack.journal.verify import (
    CHECKSUM_MISMATCH,
    SCAN_COLUMNS,
    Found,
    StreamScan,
    record_good,
    scan_all,
    scan_letters,
    verified_letters,
)
from malamute_pack.protocol.chunks import ChunkRow, decode_frames
from malamute_pack.protocol.records import ConsumerPosition, QueuedRecord, StreamRecord, StreamRow

# A queued record's columns, in the order of QueuedRecord's fields.
QUEUED_COLUMNS: Final = (
    "id, kind, address, sender, subject, tracker, deadline, created, content,"
    " relay_origin, relay_id"
)

# Each origin query names the origin index's condition (origin != ''):
# SQLite uses a partial index only for a query whose WHERE holds that term.
FIRST_ORIGIN: Final = (
    "SELECT stream, origin FROM stream_messages WHERE origin != '' ORDER BY stream, origin LIMIT 1"
)
ORIGIN_MARK: Final = (
    "SELECT max(origin_seq) FROM stream_messages WHERE origin != '' AND stream = ? AND origin = ?"
)
# The pair after (stream, origin, its mark). All three columns: a seek past
# (stream, origin) alone steps over each of that pair's entries.
NEXT_ORIGIN: Final = (
    "SELECT stream, origin FROM stream_messages WHERE origin != '' "
    "AND (stream, origin, origin_seq) > (?, ?, ?) ORDER BY stream, origin, origin_seq LIMIT 1"
)

# Ids per IN (...) list: well under SQLite's limit of bound parameters.
_IDS_PER_QUERY = 500

# Chunk rows are fetched a block at a time: the first this many, then as
# many as the byte cap has room for (at most _MAX_BLOCK): few fetches a
# chunk, and few rows read past the cap.
_FIRST_BLOCK: Final = 64
_MAX_BLOCK: Final = 1024
_CONTENT: Final = itemgetter(4)
# A scan row's (verify.SCAN_COLUMNS) fields that a ChunkRow has.
_CHUNK_FIELDS: Final = itemgetter(0, 1, 2, 3, 4)
_SEQ: Final = attrgetter("seq")
# What a row counts for besides its content, towards a chunk's byte cap.
_ROW_OVERHEAD: Final = 64
# A row of RANGE as a ChunkRow, made in C (its fields are in ChunkRow's order).
_new_chunk_row: Final = partial(tuple.__new__, ChunkRow)


# Streams and their numbers.


def stream_names(conn: sqlite3.Connection) -> list[str]:
    """Every stream the journal has numbered records for, sorted."""
    rows = conn.execute(
        "SELECT stream FROM streams UNION SELECT DISTINCT stream FROM stream_messages "
        "ORDER BY stream"
    )
    return [str(row[0]) for row in rows]


def stream_lasts(conn: sqlite3.Connection) -> list[tuple[str, int]]:
    """Per stream of the ``streams`` table, the last sequence number assigned."""
    return cast(
        list[tuple[str, int]], conn.execute("SELECT stream, last_seq FROM streams").fetchall()
    )


def last_assigned(conn: sqlite3.Connection, stream: str) -> int | None:
    """The last sequence number the ``streams`` table has for ``stream`` (None: no row)."""
    row = conn.execute("SELECT last_seq FROM streams WHERE stream = ?", (stream,)).fetchone()
    return None if row is None else int(row[0])


def first_retained(conn: sqlite3.Connection, stream: str) -> int | None:
    """The first sequence number of ``stream`` still stored (None: none)."""
    (first,) = conn.execute(
        "SELECT min(seq) FROM stream_messages WHERE stream = ?", (stream,)
    ).fetchone()
    return cast(int | None, first)


def last_retained(conn: sqlite3.Connection, stream: str) -> int | None:
    """The last sequence number of ``stream`` still stored (None: none)."""
    (last,) = conn.execute(
        "SELECT max(seq) FROM stream_messages WHERE stream = ?", (stream,)
    ).fetchone()
    return cast(int | None, last)


def first_at_time(conn: sqlite3.Connection, stream: str, t: float) -> int | None:
    """The first sequence number of ``stream`` stored with timestamp >= ``t`` (None: none)."""
    try:
        (seq,) = conn.execute(
            "SELECT min(seq) FROM stream_messages WHERE stream = ? AND ts >= ?", (stream, t)
        ).fetchone()
    except UnicodeEncodeError:
        return None
    return cast(int | None, seq)


def stream_totals(conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """Per stream, the records and content bytes committed and retained."""
    rows = conn.execute("SELECT stream, message_count, total_bytes FROM streams")
    return {stream: (count, size) for stream, count, size in rows}


# Stream records: every read verifies each record (malamute_pack.journal.verify)
# and reports what it cannot serve to its Found.


def chunk_rows(
    conn: sqlite3.Connection,
    stream: str,
    first: int,
    last: int,
    limit: int,
    max_bytes: int,
    found: Found | None = None,
) -> list[ChunkRow]:
    """
    The stored records of ``stream`` with ``first <= seq <= last``, in
    order, up to ``limit`` of them and about ``max_bytes`` of content (at
    least one): each row counts its content and 64 bytes, and the first
    row that brings the count to ``max_bytes`` is the last. Damaged
    records are left out (told to ``found``).

    Rows are fetched and verified a block at a time and measured with
    builtins mapped over the block: no Python statement runs per row (a
    range read serves hundreds of thousands a second).
    """
    scan = StreamScan(conn, stream, first, last, Found() if found is None else found)
    rows: list[ChunkRow] = []
    size = 0
    wanted = _FIRST_BLOCK
    try:
        while len(rows) < limit and (block := scan.next_block(min(wanted, limit - len(rows)))):
            # sizes[k]: the count after the first k rows of the block.
            lengths = map(add, map(len, map(_CONTENT, block)), repeat(_ROW_OVERHEAD))
            sizes = list(accumulate(lengths, initial=size))
            end = bisect_left(sizes, max_bytes, 1)
            rows.extend(map(_new_chunk_row, map(_CHUNK_FIELDS, block[:end])))
            if end < len(sizes):
                break
            size = sizes[-1]
            # As many rows as the cap has room for at the average size so far.
            wanted = min(_MAX_BLOCK, (max_bytes - size) * len(rows) // size + 1)
    except UnicodeEncodeError:  # a stream name SQLite cannot take: nothing stored
        return []
    finally:
        scan.close()
    return rows


def stream_records(
    conn: sqlite3.Connection, stream: str, from_seq: int, limit: int, found: Found | None = None
) -> list[StreamRecord]:
    """
    Up to ``limit`` stored records of ``stream`` with seq >= ``from_seq``,
    in order; damaged ones left out (told to ``found``).
    """
    found = Found() if found is None else found
    try:
        rows = scan_all(conn, stream, from_seq, MAX_KEY, found, limit)
    except UnicodeEncodeError:
        return []
    return [
        StreamRecord(stream, seq, ts, sender, subject, decode_frames(content), origin, oseq)
        for seq, ts, sender, subject, content, origin, oseq, _ in rows
    ]


# The records a stream keeps as last values, in sequence order (SQLite walks
# the subquery's numbers in order: no sort).
_LAST_VALUES: Final = (
    f"SELECT {SCAN_COLUMNS} FROM stream_messages "
    "WHERE stream = ?1 AND seq IN (SELECT seq FROM stream_last_values WHERE stream = ?1)"
)
_LAST_VALUE_SEQS: Final = "SELECT seq FROM stream_last_values WHERE stream = ? ORDER BY seq"
_RECORD_AT: Final = f"SELECT {SCAN_COLUMNS} FROM stream_messages WHERE stream = ? AND seq = ?"


def last_values(
    conn: sqlite3.Connection,
    stream: str,
    through: int,
    older: Mapping[str, int],
    found: Found | None = None,
) -> list[StreamRecord]:
    """
    The latest record of each subject of the last-value stream ``stream``
    as of sequence number ``through``, in sequence order, in one read
    transaction. A subject whose kept record is later than ``through``
    gets its record ``older`` names (what the writer noted it was as of
    ``through``), if that one is still stored; without one it is left
    out (it had no record by ``through``). A damaged record is left out
    (told to ``found``).
    """
    found = Found() if found is None else found
    records: list[StreamRecord] = []
    later: list[int] = []
    conn.execute("BEGIN")
    try:
        try:
            rows = conn.execute(_LAST_VALUES, (stream,)).fetchall()
        except DAMAGE_ERRORS:  # record by record, stepping over what cannot be read
            rows = _rows_at(conn, stream, _seqs(conn, stream, found), found)
        for row in _verified(stream, rows, found):
            seq, subject = row[0], row[3]
            if seq <= through:
                records.append(_record(stream, row))
            elif (before := older.get(subject)) is not None:
                later.append(before)
        # Pruned meanwhile, not found: it was superseded anyway.
        records += [_record(stream, row) for row in _rows_at(conn, stream, later, found)]
    except UnicodeEncodeError:  # a stream name SQLite cannot take: nothing stored
        records = []
        later = []
    finally:
        conn.execute("COMMIT")
    if later:
        records.sort(key=_SEQ)
    return records


def _record(stream: str, row: tuple[Any, ...]) -> StreamRecord:
    seq, ts, sender, subject, content, origin, oseq, _ = row
    return StreamRecord(stream, seq, ts, sender, subject, decode_frames(content), origin, oseq)


def _seqs(conn: sqlite3.Connection, stream: str, found: Found) -> list[int]:
    """The last values' numbers of C{stream} (none if they cannot be read: C{found} says so)."""
    try:
        return [int(seq) for (seq,) in conn.execute(_LAST_VALUE_SEQS, (stream,))]
    except DAMAGE_ERRORS as exc:
        found.spans.append((stream, 1, MAX_KEY, f"its last values: {describe(exc)}"))
        return []


def _rows_at(
    conn: sqlite3.Connection, stream: str, seqs: list[int], found: Found
) -> list[tuple[Any, ...]]:
    """The rows of C{stream} at C{seqs} that are stored, each read alone (verified later)."""
    rows: list[tuple[Any, ...]] = []
    for seq in seqs:
        try:
            row = conn.execute(_RECORD_AT, (stream, seq)).fetchone()
        except DAMAGE_ERRORS as exc:
            found.records.append((stream, seq))
            found.spans.append((stream, seq, seq, describe(exc)))
            continue
        if row is not None:
            rows += _verified(stream, [row], found)
    return rows


def _verified(stream: str, rows: list[tuple[Any, ...]], found: Found) -> list[tuple[Any, ...]]:
    """The good rows of C{rows} (each alone: not a stretch of numbers); the others to C{found}."""
    if not rows:
        return []
    good: list[tuple[Any, ...]] = []
    for row in rows:
        if record_good(stream, row):
            good.append(row)
        else:
            found.records.append((stream, row[0]))
            found.spans.append((stream, row[0], row[0], CHECKSUM_MISMATCH))
    return good


def full_rows(
    conn: sqlite3.Connection,
    stream: str,
    from_seq: int,
    to_seq: int,
    limit: int,
    found: Found | None = None,
) -> list[StreamRow]:
    """
    The stored rows of ``stream`` with ``from_seq <= seq <= to_seq``, in
    order, up to ``limit``, as the writer inserts them; damaged ones left
    out (told to ``found``).
    """
    found = Found() if found is None else found
    rows = scan_all(conn, stream, from_seq, to_seq, found, limit)
    return [
        (stream, seq, ts, sender, subject, content, len(content), origin, oseq)
        for seq, ts, sender, subject, content, origin, oseq, _ in rows
    ]


def append_keys(
    conn: sqlite3.Connection, stream: str, from_seq: int, to_seq: int
) -> list[tuple[str, str, int, int, float]]:
    """The append keys of ``stream`` whose last record is in [from_seq, to_seq]."""
    rows = conn.execute(
        "SELECT stream, key, first_seq, last_seq, created FROM stream_appends "
        "WHERE stream = ? AND last_seq >= ? AND last_seq <= ?",
        (stream, from_seq, to_seq),
    ).fetchall()
    return cast(list[tuple[str, str, int, int, float]], rows)


def newest_times(conn: sqlite3.Connection) -> dict[str, float]:
    """
    Per stream known on ``conn``, the time of its newest record retained
    (one lookup each in the (stream, ts) index).
    """
    times: dict[str, float] = {}
    for (stream,) in conn.execute("SELECT stream FROM streams").fetchall():
        (ts,) = conn.execute(
            "SELECT max(ts) FROM stream_messages WHERE stream = ?", (stream,)
        ).fetchone()
        if ts is not None:
            times[stream] = float(ts)
    return times


def committed_origin_marks(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """
    The highest origin_seq per (stream, origin) committed on ``conn``, in
    one read transaction. It seeks from one pair to the next in the origin
    index, two lookups each: the cost grows with the number of pairs, not
    with the number of forwarded records (a GROUP BY reads every entry).
    """
    marks: dict[tuple[str, str], int] = {}
    conn.execute("BEGIN")
    try:
        pair = conn.execute(FIRST_ORIGIN).fetchone()
        while pair is not None:
            stream, origin = pair
            (mark,) = conn.execute(ORIGIN_MARK, (stream, origin)).fetchone()
            marks[stream, origin] = mark
            pair = conn.execute(NEXT_ORIGIN, (stream, origin, mark)).fetchone()
    finally:
        conn.execute("COMMIT")
    return marks


# Queued letters and owners.


def queued_record(row: tuple[Any, ...]) -> QueuedRecord:
    """The queued record a row of L{QUEUED_COLUMNS} holds."""
    rid, kind, address, sender, subject, tracker, deadline, created, blob, *relay = row
    frames = decode_frames(blob)
    return QueuedRecord(
        rid, kind, address, sender, subject, tracker, deadline, created, frames, *relay
    )


def all_queued(conn: sqlite3.Connection, found: Found | None = None) -> list[QueuedRecord]:
    """
    Every queued record stored, in id order; damaged ones left out (told to
    ``found``), and what cannot be read stepped over.
    """
    return scan_letters(conn, QUEUED_COLUMNS, Found() if found is None else found, queued_record)


def queued_by_ids(
    conn: sqlite3.Connection, ids: list[int], found: Found | None = None
) -> list[QueuedRecord]:
    """
    The queued records among ``ids`` still stored, in id order; damaged ones
    left out (told to ``found``).
    """
    found = Found() if found is None else found
    made: list[QueuedRecord] = []
    for start in range(0, len(ids), _IDS_PER_QUERY):
        part = ids[start : start + _IDS_PER_QUERY]
        marks = ",".join("?" * len(part))
        try:
            rows = conn.execute(
                f"SELECT {QUEUED_COLUMNS}, checksum FROM queued_messages"
                f" WHERE id IN ({marks}) ORDER BY id",
                part,
            ).fetchall()
        except DAMAGE_ERRORS:
            rows = _letters_alone(conn, sorted(part), found)
        made += verified_letters(rows, found, queued_record)
    return made


def _letters_alone(conn: sqlite3.Connection, ids: list[int], found: Found) -> list[tuple[Any, ...]]:
    """The letters C{ids} read one by one: those SQLite cannot read go to C{found}."""
    rows: list[tuple[Any, ...]] = []
    for rid in ids:
        try:
            row = conn.execute(
                f"SELECT {QUEUED_COLUMNS}, checksum FROM queued_messages WHERE id = ?", (rid,)
            ).fetchone()
        except DAMAGE_ERRORS as exc:
            found.letters.append((rid, describe(exc)))
            continue
        if row is not None:
            rows.append(row)
    return rows


def owners_page(
    conn: sqlite3.Connection, after: str | None, limit: int
) -> list[tuple[str, str, float]]:
    """
    Up to ``limit`` owners (address, user, when claimed), in the order of
    their addresses, from the first after ``after`` (None: the first of all).
    """
    select = "SELECT address, user, claimed FROM address_owners"
    if after is None:
        cursor = conn.execute(f"{select} ORDER BY address LIMIT ?", (limit,))
    else:
        cursor = conn.execute(
            f"{select} WHERE address > ? ORDER BY address LIMIT ?", (after, limit)
        )
    return [(str(a), str(u), float(c)) for a, u, c in cursor.fetchall()]


def consumers(conn: sqlite3.Connection) -> list[ConsumerPosition]:
    """Every consumer position kept, least recently used first."""
    cursor = conn.execute(
        "SELECT stream, kind, name, seq, acked, updated, owner FROM stream_consumers"
        " ORDER BY updated"
    )
    return [
        ConsumerPosition(str(st), str(k), str(n), int(q), bytes(a), float(u), str(o))
        for st, k, n, q, a, u, o in cursor.fetchall()
    ]
