"""
Stalled connections: those whose session could not take a delivery (what
it was sent before is not drained yet: ZeroMQ's queue to that peer is at
its high-water mark). Nothing more is pushed at a stalled connection; its
stream reading falls behind onto the journal (or, with no journal, it
misses live messages, counted, while others go on), its letters stay
queued. A timer retries every stalled connection now and then: whatever is
owed it is tried again, and a connection still full stalls again.

This is the whitepaper's rule for readers that do not keep up: the broker
discards live data for that reader only and serves it on demand later; it
never slows the others, and never grows its memory for it.

Tests: ``tests/unit/test_broker_stalls.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.interfaces import IDelayedCall, IReactorTime

from malamute_pack.broker.connection import Connection


class Stalled:
    """
    The stalled connections and their retry timer.

    @ivar stalls: times a connection stalled.
    """

    def __init__(
        self, clock: IReactorTime, interval: float, retry: Callable[[Connection], None]
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._retry = retry
        self._waiting: dict[Connection, None] = {}  # in the order they stalled
        self._call: IDelayedCall | None = None
        self.stalls = 0

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, connection: Connection) -> None:
        """C{connection}'s session could not take a delivery: wait, then try again."""
        if connection.stalled:
            return
        connection.stalled = True
        self.stalls += 1
        self._waiting[connection] = None
        if self._call is None:
            self._call = self._clock.callLater(self._interval, self._try_again)

    def _try_again(self) -> None:
        self._call = None
        waiting, self._waiting = self._waiting, {}
        for connection in waiting:
            connection.stalled = False
            if not connection.gone:
                self._retry(connection)

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
