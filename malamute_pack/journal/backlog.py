"""
Backpressure: the bytes of the writes handed to the journal's writer and
not yet reported back, and the watcher told when they pass a limit and
when they are back under half of it (the broker stops reading from its
clients in between, so a journal that falls behind slows the producers
instead of growing the broker's memory).

Each operation's share (:data:`OP_OVERHEAD` plus its content) is counted
as it is handed over, and given back as the writer reports it done, in
hand-over order (the writer reports in that order).

Tests: ``tests/unit/test_journal_backlog.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

# What an operation costs beyond its content: its record, its row's other
# fields, the writer's queue entry.
OP_OVERHEAD: Final = 256


class Backlog:
    """The bytes handed to the writer and not yet done with, and their watcher."""

    def __init__(self) -> None:
        self.bytes = 0
        self._shares: deque[int] = deque()
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
        self._shares.clear()
        if self._over and self._watcher is not None:
            self._watcher(False)
        self._over = False

    def handed(self, shares: list[int], added: int) -> None:
        """Operations handed over, each with its share (``added`` in all)."""
        self._shares.extend(shares)
        self.bytes += added
        watcher = self._watcher
        if watcher and not self._over and self.bytes > self._limit:
            self._over = True
            watcher(True)

    def done(self, operations: int) -> None:
        """The writer is done with the next ``operations`` operations handed over."""
        shares = self._shares
        freed = 0
        for _ in range(min(operations, len(shares))):
            freed += shares.popleft()
        self.bytes -= freed
        if self._over and self.bytes <= self._limit // 2:
            self._over = False
            assert self._watcher is not None
            self._watcher(False)
