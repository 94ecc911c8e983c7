"""
One outbound bridge's sending side: stream records encoded with the bridge
header (L{malamute_pack.protocol.multicast}) and sent on its PUB socket,
each naming the record published before it, so receivers see a loss.
Whatever feeds it (the broker's own stream, L{malamute_pack.multicast.sessions};
another broker's over TCP, L{malamute_pack.multicast.proxy}) hands it
records in sequence order.

Tests: ``tests/unit/test_multicast_outbound.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.protocol import multicast

_log = Logger()

# Seconds a socket may refuse every record before the log says so.
STALLED = 10
# Seconds between beats of an idle bridge (L{Publisher.tick}).
BEAT_INTERVAL = 1.0


@dataclass
class PublisherCounters:
    """What one outbound bridge counted."""

    published: int = 0
    bytes: int = 0
    # Sends the socket's queue refused (it was full): tried again later.
    full: int = 0
    # Records whose sender or subject does not fit a header: receivers
    # see a loss and repair it over TCP.
    unfit: int = 0
    beats: int = 0


class Publisher:
    """
    Publishes the records of one stream (those its pattern finds) on one
    socket.

    @ivar prev: the sequence number of the last record published (0 until
        the first: receivers then check with the origin what they missed).
    """

    def __init__(
        self,
        clock: IReactorTime,
        send: Callable[[Sequence[bytes]], bool],
        origin: str,
        endpoint: str,
        stream: str,
        pattern: str,
    ) -> None:
        """
        @param send: sends one message without blocking; False if the
            socket's queue is full (nothing was sent).
        @raise ValueError: a name longer than a header holds.
        """
        self._send = send
        self._source = multicast.encode_source(origin, endpoint, stream, pattern)
        self.stream = stream
        self.pattern = pattern
        self.prev = 0
        self.counters = PublisherCounters()
        self._clock = clock
        self._log = LogLimit(clock, _log)
        self._full_since: float | None = None  # when the socket last began refusing
        self._published_at_tick = 0

    def publish(
        self, seq: int, timestamp: float, sender: str, subject: str, content: Sequence[bytes]
    ) -> bool:
        """
        Send one record (C{timestamp} in seconds since the epoch).

        @return: False if the socket could not take it now: hand it again later.
        """
        if seq <= self.prev:
            return True  # sent already (a replay that started before it)
        try:
            header = multicast.encode_header(
                self._source, seq, self.prev, int(timestamp * 1_000_000), sender, subject
            )
        except ValueError as e:
            self.counters.unfit += 1
            self._log.info(
                "unfit",
                "stream {stream!r} record {seq} not published: {error}",
                stream=self.stream,
                seq=seq,
                error=e,
            )
            return True
        frames = [header, *content]
        if not self._send(frames):
            self.counters.full += 1
            self._refused()
            return False
        self._full_since = None
        self.prev = seq
        counters = self.counters
        counters.published += 1
        counters.bytes += sum(map(len, frames))
        return True

    def tick(self) -> None:
        """
        Called every L{BEAT_INTERVAL}: if nothing was published since the
        last tick, send a beat naming the last number published, so that
        a receiver that lost the tail of a burst learns it now rather than
        at the next record.
        """
        published = self.counters.published
        idle = published == self._published_at_tick
        self._published_at_tick = published
        if idle and self.prev:
            beat = multicast.encode_beat(
                self._source, self.prev, int(self._clock.seconds() * 1_000_000)
            )
            if self._send([beat]):
                self.counters.beats += 1

    def _refused(self) -> None:
        """Say so when the socket has refused everything for L{STALLED} seconds."""
        now = self._clock.seconds()
        if self._full_since is None:
            self._full_since = now
        elif now - self._full_since >= STALLED:
            self._full_since = now  # once per period
            _log.error(
                "stream {stream!r}: its multicast socket has taken nothing for {seconds}s"
                " (over the rate: --bridge-rate; NORM in libzmq 4.3.4 stops for good after"
                " about 1,500 messages: use epgm://)",
                stream=self.stream,
                seconds=STALLED,
            )
