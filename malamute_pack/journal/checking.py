"""
Finding a damaged journal file when it opens, before anything is written
to it: a file shorter than SQLite's header, one SQLite cannot open as a
database, one whose pages SQLite finds damaged (``PRAGMA quick_check``),
or one holding a record whose checksum does not match
(:mod:`malamute_pack.journal.checksums`). A damaged file is salvaged
(:mod:`malamute_pack.journal.salvage`) instead of opened.

The checks read the whole file (about 0.7 s a GB when the file is cached,
20 s or more from a cold disk: docs/operations.md), so they run when they
are worth it: by default (``crash``) after an unclean stop (the ``running``
counter still 1: a crash, a kill -9, a lost machine) and at every open of
a file under L{SMALL_BYTES}; on every open (``always``) or never as the
config says (``malamute/journal/check-at-open``). The file is opened read-only for
them (nothing of it changes, not even a checkpoint of its WAL).

Tests: ``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from contextlib import closing
from operator import eq
from pathlib import Path
from typing import Final

from malamute_pack.journal.checksums import CHECKSUM_ERRORS, stream_checksums
from malamute_pack.journal.scan import describe
from malamute_pack.journal.schema import RUNNING
from malamute_pack.journal.verify import sane_record

# SQLite's file header: a database file is at least this long.
HEADER_BYTES: Final = 100
# A file smaller than this is checked at every open (``crash``): it costs
# about 50 ms when cached, 2 s from a slow disk.
SMALL_BYTES: Final = 64 * 1024 * 1024
# SQLite's primary result codes that say a file is damaged (not busy, not full).
_DAMAGE_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_BLOCK: Final = 1000
_RECORDS: Final = (
    "SELECT rowid, stream, seq, ts, sender, subject, content, origin, origin_seq, checksum"
    " FROM stream_messages"
)
# Lines of quick_check's answer kept in the reason.
_PROBLEMS: Final = 3


def damage_error(exc: BaseException) -> bool:
    """
    Whether C{exc}, raised reading a journal file, says the file is damaged
    (SQLite's corrupt or not-a-database error, or a column it cannot
    decode), not that it is busy, locked or on a full disk, nor that the
    code refuses it (a newer schema).
    """
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _DAMAGE_CODES
    return "decode" in str(exc)


def read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the file at C{path} (its WAL read, never checkpointed)."""
    uri = f"file:{urllib.parse.quote(str(path.absolute()))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    return conn


def find_damage(path: Path, check: str) -> str | None:
    """
    Why the journal file at C{path} is damaged, or None. C{check} says when
    the whole file is read (L{malamute_pack.journal.config.CHECKS_AT_OPEN}).
    Raises what SQLite raises that is not damage.
    """
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None  # a new journal (a missing one the marker refuses)
    if size == 0:
        return None  # a new journal (an emptied one the marker refuses)
    if size < HEADER_BYTES:
        return f"the file is {size} bytes long, shorter than SQLite's header ({HEADER_BYTES})"
    try:
        with closing(read_only(path)) as conn:
            crashed = _running(conn)
            if check == "always" or (check == "crash" and (crashed or size < SMALL_BYTES)):
                return _quick_check(conn) or check_records(conn)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except (sqlite3.Error, ValueError, OverflowError) as exc:
        if damage_error(exc):
            return describe(exc)
        raise
    return None


def _running(conn: sqlite3.Connection) -> bool:
    """Whether the journal's last run did not close it cleanly."""
    try:
        row = conn.execute(
            "SELECT value FROM journal_counters WHERE name = ?", (RUNNING,)
        ).fetchone()
    except sqlite3.OperationalError as exc:
        if damage_error(exc):
            raise
        return False  # no such table: a journal not made yet
    return row not in (None, (0,))


def _quick_check(conn: sqlite3.Connection) -> str | None:
    """What C{PRAGMA quick_check} finds wrong with the file's pages, or None."""
    rows = [
        " ".join(str(row[0]).split()) for row in conn.execute(f"PRAGMA quick_check({_PROBLEMS})")
    ]
    if rows == ["ok"]:
        return None
    return "PRAGMA quick_check: " + "; ".join(rows)


def check_records(conn: sqlite3.Connection) -> str | None:
    """
    The first stream record of the file whose checksum does not match (or,
    written before checksums, whose columns are not a record's), or None.
    """
    try:
        conn.execute("SELECT checksum FROM stream_messages LIMIT 0")
    except sqlite3.OperationalError as exc:
        if damage_error(exc):
            raise
        return None  # an older journal, or none yet: nothing to check
    # A walk of the whole table (it ends, whatever the damage).
    cursor = conn.execute(_RECORDS)
    while block := cursor.fetchmany(_BLOCK):
        _, streams, seqs, stamps, senders, subjects, contents, origins, oseqs, sums = zip(
            *block, strict=True
        )
        try:
            computed: list[int | None] = list(
                stream_checksums(streams, seqs, stamps, senders, subjects, contents, origins, oseqs)
            )
            if all(map(eq, computed, sums)):
                continue
        except CHECKSUM_ERRORS:  # a column of the wrong type: row by row
            computed = [None] * len(block)
        for row, checksum in zip(block, computed, strict=True):
            if checksum is not None and checksum == row[9]:
                continue
            if row[9] is None and sane_record(row[2:]):
                continue
            return f"stream {row[1]!r} record {row[2]}: its checksum does not match"
    return None
