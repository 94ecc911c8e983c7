"""
What a broker sends one peer broker, in order and bounded: control messages
(interests, addresses, offers, answers) are never lost, and wait when the
peer link's queue is full; deliveries (forwarded records and letters) are
only sent when nothing waits before them, and are otherwise refused so the
broker model keeps them (a stream reader falls behind onto the journal, a
letter stays queued) and retries.

Tests: ``tests/unit/test_pack_outbox.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from twisted.internet.interfaces import IDelayedCall, IReactorTime

# Bytes a waiting message costs beyond its frames (the deque entry, the
# list and bytes objects), so that many tiny messages are bounded too.
MESSAGE_OVERHEAD = 128

# Sends one message's frames to the peer (a ZRE WHISPER); False: the link's
# queue is full, nothing was sent.
Whisper = Callable[[Sequence[bytes]], bool]


class PeerOutbox:
    """
    The messages for one peer broker.

    @ivar waiting: control messages waiting for room, oldest first.
    @ivar waiting_bytes: what waits, in bytes (with C{MESSAGE_OVERHEAD} each).
    @ivar overflowed: whether more than C{limit} bytes waited once (the
        peer does not read: C{on_overflow} was called and nothing more is
        kept).
    """

    def __init__(
        self,
        whisper: Whisper,
        clock: IReactorTime,
        on_overflow: Callable[[], None],
        limit: int = 16 * 1024 * 1024,
        retry: float = 0.05,
    ) -> None:
        self._whisper = whisper
        self._clock = clock
        self._on_overflow = on_overflow
        self._limit = limit
        self._retry = retry
        self._retrying: IDelayedCall | None = None
        self.waiting: deque[Sequence[bytes]] = deque()
        self.waiting_bytes = 0
        self.overflowed = False
        self.sent = 0

    def send(self, frames: Sequence[bytes]) -> None:
        """A control message: sent now, or as soon as the link has room."""
        if self.overflowed:
            return
        if not self.waiting and self._whisper(frames):
            self.sent += 1
            return
        self.waiting.append(frames)
        self.waiting_bytes += _cost(frames)
        if self.waiting_bytes > self._limit:
            self.stop()
            self._on_overflow()
            return
        self._schedule()

    def deliver(self, frames: Sequence[bytes]) -> bool:
        """A delivery: sent only if nothing waits and the link has room."""
        if self.overflowed:
            return False
        if self.waiting and not self.flush():
            return False
        if self._whisper(frames):
            self.sent += 1
            return True
        return False

    def flush(self) -> bool:
        """Send what waits while the link takes it; whether nothing waits now."""
        waiting = self.waiting
        while waiting:
            if not self._whisper(waiting[0]):
                return False
            self.waiting_bytes -= _cost(waiting.popleft())
            self.sent += 1
        return True

    def _schedule(self) -> None:
        if self._retrying is None:
            self._retrying = self._clock.callLater(self._retry, self._retry_now)

    def _retry_now(self) -> None:
        self._retrying = None
        if not self.flush():
            self._schedule()

    def stop(self) -> None:
        """Send nothing more (the peer is gone)."""
        if self._retrying is not None and self._retrying.active():
            self._retrying.cancel()
        self._retrying = None
        self.waiting.clear()
        self.waiting_bytes = 0
        self.overflowed = True


def _cost(frames: Sequence[bytes]) -> int:
    return MESSAGE_OVERHEAD + sum(map(len, frames))
