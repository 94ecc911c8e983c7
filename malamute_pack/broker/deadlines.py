"""
Times at which letters must be looked at again: the deadline of a letter
sent with a timeout (expire it if it is still queued) and the lease of a
service request a worker holds (give it back to the queue if the worker
still holds it).

A heap keyed by time, with at most one entry per letter and time: adding a
letter again for the time it is already in for does nothing (a letter
requeued before its deadline keeps its one entry), and an entry that comes
up for a letter no longer in the state it was added for, or due at another
time now (a new lease), is dropped lazily, so handing a letter over costs
nothing here.

Tests: ``tests/unit/test_broker_letters.py``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from malamute_pack.broker.letters import Letter, LetterState


class DueLetters:
    """
    Letters due at a time, each at most once.

    @param when: the time a letter is due (None: never).
    @param state: the state a letter must still be in when it comes due.
    """

    def __init__(self, when: Callable[[Letter], float | None], state: LetterState) -> None:
        self._when = when
        self._state = state
        self._heap: list[tuple[float, int, Letter]] = []
        self._order = itertools.count()
        self._entered: set[tuple[int, float]] = set()  # (id() of a letter, its time)

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, letter: Letter) -> None:
        """Watch C{letter} until its time (once, however often it is added)."""
        when = self._when(letter)
        if when is None or (id(letter), when) in self._entered:
            return
        self._entered.add((id(letter), when))
        heapq.heappush(self._heap, (when, next(self._order), letter))

    def _due(self, entry: tuple[float, int, Letter]) -> bool:
        """Whether C{entry}'s letter is still due at its entry's time."""
        letter = entry[2]
        return letter.state is self._state and self._when(letter) == entry[0]

    def _pop(self) -> Letter:
        when, _, letter = heapq.heappop(self._heap)
        self._entered.discard((id(letter), when))
        return letter

    def next_time(self) -> float | None:
        """The earliest time a watched letter is due, if any."""
        while self._heap and not self._due(self._heap[0]):
            self._pop()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[Letter]:
        """The letters due at or before C{now}, each once, no longer watched."""
        due: list[Letter] = []
        while self._heap and self._heap[0][0] <= now:
            entry = self._heap[0]
            still = self._due(entry)
            letter = self._pop()
            if still:
                due.append(letter)
        return due


class Deadlines(DueLetters):
    """Queued letters, due at their deadline (expired if still queued)."""

    def __init__(self) -> None:
        super().__init__(lambda letter: letter.deadline, LetterState.QUEUED)


class Leases(DueLetters):
    """Held service requests, due when their lease ends (requeued if still held)."""

    def __init__(self) -> None:
        super().__init__(lambda letter: letter.lease_until, LetterState.HELD)
