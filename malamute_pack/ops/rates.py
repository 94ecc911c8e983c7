"""
Rates from cumulative counters: samples taken once a second, and the rate
of each counter over the last few seconds, as the management API and the
dashboard show them.

Tests: ``tests/unit/test_ops_stats.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Final

# Seconds the rates are averaged over.
RATE_WINDOW: Final = 5.0
# One-second samples of the rates kept (five minutes).
HISTORY: Final = 300


class Rates:
    """
    The samples of some named cumulative counters: L{add} one (its time
    and the counters' values), then L{rates} is per counter the increase
    per second from the newest sample back over L{RATE_WINDOW} seconds,
    and L{history} the per-second rate between each pair of samples.
    """

    def __init__(self, window: float = RATE_WINDOW, history: int = HISTORY) -> None:
        self._window = window
        # Enough samples for the window at one a second, and one more.
        self._recent: deque[tuple[float, dict[str, int]]] = deque(maxlen=int(window) + 2)
        self.history: deque[dict[str, float]] = deque(maxlen=history)

    def add(self, t: float, counters: Mapping[str, int]) -> None:
        """Counters as they were at time C{t} (after every earlier sample)."""
        values = dict(counters)
        if self._recent:
            last_t, last = self._recent[-1]
            elapsed = t - last_t
            if elapsed <= 0:
                return
            entry: dict[str, float] = {"t": t}
            for name, value in values.items():
                entry[name] = max(0, value - last.get(name, 0)) / elapsed
            self.history.append(entry)
        self._recent.append((t, values))

    def rates(self) -> dict[str, float]:
        """Per counter its increase per second over the window (0.0 before two samples)."""
        if len(self._recent) < 2:
            return {name: 0.0 for name in self._recent[-1][1]} if self._recent else {}
        t, newest = self._recent[-1]
        old_t, oldest = self._recent[0]
        for sample_t, sample in self._recent:
            if t - sample_t <= self._window:
                old_t, oldest = sample_t, sample
                break
        elapsed = t - old_t
        if elapsed <= 0:
            old_t, oldest = self._recent[-2]
            elapsed = t - old_t
        return {
            name: round(max(0, value - oldest.get(name, 0)) / elapsed, 3)
            for name, value in newest.items()
        }
