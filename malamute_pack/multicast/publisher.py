"""
One outbound bridge's sending side: stream records encoded with their
headers (L{malamute_pack.protocol.multicast}), packed several to a message
and sent on its PUB socket, each naming the record published before it, so
receivers see a loss. Whatever feeds it (the broker's own stream,
L{malamute_pack.multicast.sessions}; another broker's over TCP,
L{malamute_pack.multicast.proxy}) hands it records in sequence order.

A message per record costs each broker a send and a receive per record,
in Python; a pack of them costs one per burst. A pack is sent when the
next record would take it past L{PACK_BYTES}, when a record comes
L{PACK_DELAY} or more after the pack's first, and at the end of the
reactor's turn (a timer of 0 s), whichever is first: a record waits at
most the turn it came in.

When the socket cannot take a pack (its queue is full: over the rate),
the pack is kept and tried again (every L{RETRY} seconds, and before any
new record), and no record is taken meanwhile: the session refuses them,
and the broker serves them from its journal once the queue drains. One
pack is the most a publisher holds.

Tests: ``tests/unit/test_multicast_outbound.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.protocol import multicast

_log = Logger()

# Seconds a socket may refuse every record before the log says so.
STALLED = 10
# Seconds between beats of an idle bridge (L{Publisher.tick}).
BEAT_INTERVAL = 1.0
# The most bytes of records in one pack (one record larger goes alone).
# ZeroMQ cuts its PGM stream into packets of about 1,400 bytes whatever the
# messages: a pack of 8 KiB spans about six, and amortises a send and a
# receive over some 60 records of 100 bytes. A packet PGM cannot repair
# costs the packs it carries, which the receiver then repairs from the
# journal: the bound keeps that to some 120 records of 100 bytes.
PACK_BYTES = 8 * 1024
# NORM in libzmq 4.3.4 stalled its I/O thread (every socket of the context,
# the broker's clients too) with packs of up to 8 KiB, not with packs under its
# 1,400-byte segment (docs/multicast.md): its packs stay under.
NORM_PACK_BYTES = 1024
# The longest a record waits in a pack for others (seconds), however long
# the reactor's turn that brought it.
PACK_DELAY = 0.001
# Seconds between tries of a pack the socket refused.
RETRY = 0.01


@dataclass
class PublisherCounters:
    """What one outbound bridge counted."""

    published: int = 0  # records sent
    bytes: int = 0
    packs: int = 0  # messages that carried them
    # Sends the socket's queue refused (it was full): tried again later.
    full: int = 0
    # Records whose sender or subject does not fit a header: receivers
    # see a loss and repair it over TCP.
    unfit: int = 0
    beats: int = 0


class Publisher:
    """
    Publishes the records of one stream (those its pattern finds) on one
    socket, in packs.

    @ivar prev: the sequence number of the last record taken (packed, or
        sent; 0 until the first: receivers then check with the origin what
        they missed).
    """

    def __init__(
        self,
        clock: IReactorTime,
        send: Callable[[Sequence[bytes]], bool],
        origin: str,
        endpoint: str,
        stream: str,
        pattern: str,
        pack_bytes: int = PACK_BYTES,
    ) -> None:
        """
        @param send: sends one message without blocking; False if the
            socket's queue is full (nothing was sent).
        @param pack_bytes: the most bytes of records in a pack.
        @raise ValueError: a name longer than a header holds.
        """
        self._send = send
        self._pack_bytes = pack_bytes
        self._source = multicast.encode_source(origin, endpoint, stream, pattern)
        self._start = multicast.pack_start(self._source)
        self.stream = stream
        self.pattern = pattern
        self.prev = 0
        self.counters = PublisherCounters()
        self._clock = clock
        self._log = LogLimit(clock, _log)
        self._full_since: float | None = None  # when the socket last began refusing
        self._published_at_tick = 0
        # The pack being filled: its parts (the start, then the records).
        self._parts: list[bytes] = [self._start]
        self._size = 0  # bytes of records in it
        self._since = 0.0  # when its first record came
        self._turn_end: IDelayedCall | None = None  # sends the pack
        self._retry: IDelayedCall | None = None  # tries the refused pack again
        # A pack made but not sent (the socket refused it), and its records:
        # sent before any other.
        self._unsent: list[bytes] | None = None
        self._unsent_records = 0

    def publish(
        self, seq: int, timestamp: float, sender: str, subject: str, content: Sequence[bytes]
    ) -> bool:
        """
        Take one record (C{timestamp} in seconds since the epoch) into the
        pack; it is sent within the reactor's turn.

        @return: False if the socket could not take a pack now: hand it again later.
        """
        if seq <= self.prev:
            return True  # sent already (a replay that started before it)
        if self._unsent is not None and not self._send_unsent():
            return False
        try:
            record = multicast.encode_record(
                seq, self.prev, int(timestamp * 1_000_000), sender, subject, content
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
        size = len(record)
        parts = self._parts
        if len(parts) == 1:
            self._since = self._clock.seconds()
            if self._turn_end is None:
                self._turn_end = self._clock.callLater(0, self._turn_ended)
        elif (
            self._size + size > self._pack_bytes
            or self._clock.seconds() - self._since >= PACK_DELAY
        ):
            self.flush()
            if self._unsent is not None:
                return False  # the pack before it could not go: this one waits
            self._since = self._clock.seconds()
            parts = self._parts
        parts.append(record)
        self._size += size
        self.prev = seq
        return True

    def flush(self) -> bool:
        """
        Send the pack now, if it holds any record.

        @return: False if the socket refused it (it is kept and tried again).
        """
        parts = self._parts
        if len(parts) == 1 or self._unsent is not None:
            return self._unsent is None
        self._parts = [self._start]
        self._size = 0
        self._unsent = [b"".join(parts)]
        self._unsent_records = len(parts) - 1
        return self._send_unsent()

    def close(self) -> None:
        """Send what is packed if the socket takes it, and stop every timer."""
        if self._unsent is None or self._send_unsent():
            self.flush()
        for call in (self._turn_end, self._retry):
            if call is not None and call.active():
                call.cancel()
        self._turn_end = self._retry = None

    def _turn_ended(self) -> None:
        self._turn_end = None
        self.flush()

    def _try_again(self) -> None:
        self._retry = None
        if self._unsent is None or self._send_unsent():
            self.flush()

    def _send_unsent(self) -> bool:
        """Send the pack made last (the socket refused it, or it was just made)."""
        frames = self._unsent
        assert frames is not None
        if not self._send(frames):
            self.counters.full += 1
            self._refused()
            if self._retry is None:
                self._retry = self._clock.callLater(RETRY, self._try_again)
            return False
        self._unsent = None
        self._full_since = None
        counters = self.counters
        counters.published += self._unsent_records
        counters.packs += 1
        counters.bytes += len(frames[0])
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
        if idle and self.prev and len(self._parts) == 1 and self._unsent is None:
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
