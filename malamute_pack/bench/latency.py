"""
The latency scenario's two load roles: a writer that streams messages at a
fixed rate with its send time in each payload, and a reader that takes,
for each delivery, its receipt time minus that send time.

The writer paces itself from C{time.monotonic()}: it wakes when its next
message is due, but at most once a tick (a millisecond, L{TICK};
L{next_wake}), and sends what L{due} says is due by then, so a late
wake-up is caught up at once and the rate holds on average; at 50,000
msgs/s that is bursts of some 50 messages a millisecond. A Python sender
can fall behind: its report keeps its first and last send times, so the
line shows the rate it achieved and whether it kept up (L{behind}).

The payload is L{PAYLOAD_BYTES} bytes: the send time, 8 bytes of
C{struct '<d'} of C{time.monotonic()} (CLOCK_MONOTONIC on Linux: one clock
for every process of the host), then padding. The reader keeps its
samples in a list allocated before the clock starts and sends them all in
its report; the runner sorts them once (L{malamute_pack.bench.percentiles}).

Tests: ``tests/system/test_bench_latency.py``.
"""

from __future__ import annotations

import math
import struct
import time
from time import monotonic

import zmq

from malamute_pack.bench.load import Job, Link, Report, Role
from malamute_pack.protocol import mlm

# Seconds between two wake-ups of a paced sender, at most (unless behind).
TICK = 0.001
PAYLOAD_BYTES = 100
_STAMP = struct.Struct("<d")
_PADDING = b"x" * (PAYLOAD_BYTES - _STAMP.size)
# A paced sender that achieved less than this fraction of its rate fell behind.
KEPT_FRACTION = 0.98


def due(elapsed: float, rate: int, n: int) -> int:
    """
    How many of C{n} messages paced at C{rate} a second are due
    C{elapsed} seconds after the first: message M (from 0) is due at
    M / rate.
    """
    if elapsed < 0:
        return 0
    return min(n, math.floor(elapsed * rate) + 1)


def next_wake(elapsed: float, sent: int, rate: int) -> float:
    """
    When (seconds after the first message) a paced sender that has sent
    C{sent} messages wakes next: when the next one is due, but not before
    the next tick (ticks are L{TICK} apart from the first message), so a
    high rate goes in bursts, a tick apart, rather than a sleep a message.
    """
    # The epsilon keeps a wake-up on a tick from rounding down onto that tick.
    next_tick = (math.floor(elapsed / TICK + 1e-6) + 1) * TICK
    return max(sent / rate, next_tick)


def achieved(sent: int, first: float | None, last: float | None) -> float:
    """The rate C{sent} messages went at, first to last (0 for fewer than two)."""
    if sent < 2 or first is None or last is None or last <= first:
        return 0.0
    return (sent - 1) / (last - first)


def behind(rate: int, achieved_rate: float) -> bool:
    """Whether a sender paced at C{rate} that achieved C{achieved_rate} fell behind."""
    return rate > 0 and achieved_rate < KEPT_FRACTION * rate


def stamped(sent_at: float) -> bytes:
    """A payload carrying C{sent_at}."""
    return _STAMP.pack(sent_at) + _PADDING


def stamp_of(payload: bytes) -> float:
    """The send time a payload carries."""
    value: float = _STAMP.unpack_from(payload)[0]
    return value


def pace(link: Link, role: Role, job: Job) -> Report:
    """
    Send C{job.n} messages at C{job.rate} a second: C{role.frames}' header
    (the first frame, a STREAM_SEND) each with a fresh L{stamped} payload.
    """
    send = link.socket.send_multipart
    header = role.frames[0]
    n = job.n
    rate = job.rate
    keepalive = link.keepalive
    sleep = time.sleep
    sent = 0
    start = monotonic()
    last = start
    while sent < n:
        target = due(monotonic() - start, rate, n)
        while sent < target:
            last = monotonic()
            send([header, stamped(last)])
            sent += 1
        keepalive()
        if sent < n:
            pause = start + next_wake(monotonic() - start, sent, rate) - monotonic()
            if pause > 0:
                sleep(pause)
    return Report(sent=sent, first_send=start, last_send=last)


def read(link: Link, role: Role, job: Job) -> Report:
    """
    Take the latency of deliveries of kind C{role.counts} (the time a
    delivery was read minus the time in its payload) until C{job.n} or
    C{job.idle} of silence.
    """
    socket = link.socket
    recv = socket.recv_multipart
    kind = role.counts
    message_id = mlm.message_id
    unpack = _STAMP.unpack_from
    samples = [0.0] * job.n
    received = 0
    last = None
    quiet_since = monotonic()
    while received < job.n:
        try:
            frames = recv(zmq.NOBLOCK)
        except zmq.Again:
            if link.idle(last or quiet_since, job.idle):
                break
            continue
        now = monotonic()
        if message_id(frames) != kind:
            continue
        samples[received] = now - unpack(frames[-1])[0]
        received += 1
        last = now
        if not received & 0x3FF:
            link.keepalive()
    del samples[received:]
    return Report(received=received, last_receipt=last, samples=samples)
