"""
Opening a journal file and recovering its state: check it against the data
directory's marker (:mod:`malamute_pack.journal.identity`), create or
migrate its schema, read back what it holds (:class:`Recovered`: streams
and their numbers, letters, append keys, owners, a pair's state) and mark
it running, so that the next open knows whether this run crashed. After a
crash, or at a pair's takeover, numbering jumps past what may have been
handed out and never committed.

A damaged file is never opened as it is: one shorter than SQLite's header
(an empty one where the marker says a journal was made), one SQLite cannot
read, or, after an unclean stop (``check_at_open``), one whose pages or
records fail their checks (:mod:`malamute_pack.journal.checking`), or one
SQLite fails on while it is opened and recovered, is salvaged
(:mod:`malamute_pack.journal.salvage`): the damaged file is kept aside, a
new one with the same identity holds what could be saved, and the open
goes on with it (``Opened.salvage`` says what was lost). A letter damaged
in a file that opens is left out of what is recovered (``Recovered.found``).

Blocks on the disk: :meth:`Journal.open<malamute_pack.journal.journal.Journal.open>`
calls it at startup.

Tests: ``tests/unit/test_journal_opening.py``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from malamute_pack.journal import reads
from malamute_pack.journal.checking import damage_error, find_damage
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.identity import (
    Marker,
    check_file,
    check_identity,
    read_marker,
    write_marker,
)
from malamute_pack.journal.salvage import Salvage, finish_interrupted, salvage
from malamute_pack.journal.scan import describe
from malamute_pack.journal.schema import (
    ADD_SKIP,
    QUEUED_LAST_ID,
    RAISE_COUNTER,
    RUNNING,
    STREAM_FLOOR,
    STREAMS_NUMBERED,
    journal_identity,
    migrate,
)
from malamute_pack.journal.verify import Found
from malamute_pack.journal.wal import WalCut, repair, shm_path, wal_path
from malamute_pack.journal.wal import check as check_wal
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
    # The stretches of stream records a salvage lost (stream, first, last, why).
    losses: list[tuple[str, int, int, str]] = field(default_factory=list)
    # Where the numbers of a stream the journal does not know start after.
    stream_floor: int = 0
    # The damage met while recovering (letters left out).
    found: Found = field(default_factory=Found)


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
    # What a salvage of the damaged file did before it opened, if one ran.
    salvage: Salvage | None = None
    # Why its write-ahead log was repaired before it opened, if it was.
    wal_repaired: str | None = None


def open_journal(
    path: Path,
    marker: Path | None,
    crash_skip: int,
    *,
    takeover: bool = False,
    check: str = "crash",
    now: Callable[[], float] = time.time,
) -> Opened:
    """
    Open (creating or migrating) the journal at ``path``, checked against
    ``marker`` if there is one, and recover it; with ``takeover``, or after
    a crash, numbering jumps ``crash_skip`` ahead. A damaged file (found as
    ``check`` says, or met while opening) is salvaged first. Raises
    JournalError.
    """
    salvaged: Salvage | None = None
    try:
        finish_interrupted(path)
        expected = _check_file(path, marker)
        path.parent.mkdir(parents=True, exist_ok=True)
        wal_repaired = _check_wal(path)
        # A repaired log may have brought back a damaged page: read it all.
        why = find_damage(path, "always" if wal_repaired else check)
        if why is not None:
            salvaged = _salvage(path, why, expected, crash_skip, now())
        try:
            opened = _open(path, marker, expected, crash_skip, takeover)
        except (sqlite3.Error, ValueError, OverflowError) as exc:
            if salvaged is not None or not damage_error(exc):
                raise
            # Damage the checks did not look for (a clean stop): salvaged now.
            salvaged = _salvage(path, describe(exc), expected, crash_skip, now())
            opened = _open(path, marker, expected, crash_skip, takeover)
    except (sqlite3.Error, ValueError, OSError, JournalError) as exc:
        if isinstance(exc, JournalError):
            raise
        raise JournalError.wrap(exc, path, "opening") from exc
    return Opened(*opened, salvage=salvaged, wal_repaired=wal_repaired)


def _check_wal(path: Path) -> str | None:
    """
    Check the journal's write-ahead log before SQLite reads it
    (L{malamute_pack.journal.wal}): repair one damaged in place (saying
    why), refuse one cut short.

    @raise WalCut: the log lost frames that were committed.
    """
    state = check_wal(path)
    if state.cut:
        raise WalCut(
            f"journal {path}: its write-ahead log {wal_path(path)} was cut short: it holds "
            f"{max(state.ours, state.valid)} frames of its writes, but {state.committed} were "
            f"committed to it (its index {shm_path(path)} says so). The writes after them "
            f"(acknowledged letters, stream records, positions) are not in it, so the broker "
            f"refuses to start rather than lose them silently. Restore the journal's files from "
            f"a backup; or, to go on with what is left on purpose (what was cut stays lost), "
            f"remove {shm_path(path)}."
        )
    if not state.damaged:
        return None
    where = "its header" if not state.header_ok else f"frame {state.valid + 1}"
    repair(path, state)
    return (
        f"its write-ahead log was damaged at {where} of {state.ours}: SQLite would have dropped "
        f"every write from there on; the log was repaired so that they are kept, and the journal "
        f"checked whole"
    )


def _salvage(path: Path, why: str, expected: Marker | None, crash_skip: int, now: float) -> Salvage:
    if expected is None:
        return salvage(path, why, None, crash_skip, now)
    given = (expected.numbered, expected.letters)
    return salvage(path, why, expected.identity, crash_skip, now, given)


def _open(
    path: Path, marker: Path | None, expected: Marker | None, crash_skip: int, takeover: bool
) -> tuple[sqlite3.Connection, sqlite3.Connection, Recovered, str, bool, int]:
    """The journal at ``path`` opened and recovered; raises what SQLite raises."""
    conn: sqlite3.Connection | None = None
    reader: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout = 10000")
        migrate(conn)
        identity, created = _check_identity(conn, path, marker, expected)
        recovered, crashed, last_id = recover(conn, crash_skip, takeover)
        if marker is not None:
            _mark_numbers(marker, path, identity, created, expected, recovered, last_id)
        reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        reader.execute("PRAGMA busy_timeout = 10000")
        reader.execute("PRAGMA query_only = ON")
    except BaseException:
        for c in (conn, reader):
            if c is not None:
                c.close()
        raise
    return conn, reader, recovered, identity, crashed, last_id


def _check_file(path: Path, marker: Path | None) -> Marker | None:
    """
    The marker, if there is one; refuses a journal file that is missing or
    empty where the marker says a journal was created (nothing in it to
    salvage: only the operator can restore it or start afresh).
    """
    if marker is None:
        return None
    expected = read_marker(marker)
    if expected is not None:
        check_file(path, marker, expected)
    return expected


def _check_identity(
    conn: sqlite3.Connection, path: Path, marker: Path | None, expected: Marker | None
) -> tuple[str, float]:
    """
    The journal's identity and creation time; refuses one that is not the
    marker's (a new marker is written once its numbers are known).
    """
    identity, created = journal_identity(conn)
    if marker is not None and expected is not None:
        check_identity(path, marker, expected, identity)
    return identity, created


def _mark_numbers(
    marker: Path,
    path: Path,
    identity: str,
    created: float,
    expected: Marker | None,
    recovered: Recovered,
    last_id: int,
) -> None:
    """
    Record in the marker the highest stream number and letter id the
    journal may give before it next opens (its crash skip past what it
    holds), where they passed what the marker says: a salvage that cannot
    read them in the file numbers past them (found by the soak: a journal
    truncated twice lost its streams table and counters, and numbered from
    a million again).
    """
    numbered = _numbered(recovered.streams, recovered.stream_floor)
    if expected is not None and numbered <= expected.numbered and last_id <= expected.letters:
        return
    had = expected or Marker("", "", 0.0)
    write_marker(
        marker,
        Marker(
            str(path.resolve()),
            identity,
            created,
            max(numbered, had.numbered),
            max(last_id, had.letters),
        ),
    )


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
    found = Found()
    queued = reads.all_queued(conn, found)
    last_id = max(
        _counter(conn, QUEUED_LAST_ID),
        queued[-1].id if queued else 0,
        max((rid for rid, _ in found.letters), default=0),
    )
    crashed = conn.execute(
        "SELECT value FROM journal_counters WHERE name = ?", (RUNNING,)
    ).fetchone() not in (None, (0,))
    lasts = {stream: last for stream, (_, last) in streams.items()}
    before_skip = last_id
    floor = _counter(conn, STREAM_FLOOR)
    if crashed or takeover:
        # Numbers handed out before the crash but never committed (live
        # deliveries, ids of letters being written) must not come again:
        # jump past them. Readers see the hole; nothing is reused. So does a
        # stream the journal does not know (none of its records committed:
        # a full disk): it starts past the crash skip (a salvage's floor
        # already is).
        streams = {
            stream: (first if first <= last else last + crash_skip + 1, last + crash_skip)
            for stream, (first, last) in streams.items()
        }
        _note_skips(conn, lasts, streams, crash_skip)
        last_id += crash_skip
        if floor < crash_skip:
            floor = crash_skip
            conn.execute(SET_COUNTER, (STREAM_FLOOR, floor))
    conn.execute(RAISE_COUNTER, (STREAMS_NUMBERED, _numbered(streams)))
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
    losses: list[tuple[str, int, int, str]] = conn.execute(
        "SELECT stream, first_seq, last_seq, reason FROM journal_losses ORDER BY stream, first_seq"
    ).fetchall()
    recovered = Recovered(
        streams,
        queued,
        appends,
        lasts,
        before_skip,
        pair,
        owners,
        reads.consumers(conn),
        losses,
        floor,
        found,
    )
    return recovered, crashed, last_id


def _numbered(streams: dict[str, tuple[int, int]], floor: int = 0) -> int:
    """
    The highest stream number a journal holding C{streams} (first, last:
    past a crash's skip) may give before it next opens, or C{floor} (where a
    stream it does not know starts after) if that is higher.
    """
    return max(floor, max((last for _, last in streams.values()), default=0))


def _note_skips(
    conn: sqlite3.Connection,
    lasts: dict[str, int],
    streams: dict[str, tuple[int, int]],
    crash_skip: int,
) -> None:
    """
    Record that each stream skips the C{crash_skip} numbers past its last
    (a salvage does not count them as lost), and forget the skips below a
    stream's first retained record or of a stream that is gone.
    """
    conn.executemany(ADD_SKIP, [(s, last + 1, last + crash_skip) for s, last in lasts.items()])
    conn.executemany(
        "DELETE FROM stream_skips WHERE stream = ? AND last_seq < ?",
        [(stream, first) for stream, (first, _) in streams.items()],
    )
    conn.execute("DELETE FROM stream_skips WHERE stream NOT IN (SELECT stream FROM streams)")


def _counter(conn: sqlite3.Connection, name: str) -> int:
    row: Any = conn.execute("SELECT value FROM journal_counters WHERE name = ?", (name,)).fetchone()
    return int(row[0]) if row else 0
