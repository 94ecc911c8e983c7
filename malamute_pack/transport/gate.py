"""
The read gate: backpressure from the broker's slowest stage to its
clients. When the journal falls behind (its backlog of writes not yet
committed passes its bound) the gate closes: the broker stops reading its
sockets, what clients send waits in ZeroMQ's queues, and once those are full
in the clients' own (their sends wait: ZeroMQ and TCP backpressure), instead
of the broker's memory growing. It opens again when the backlog is half
drained. While it is closed the broker is deaf: nobody is expired for a
silence the broker caused.

Tests: ``tests/unit/test_transport_gate.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

_log = Logger()


class Pausable(Protocol):
    """Something the gate stops reading (a router's socket)."""

    def pauseReading(self) -> None: ...

    def resumeReading(self) -> None: ...


class ReadGate:
    """
    Pauses every reader it holds while closed.

    @ivar closings: times it closed.
    @ivar closed_for: seconds it has been closed, in all.
    """

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._readers: list[Pausable] = []
        self._watchers: list[Callable[[bool], None]] = []
        self._closed_at: float | None = None
        self.closings = 0
        self.closed_for = 0.0

    @property
    def closed(self) -> bool:
        return self._closed_at is not None

    def add(self, reader: Pausable) -> None:
        """Gate C{reader} too (paused at once if the gate is closed)."""
        self._readers.append(reader)
        if self.closed:
            reader.pauseReading()

    def remove(self, reader: Pausable) -> None:
        if reader in self._readers:
            self._readers.remove(reader)

    def watch(self, callback: Callable[[bool], None]) -> None:
        """
        Call C{callback(False)} every time the gate closes and
        C{callback(True)} every time it opens again (the broker's
        L{listening<malamute_pack.broker.broker.Broker.listening>}).
        """
        self._watchers.append(callback)

    def backlog(self, over: bool) -> None:
        """The stage behind the gate is over its bound (close) or back under it (open)."""
        if over:
            self.close()
        else:
            self.open()

    def close(self) -> None:
        if self.closed:
            return
        self._closed_at = self._clock.seconds()
        self.closings += 1
        _log.info("journal behind: not reading from clients until it catches up")
        for callback in self._watchers:
            callback(False)
        for reader in self._readers:
            reader.pauseReading()

    def open(self) -> None:
        if self._closed_at is None:
            return
        paused = self._clock.seconds() - self._closed_at
        self.closed_for += paused
        self._closed_at = None
        _log.info("journal caught up after {paused:.3f}s: reading again", paused=paused)
        for callback in self._watchers:
            callback(True)
        for reader in self._readers:
            reader.resumeReading()
