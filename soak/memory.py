"""
The memory of a soak's processes: the resident set size of every broker
and client process, sampled every few seconds (L{Sampler}), for the
checker's bound (L{soak.checker}, C{memory}) and the report's figures: each
broker's memory at the start of the soak, at its end and at most.

Tests: ``tests/unit/test_soak_checker.py`` (the bound);
``tests/system/test_soak.py`` (the sampling).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from soak.checker import Sample

# Where a process is found: its name, kind (broker, client) and pid (None: not running).
Located = tuple[str, str, int | None]


class Sampler:
    """
    Samples the processes C{locate} names every C{every} seconds (L{step}),
    or now (L{sample}).
    """

    def __init__(
        self,
        locate: Callable[[], Iterable[Located]],
        rss: Callable[[int], int | None],
        t0: float,
        every: float = 5.0,
    ) -> None:
        self._locate = locate
        self._rss = rss
        self.t0 = t0
        self.every = every
        self.samples: list[Sample] = []
        self._next = 0.0

    def step(self) -> None:
        if time.monotonic() >= self._next:
            self.sample()

    def sample(self) -> None:
        now = time.monotonic()
        self._next = now + self.every
        for name, kind, pid in self._locate():
            if pid is None:
                continue
            rss = self._rss(pid)
            if rss is not None:
                self.samples.append(Sample(now - self.t0, name, kind, rss))


def figures(samples: Sequence[Sample], kind: str) -> dict[str, dict[str, Any]]:
    """Per process of C{kind}: its first, last and largest sample, in MiB."""
    out: dict[str, dict[str, Any]] = {}
    for sample in samples:
        if sample.kind != kind:
            continue
        mib = round(sample.rss / 2**20, 1)
        entry = out.setdefault(sample.process, {"start_mib": mib, "max_mib": mib})
        entry["end_mib"] = mib
        entry["max_mib"] = max(entry["max_mib"], mib)
    return out
