"""
Reading past the damaged parts of a journal file: what a read does when
SQLite fails on a page ("database disk image is malformed", text that is
not UTF-8), so that what can be read still is, and what cannot is named.

:func:`next_readable` finds, by bisection over a numeric key (a rowid, a
sequence number), the first key from which a probe reads again: a damaged
page fails every probe that lands in its range and none past it, so a few
dozen probes step over it, however many keys it held.
:class:`RowidScan` walks a table by its rowid a block at a time and, where
a block fails, row by row, stepping over what cannot be read: each row it
reads, and each stretch of rowids it could not (:class:`Unreadable`).
A salvage (:mod:`malamute_pack.journal.salvage`) copies a damaged file
with it; the verified reads (:mod:`malamute_pack.journal.verify`) use
:func:`next_readable` over sequence numbers.

Tests: ``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

# The largest key SQLite has (rowids and sequence numbers are signed 64-bit).
MAX_KEY: Final = (1 << 63) - 1

# What a read that meets a damaged file raises: SQLite's corrupt or
# not-a-database errors, an I/O error, text that cannot be decoded (an
# OperationalError), a value Python cannot take.
DAMAGE_ERRORS: Final = (sqlite3.DatabaseError, ValueError, OverflowError)

T = TypeVar("T")


def describe(exc: BaseException) -> str:
    """A short text for a read's failure on a damaged file (for logs and reasons)."""
    text = (str(exc).splitlines() or [type(exc).__name__])[0]
    return text[:120]


def next_readable(probe: Callable[[int], T], low: int, high: int) -> tuple[int, T] | None:
    """
    The least key C{k} in [C{low}, C{high}] for which C{probe(k)} does not
    raise a damage error, and what it returned; None if even
    C{probe(high)} fails. C{probe(k)} reads the first entry at or after
    C{k}: it fails while C{k} falls in (or before, reaching into) a
    damaged stretch, and not past it, so bisection finds where the file
    is readable again.
    """
    if low > high:
        return None
    try:
        last = probe(high)
    except DAMAGE_ERRORS:
        return None
    found: tuple[int, T] = (high, last)
    while low < high:
        middle = (low + high) // 2
        try:
            value = probe(middle)
        except DAMAGE_ERRORS:
            low = middle + 1
            continue
        found = (middle, value)
        high = middle
    return found


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Rowids after C{after} and before C{before} that could not be read, and why."""

    after: int
    before: int
    why: str


class RowidScan:
    """
    The rows of C{table} (its C{columns}, selected after its rowid), in
    rowid order: each as (rowid, *columns), or an L{Unreadable} stretch.
    """

    def __init__(
        self, conn: sqlite3.Connection, table: str, columns: str, block: int = 256
    ) -> None:
        self._conn = conn
        self._block = block
        self._all = f"SELECT rowid, {columns} FROM {table}"
        self._rows = f"SELECT rowid, {columns} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT ?"
        self._key = f"SELECT rowid FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1"

    def __iter__(self) -> Iterator[tuple[Any, ...] | Unreadable]:
        # First a walk of the whole tree, page after page: a damaged key in
        # an inner page misleads a search (which then skips rows without a
        # word), not a walk. Every row is kept (a damaged rowid too: the
        # caller's checks judge the row).
        after = -MAX_KEY - 1
        first = True
        try:
            cursor = self._conn.execute(self._all)
            while block := cursor.fetchmany(self._block):
                for row in block:
                    rowid = row[0]
                    # Where to go on from if the walk fails: the last rowid
                    # read, unless it leaps (a damaged one).
                    if isinstance(rowid, int) and (first or after < rowid <= after + _LEAP):
                        after = rowid
                        first = False
                    yield row
            return
        except DAMAGE_ERRORS:
            pass
        # The walk met a page SQLite cannot read: on from the last rowid
        # read, by searches that step over what cannot be read.
        yield from self._searching(after)

    def _searching(self, after: int) -> Iterator[tuple[Any, ...] | Unreadable]:
        while True:
            try:
                block = self._conn.execute(self._rows, (after, self._block)).fetchall()
            except DAMAGE_ERRORS:
                block = None
            if block is not None:
                rows = _ascending(block, after)
                yield from rows
                if len(block) < self._block and len(rows) == len(block):
                    return
                if rows:
                    after = rows[-1][0]
                    if len(rows) == len(block):
                        continue
            # A block SQLite failed on (or whose rowids went back: a damaged tree).
            step = self._careful(after)
            if step is None:
                return
            yield from step[1]
            after = max(step[0], after + 1)

    def _careful(self, after: int) -> tuple[int, list[tuple[Any, ...] | Unreadable]] | None:
        """
        Past a block that failed: the next row, or the stretch that cannot
        be read, and the rowid to go on after; None at the end.
        """
        if after >= MAX_KEY:
            return None
        why = _OUT_OF_ORDER
        try:
            row = self._conn.execute(self._rows, (after, 1)).fetchone()
        except DAMAGE_ERRORS as exc:
            why = describe(exc)
        else:
            if row is None:
                return None
            if row[0] > after:
                return (row[0], [row])
        # The row after ``after`` cannot be read: is its rowid readable?
        try:
            key = self._probe(after + 1)
        except DAMAGE_ERRORS:
            skipped = next_readable(self._probe, after + 2, MAX_KEY)
            if skipped is None:  # nothing after ``after`` can be read
                return (MAX_KEY, [Unreadable(after, MAX_KEY, why)])
            found, following = skipped
            # Nothing between ``after`` and the next rowid from ``found`` on could be read.
            before = found if following is None else following
            return (found - 1, [Unreadable(after, before, why)])
        if key is None:
            return None
        return (key, [Unreadable(key - 1, key + 1, why)])

    def _probe(self, key: int) -> int | None:
        """The first rowid at or after C{key} (raises if the tree is damaged there)."""
        found = self._conn.execute(self._key, (key,)).fetchone()
        if found is None:
            return None
        rowid = int(found[0])
        if rowid < key:
            raise sqlite3.DatabaseError(_OUT_OF_ORDER)
        return rowid


_OUT_OF_ORDER: Final = "rowids out of order (a damaged tree)"
# A rise of rowids between two rows read one after the other that is taken
# for a damaged rowid, not a real one (more than a journal's retention
# leaves between two rows).
_LEAP: Final = 1 << 24


def _ascending(block: list[tuple[Any, ...]], after: int) -> list[tuple[Any, ...]]:
    """The rows of C{block} up to the first whose rowid does not rise (all, in a sound tree)."""
    for i, row in enumerate(block):
        if row[0] <= after:
            return block[:i]
        after = row[0]
    return block
