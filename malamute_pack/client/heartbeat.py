"""
The client's heartbeat: a CONNECTION_PING every C{interval} seconds once
the broker accepted us, and the time anything was last heard from it, so
that silence for C{timeout} seconds can be told (the core asks, in the
states where silence counts).

Tests: ``tests/unit/test_client_heartbeat.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Protocol

from malamute_pack.protocol import mlm

_PING: Final = mlm.encode(mlm.ConnectionPing())


class Clock(Protocol):
    """The part of C{IReactorTime} the client needs."""

    def seconds(self) -> float: ...


class Heartbeat:
    """
    Pings and the silence timer of one connection.

    @ivar last_heard: when something last arrived from the broker (clock seconds).
    @ivar next_ping: when the next CONNECTION_PING goes, or None when not pinging.
    """

    def __init__(
        self,
        clock: Clock,
        send_frames: Callable[[list[bytes]], None],
        interval: float,
        timeout: float,
    ) -> None:
        self._clock = clock
        self._send_frames = send_frames
        self.interval = interval
        self.timeout = timeout
        self.last_heard = clock.seconds()
        self.next_ping: float | None = None

    def heard(self) -> None:
        """Something arrived from the broker."""
        self.last_heard = self._clock.seconds()

    def start(self) -> None:
        """Ping every C{interval} from now on."""
        self.next_ping = self._clock.seconds() + self.interval

    def stop(self) -> None:
        self.next_ping = None

    def silent(self, now: float) -> bool:
        """Whether nothing was heard for C{timeout} seconds by C{now}."""
        return now >= self.last_heard + self.timeout

    def wakeup_at(self, watched: bool) -> float | None:
        """
        When the next ping is due or, if C{watched}, when silence would
        start to count; None if neither.
        """
        times = [] if self.next_ping is None else [self.next_ping]
        if watched:
            times.append(self.last_heard + self.timeout)
        return min(times) if times else None

    def ping_if_due(self, now: float) -> None:
        if self.next_ping is not None and now >= self.next_ping:
            self._send_frames(list(_PING))
            self.next_ping = now + self.interval
