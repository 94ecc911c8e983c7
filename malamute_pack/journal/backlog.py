"""
Backpressure: the bytes of the writes handed to the journal's writer and
not yet reported back, and the watcher told when they pass a limit and
when they are back under half of it (the broker stops reading from its
clients in between, so a journal that falls behind slows the producers
instead of growing the broker's memory).

Each operation's share (:data:`OP_OVERHEAD` plus its content) is counted
as it is handed over, and given back as the writer reports it done, in
hand-over order (the writer reports in that order). The shares are kept
per hand-over, not per operation: a batch the writer reports takes whole
hand-overs at once, and only the one it ends in is split.

Tests: ``tests/unit/test_journal_backlog.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

# What an operation costs beyond its content: its record, its row's other
# fields, the writer's queue entry.
OP_OVERHEAD: Final = 256


@dataclass(slots=True)
class _HandedOver:
    """
    One hand-over's operations not yet done with: the share of operation
    ``i`` is ``overhead + shares[i]``, for ``i`` from ``first`` on, and
    ``left`` is the sum of those.
    """

    overhead: int
    shares: list[int]
    first: int
    left: int


class Backlog:
    """The bytes handed to the writer and not yet done with, and their watcher."""

    def __init__(self) -> None:
        self.bytes = 0
        self._handed: deque[_HandedOver] = deque()
        self._limit = 0
        self._watcher: Callable[[bool], None] | None = None
        self._over = False

    def watch(self, limit: int, callback: Callable[[bool], None]) -> None:
        """
        Call ``callback(True)`` when the backlog passes ``limit`` bytes, and
        ``callback(False)`` once it is back under half of it.
        """
        self._limit = limit
        self._watcher = callback

    def reset(self) -> None:
        """Nothing is behind (the journal opened again): a watcher told otherwise hears so."""
        self.bytes = 0
        self._handed.clear()
        if self._over and self._watcher is not None:
            self._watcher(False)
        self._over = False

    def handed(self, shares: list[int], added: int, overhead: int = 0) -> None:
        """
        Operations handed over, each with its share: ``overhead`` plus its
        entry in ``shares`` (``added`` in all).
        """
        if shares:
            self._handed.append(_HandedOver(overhead, shares, 0, added))
        self.bytes += added
        watcher = self._watcher
        if watcher and not self._over and self.bytes > self._limit:
            self._over = True
            watcher(True)

    def done(self, operations: int) -> None:
        """The writer is done with the next ``operations`` operations handed over."""
        handed = self._handed
        freed = 0
        while operations > 0 and handed:
            entry = handed[0]
            count = len(entry.shares) - entry.first
            if operations >= count:
                handed.popleft()
                freed += entry.left
                operations -= count
                continue
            end = entry.first + operations
            part = entry.overhead * operations + sum(entry.shares[entry.first : end])
            entry.first = end
            entry.left -= part
            freed += part
            break
        self.bytes -= freed
        if self._over and self.bytes <= self._limit // 2:
            self._over = False
            assert self._watcher is not None
            self._watcher(False)
