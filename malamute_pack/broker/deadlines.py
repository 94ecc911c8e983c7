"""
Deadlines of letters sent with a timeout: which are due at a given time.

A heap keyed by deadline; letters delivered before their deadline are
skipped lazily when they come up, so delivery costs nothing here.

Tests: ``tests/test_broker_letters.py``.
"""

from __future__ import annotations

import heapq
import itertools

from malamute_pack.broker.letters import Letter, LetterState


class Deadlines:
    """Letters waiting in a queue that have a deadline."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Letter]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, letter: Letter) -> None:
        assert letter.deadline is not None
        heapq.heappush(self._heap, (letter.deadline, next(self._order), letter))

    def next_deadline(self) -> float | None:
        """The earliest deadline of a letter still queued, if any."""
        while self._heap and self._heap[0][2].state is not LetterState.QUEUED:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Letter]:
        """The queued letters whose deadline is at or before C{now}."""
        due: list[Letter] = []
        while self._heap and self._heap[0][0] <= now:
            letter = heapq.heappop(self._heap)[2]
            if letter.state is LetterState.QUEUED:
                due.append(letter)
        return due
