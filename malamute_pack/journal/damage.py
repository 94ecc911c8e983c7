"""
What the journal knows it cannot serve, kept in the reactor thread: per
stream the stretches of sequence numbers whose records are damaged (found
by a verified read, :mod:`malamute_pack.journal.verify`) or were lost (by
a salvage of a damaged file, :mod:`malamute_pack.journal.salvage`, which
the ``journal_losses`` table keeps across restarts).

The broker asks it (:meth:`Damage.lost`, the store's ``lost``) which
stretches fall in what a read covered, and tells each reader a gap for
each, as for records retention removed: a damaged record is never served
as good, and never skipped in silence. Each stretch is logged once, at
most L{LOG_PER_SECOND} lines a second (the rest counted in the next line
that is logged); each damaged record and letter is counted once
(``damaged_records`` of the journal's statistics).

Tests: ``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Final

from twisted.logger import Logger

from malamute_pack.journal.handover import JournalCounters
from malamute_pack.journal.verify import Found

_log = Logger()

# Lines a second the damage found may log; the rest are counted.
LOG_PER_SECOND: Final = 5
# Damaged records and letters remembered (to count each once) at most.
_MOST_REMEMBERED: Final = 1_000_000


class Damage:
    """
    The stretches of each stream the journal at C{path} cannot serve, and
    the damaged records and letters met (counted in C{counters}); C{seconds}
    is the clock (for the log's rate).
    """

    def __init__(self, path: str, seconds: Callable[[], float], counters: JournalCounters) -> None:
        self._path = path
        self._seconds = seconds
        self._counters = counters
        # Per stream, sorted disjoint [first, last] stretches, as two lists.
        self._firsts: dict[str, list[int]] = {}
        self._lasts: dict[str, list[int]] = {}
        self._records: set[tuple[str, int]] = set()
        self._letters: set[int] = set()
        self._second = -1
        self._logged = 0
        self._unlogged = 0

    def clear(self, streams: Iterable[str] | None = None) -> None:
        """Forget the stretches of C{streams} (all of them: None): they were filled again."""
        for stream in list(self._firsts) if streams is None else streams:
            self._firsts.pop(stream, None)
            self._lasts.pop(stream, None)

    def replaced(
        self, stream: str, first: int, last: int, still: Iterable[tuple[int, int]]
    ) -> list[tuple[int, int]]:
        """
        C{stream}'s stretches, in order, if those in C{first}..C{last}
        became C{still} (within it): the rest filled again (copied from a
        pair's partner). Nothing changes here (L{put}).
        """
        pieces: list[tuple[int, int]] = list(still)
        for a, b in zip(self._firsts.get(stream, []), self._lasts.get(stream, []), strict=True):
            if a < first:
                pieces.append((a, min(b, first - 1)))
            if b > last:
                pieces.append((max(a, last + 1), b))
        return sorted(pieces)

    def put(self, stream: str, stretches: Sequence[tuple[int, int]]) -> None:
        """C{stream}'s stretches are C{stretches} (sorted, disjoint) from now on."""
        if stretches:
            self._firsts[stream] = [a for a, _ in stretches]
            self._lasts[stream] = [b for _, b in stretches]
        else:
            self.clear([stream])

    def stretches(self) -> dict[str, list[tuple[int, int]]]:
        """Every stretch of every stream, in order."""
        return {
            stream: list(zip(firsts, self._lasts[stream], strict=True))
            for stream, firsts in self._firsts.items()
            if firsts
        }

    def losses(self) -> dict[str, int]:
        """Per stream with a stretch, the first number it cannot serve."""
        return {stream: firsts[0] for stream, firsts in self._firsts.items() if firsts}

    def lost(self, stream: str, first: int, last: int) -> list[tuple[int, int]]:
        """The stretches of C{stream} that fall in C{first}..C{last}, clipped to it, in order."""
        firsts = self._firsts.get(stream)
        if not firsts or first > last:
            return []
        lasts = self._lasts[stream]
        start = bisect_left(lasts, first)
        end = bisect_right(firsts, last)
        return [(max(firsts[i], first), min(lasts[i], last)) for i in range(start, end)]

    def add(self, stream: str, first: int, last: int, why: str, *, quiet: bool = False) -> bool:
        """
        Remember that C{stream} cannot serve C{first}..C{last} (C{why});
        logged unless C{quiet} or already known. Whether it was new.
        """
        if first > last:
            return False
        known = self.lost(stream, first, last)
        if known and known[0] == (first, last):
            return False
        firsts = self._firsts.setdefault(stream, [])
        lasts = self._lasts.setdefault(stream, [])
        # Merge with every stretch it touches.
        start = bisect_left(lasts, first - 1)
        end = bisect_right(firsts, last + 1)
        if start < end:
            first = min(first, firsts[start])
            last = max(last, lasts[end - 1])
        firsts[start:end] = [first]
        lasts[start:end] = [last]
        if not quiet:
            self._log(
                "journal {path}: stream {stream!r} records {first}-{last} cannot be served"
                " ({why}); its readers are told of a gap",
                stream=stream,
                first=first,
                last=last,
                why=why,
            )
        return True

    def found(self, found: Found, stream_last: Callable[[str], int]) -> None:
        """
        Take what a read found: its stretches (none past C{stream_last} of
        its stream: a stretch open at the end of what the file showed
        reaches no further than what was written), its damaged records and
        letters (counted once each).
        """
        for stream, first, last, why in found.spans:
            self.add(stream, first, min(last, max(first, stream_last(stream))), why)
        for key in found.records:
            if key not in self._records and len(self._records) < _MOST_REMEMBERED:
                self._records.add(key)
                self._counters.damaged_records += 1
        for rid, why in found.letters:
            if rid not in self._letters and len(self._letters) < _MOST_REMEMBERED:
                self._letters.add(rid)
                self._counters.damaged_records += 1
                self._log(
                    "journal {path}: letter {id} is damaged ({why}): not served",
                    id=rid,
                    why=why,
                )
        for after, before, why in found.letter_stretches:
            self._log(
                "journal {path}: letters {after}-{before} (ids between) cannot be read"
                " ({why}): not served",
                after=after + 1,
                before=before - 1,
                why=why,
            )

    def _log(self, text: str, **fields: object) -> None:
        second = int(self._seconds())
        if second != self._second:
            self._second = second
            self._logged = 0
        if self._logged >= LOG_PER_SECOND:
            self._unlogged += 1
            return
        self._logged += 1
        unlogged, self._unlogged = self._unlogged, 0
        more = f" ({unlogged} more lines of damage not logged)" if unlogged else ""
        _log.error(text + "{more}", path=self._path, more=more, **fields)
