"""
What a protocol version 2 client has already handed to the application, so
that a record the broker sends again is dropped: stream records by stream
and sequence number, mailbox and service records by id. Both are bounded.

Tests: ``tests/unit/test_client_dedupe.py``.
"""

from __future__ import annotations

from typing import Final

from pyroaring import BitMap64

# Sequence numbers remembered exactly below each stream's highest.
SEQUENCE_WINDOW: Final = 1_000_000
# Ids remembered, most recent first out last.
ID_WINDOW: Final = 100_000
# Adds between two compactions of a stream's set.
_COMPACT_EVERY: Final = 1 << 16


class _Stream:
    __slots__ = ("adds", "seen")

    def __init__(self) -> None:
        self.seen = BitMap64()
        self.adds = 0


class SeenSequences:
    """
    The sequence numbers of each stream handed over.

    Exact, not just the highest: a reader whose stream position moves back
    (several patterns read from EARLIEST, or a resume after a reconnection)
    gets the records the broker sends again that it has not had yet (those
    of another pattern) and none twice. Numbers more than C{window} below a
    stream's highest are forgotten: a record that old, sent again, is
    delivered again (at least once, never lost).
    """

    def __init__(self, window: int = SEQUENCE_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._streams: dict[str, _Stream] = {}

    def add(self, stream: str, sequence: int) -> bool:
        """Record C{sequence} as handed over; False if it already was."""
        entry = self._streams.get(stream)
        if entry is None:
            entry = self._streams[stream] = _Stream()
        seen = entry.seen
        if sequence in seen:
            return False
        seen.add(sequence)
        entry.adds += 1
        if entry.adds % _COMPACT_EVERY == 0 or len(seen) > 2 * self.window:
            self._compact(entry)
        return True

    def discard(self, stream: str, sequence: int) -> None:
        """C{sequence} of C{stream} was not handed over after all: taken if it comes again."""
        entry = self._streams.get(stream)
        if entry is not None:
            entry.seen.discard(sequence)

    def last(self, stream: str) -> int | None:
        """The highest sequence number of C{stream} handed over, if any."""
        entry = self._streams.get(stream)
        return entry.seen.max() if entry is not None and entry.seen else None

    def forget(self, stream: str) -> None:
        """Start C{stream} afresh (the application stopped reading it)."""
        self._streams.pop(stream, None)

    def _compact(self, entry: _Stream) -> None:
        seen = entry.seen
        low = seen.max() - self.window
        if low > seen.min():
            seen.remove_range(seen.min(), low)
        seen.run_optimize()  # consecutive numbers shrink to a few bytes a run


class SeenIds:
    """
    The ids of the last C{window} mailbox and service records handed over,
    each with the DONE status sent for it (None: not answered yet).
    """

    def __init__(self, window: int = ID_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._ids: dict[int, tuple[int, str] | None] = {}  # oldest first

    def __contains__(self, record_id: int) -> bool:
        return record_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def answer(self, record_id: int) -> tuple[int, str] | None:
        """The DONE status sent for C{record_id}, or None if none was."""
        return self._ids.get(record_id)

    def add(self, record_id: int, answer: tuple[int, str] | None = None) -> None:
        """Remember C{record_id} (with its DONE status, once sent)."""
        ids = self._ids
        ids[record_id] = answer
        if len(ids) > self.window:
            del ids[next(iter(ids))]
