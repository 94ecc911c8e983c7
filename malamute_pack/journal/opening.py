"""
Opening a journal file and recovering its state: check it against the data
directory's marker (:mod:`malamute_pack.journal.identity`), create or
migrate its schema, read back what it holds (:class:`Recovered`: streams
and their numbers, letters, append keys, owners, a pair's state) and mark
it running, so that the next open knows whether this run crashed. After a
crash, or at a pair's takeover, numbering jumps past what may have been
handed out and never committed.

Blocks on the disk: :meth:`Journal.open<malamute_pack.journal.journal.Journal.open>`
calls it at startup.

Tests: ``tests/unit/test_journal_opening.py``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.journal import reads
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.identity import (
    Marker,
    check_file,
    check_identity,
    read_marker,
    write_marker,
)
from malamute_pack.journal.schema import QUEUED_LAST_ID, RUNNING, journal_identity, migrate
from malamute_pack.journal.writer import SET_COUNTER
from malamute_pack.protocol.records import AppendKey, ConsumerPosition, QueuedRecord


@dataclass(frozen=True, slots=True)
class Recovered:
    """
    What :meth:`Journal.open` found: per stream the (first, last) sequence
    numbers retained (first is last + 1 when retention left none), the
    queued records not yet removed, in id order, and the keys of the
    idempotent appends remembered. Every stream the journal numbered is in
    ``streams``, whether it retains records or not.
    """

    streams: dict[str, tuple[int, int]]
    queued: list[QueuedRecord]
    # The idempotent appends' keys remembered, oldest first.
    appends: list[AppendKey] = field(default_factory=list)
    # Per stream the last sequence number stored, and the last letter id,
    # before a crash's or a takeover's skip.
    lasts: dict[str, int] = field(default_factory=dict)
    last_id: int = 0
    # The pair_state table (malamute_pack.pair).
    pair: dict[str, str] = field(default_factory=dict)
    # The owners of addresses: address to (user, when claimed).
    owners: dict[str, tuple[str, float]] = field(default_factory=dict)
    # The positions of the consumers the broker remembers, least recently used first.
    consumers: list[ConsumerPosition] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Opened:
    """
    A journal file open: the writer's connection and the reader's, what it
    recovered, its identity, whether its last run crashed, and the last
    letter id handed out (after the crash's skip).
    """

    conn: sqlite3.Connection
    reader: sqlite3.Connection
    recovered: Recovered
    identity: str
    crashed: bool
    last_id: int


def open_journal(
    path: Path, marker: Path | None, crash_skip: int, *, takeover: bool = False
) -> Opened:
    """
    Open (creating or migrating) the journal at ``path``, checked against
    ``marker`` if there is one, and recover it; with ``takeover``, or after
    a crash, numbering jumps ``crash_skip`` ahead. Raises JournalError.
    """
    conn: sqlite3.Connection | None = None
    reader: sqlite3.Connection | None = None
    try:
        expected = _check_file(path, marker)
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 10000")
        migrate(conn)
        identity = _check_identity(conn, path, marker, expected)
        recovered, crashed, last_id = recover(conn, crash_skip, takeover)
        reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        reader.execute("PRAGMA busy_timeout = 10000")
        reader.execute("PRAGMA query_only = ON")
    except (sqlite3.Error, ValueError, OSError, JournalError) as exc:
        for c in (conn, reader):
            if c is not None:
                c.close()
        if isinstance(exc, JournalError):
            raise
        raise JournalError.wrap(exc, path, "opening") from exc
    return Opened(conn, reader, recovered, identity, crashed, last_id)


def _check_file(path: Path, marker: Path | None) -> Marker | None:
    """
    The marker, if there is one; refuses a journal file that is missing
    or empty where the marker says a journal was created.
    """
    if marker is None:
        return None
    expected = read_marker(marker)
    if expected is not None:
        check_file(path, marker, expected)
    return expected


def _check_identity(
    conn: sqlite3.Connection, path: Path, marker: Path | None, expected: Marker | None
) -> str:
    """
    The journal's identity; refuses one that is not the marker's, and
    records it in a new marker where there was none.
    """
    identity, created = journal_identity(conn)
    if marker is not None:
        if expected is not None:
            check_identity(path, marker, expected, identity)
        else:
            write_marker(marker, Marker(str(path.resolve()), identity, created))
    return identity


def recover(
    conn: sqlite3.Connection, crash_skip: int, takeover: bool = False
) -> tuple[Recovered, bool, int]:
    """
    What the journal on ``conn`` holds, whether its last run crashed, and
    the last letter id to count on from; marks it running.
    """
    streams: dict[str, tuple[int, int]] = {}
    for stream, last_seq in reads.stream_lasts(conn):
        first = reads.first_retained(conn, stream)
        streams[stream] = (first if first is not None else last_seq + 1, last_seq)
    queued = reads.all_queued(conn)
    row = conn.execute(
        "SELECT value FROM journal_counters WHERE name = ?", (QUEUED_LAST_ID,)
    ).fetchone()
    last_id = max(row[0] if row else 0, queued[-1].id if queued else 0)
    crashed = conn.execute(
        "SELECT value FROM journal_counters WHERE name = ?", (RUNNING,)
    ).fetchone() not in (None, (0,))
    lasts = {stream: last for stream, (_, last) in streams.items()}
    before_skip = last_id
    if crashed or takeover:
        # Numbers handed out before the crash but never committed (live
        # deliveries, ids of letters being written) must not come again:
        # jump past them. Readers see the hole; nothing is reused.
        streams = {
            stream: (first if first <= last else last + crash_skip + 1, last + crash_skip)
            for stream, (first, last) in streams.items()
        }
        last_id += crash_skip
    conn.execute(SET_COUNTER, (RUNNING, 1))
    appends = [
        AppendKey(*row)
        for row in conn.execute(
            "SELECT stream, key, first_seq, last_seq FROM stream_appends ORDER BY created"
        )
    ]
    pair = dict(conn.execute("SELECT name, value FROM pair_state").fetchall())
    owners = {
        address: (user, claimed) for address, user, claimed in reads.owners_page(conn, None, -1)
    }
    recovered = Recovered(
        streams, queued, appends, lasts, before_skip, pair, owners, reads.consumers(conn)
    )
    return recovered, crashed, last_id
