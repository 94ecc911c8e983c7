"""
Rate-limited logging of what clients do wrong: a flood of malformed input
or refused commands is counted in full but logged at most a few lines a
second per kind, with the number not logged said when logging resumes, so
an attacker cannot fill the disk or drown the log (L{LogLimit}); and what
repeats about one key for as long as its cause lasts is logged once per
interval per key (L{OncePer}).

Tests: ``tests/unit/test_broker_log_limit.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger


class LogLimit:
    """
    At most C{per_second} lines a second for each kind of event.

    @ivar suppressed: lines not logged, by kind, since the last one logged.
    """

    def __init__(self, clock: IReactorTime, log: Logger, per_second: int = 10) -> None:
        self._clock = clock
        self._log = log
        self._per_second = per_second
        self._window: dict[str, tuple[int, int]] = {}  # kind: (second, lines logged in it)
        self.suppressed: dict[str, int] = {}

    def info(self, kind: str, format: str, /, **fields: object) -> None:
        """Log C{format} at info level unless C{kind} has had its lines this second."""
        second = int(self._clock.seconds())
        window, count = self._window.get(kind, (second, 0))
        if window != second:
            window, count = second, 0
        if count >= self._per_second:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            self._window[kind] = (window, count)
            return
        self._window[kind] = (window, count + 1)
        missed = self.suppressed.pop(kind, 0)
        if missed:
            self._log.info("{missed} more {kind} events were not logged", missed=missed, kind=kind)
        self._log.info(format, **fields)


class OncePer:
    """
    Whether to log what is about one key (a stranger's public key, an
    address): at most once per C{interval} seconds per key, for events that
    repeat for as long as their cause lasts (a stranger's beacon every
    second, its reconnections) and say nothing new the second time. At
    most C{size} keys are remembered: the one logged longest ago is
    forgotten first (and may be logged again).
    """

    def __init__(self, clock: IReactorTime, interval: float, size: int = 1024) -> None:
        self._clock = clock
        self._interval = interval
        self._size = size
        self._logged: OrderedDict[Hashable, float] = OrderedDict()

    def due(self, key: Hashable) -> bool:
        """Whether to log about C{key} now (if so, the next time is C{interval} away)."""
        now = self._clock.seconds()
        last = self._logged.get(key)
        if last is not None and now - last < self._interval:
            return False
        self._logged[key] = now
        self._logged.move_to_end(key)
        while len(self._logged) > self._size:
            self._logged.popitem(last=False)
        return True
