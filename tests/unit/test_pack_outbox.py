"""
Tests for L{malamute_pack.pack.outbox}: control messages sent at once or
kept in order and retried on the clock while the link is full, deliveries
refused while anything waits, the overflow past the limit, and stop().
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.pack.outbox import MESSAGE_OVERHEAD, PeerOutbox


class FakeLink:
    """
    A peer link's send queue: what it took, in order, and a switch for
    "full" (nothing is taken while it is on).

    @ivar room: how many more messages it takes before it turns full by
        itself (None: no end).
    @ivar attempts: every call, taken or not.
    """

    def __init__(self) -> None:
        self.taken: list[Sequence[bytes]] = []
        self.attempts = 0
        self.full = False
        self.room: int | None = None

    def whisper(self, frames: Sequence[bytes]) -> bool:
        self.attempts += 1
        if self.full:
            return False
        if self.room is not None:
            if self.room == 0:
                self.full = True
                return False
            self.room -= 1
        self.taken.append(frames)
        return True


def _m(name: str) -> list[bytes]:
    return [name.encode()]


class PeerOutboxTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.link = FakeLink()
        self.overflows = 0
        self.outbox = self.make()

    def make(self, limit: int = 100_000, retry: float = 0.05) -> PeerOutbox:
        return PeerOutbox(self.link.whisper, self.clock, self._overflowed, limit, retry)

    def _overflowed(self) -> None:
        self.overflows += 1

    def test_controlSentAtOnce(self) -> None:
        """With room on the link, a control message is sent at once and nothing is scheduled."""
        self.outbox.send(_m("a"))
        self.outbox.send(_m("b"))
        self.assertEqual(self.link.taken, [_m("a"), _m("b")])
        self.assertEqual(self.outbox.sent, 2)
        self.assertEqual(list(self.outbox.waiting), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_waitWhileFull(self) -> None:
        """
        On a full link control messages wait in order and one retry is
        scheduled, C{retry} seconds away.
        """
        self.link.full = True
        for name in "abc":
            self.outbox.send(_m(name))
        self.assertEqual(self.link.taken, [])
        self.assertEqual(list(self.outbox.waiting), [_m("a"), _m("b"), _m("c")])
        self.assertEqual(self.outbox.sent, 0)
        calls = self.clock.getDelayedCalls()
        self.assertEqual(len(calls), 1)
        self.assertAlmostEqual(calls[0].getTime(), 0.05)

    def test_retriedUntilSent(self) -> None:
        """
        What waits is retried every C{retry} seconds while the link stays
        full, and sent in order as soon as it has room; then no retry is left.
        """
        self.outbox = self.make(retry=0.5)
        self.link.full = True
        self.outbox.send(_m("a"))
        self.outbox.send(_m("b"))
        attempts = self.link.attempts
        # Times exact in binary: the retry falls due on them, not a hair later.
        self.clock.advance(0.25)
        self.assertEqual(self.link.attempts, attempts)
        for _ in range(3):
            self.clock.advance(0.5)
            self.assertEqual(self.link.taken, [])
            self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.assertEqual(self.link.attempts, attempts + 3)
        self.link.full = False
        self.clock.advance(0.25)
        self.assertEqual(self.link.taken, [])
        self.clock.advance(0.25)
        self.assertEqual(self.link.taken, [_m("a"), _m("b")])
        self.assertEqual(self.outbox.sent, 2)
        self.assertEqual(list(self.outbox.waiting), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_partialFlushKeepsOrder(self) -> None:
        """
        A link with room for only some of what waits takes the oldest; the
        rest waits, in order, for the next retry.
        """
        self.link.full = True
        for name in "abc":
            self.outbox.send(_m(name))
        self.link.full = False
        self.link.room = 1
        self.clock.advance(0.05)
        self.assertEqual(self.link.taken, [_m("a")])
        self.assertEqual(list(self.outbox.waiting), [_m("b"), _m("c")])
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)
        self.link.full = False
        self.link.room = None
        self.clock.advance(0.05)
        self.assertEqual(self.link.taken, [_m("a"), _m("b"), _m("c")])
        self.assertEqual(self.outbox.sent, 3)

    def test_noOvertaking(self) -> None:
        """
        A control message sent while others wait goes behind them even if
        the link has room again.
        """
        self.link.full = True
        self.outbox.send(_m("a"))
        self.link.full = False
        self.outbox.send(_m("b"))
        self.assertEqual(self.link.taken, [])
        self.assertEqual(list(self.outbox.waiting), [_m("a"), _m("b")])
        self.clock.advance(0.05)
        self.assertEqual(self.link.taken, [_m("a"), _m("b")])

    def test_deliverWithRoom(self) -> None:
        """With nothing waiting and room on the link, a delivery is sent and accepted."""
        self.assertTrue(self.outbox.deliver(_m("d")))
        self.assertEqual(self.link.taken, [_m("d")])
        self.assertEqual(self.outbox.sent, 1)

    def test_deliverRefusedWhenFull(self) -> None:
        """
        On a full link a delivery is refused and not kept: the caller keeps
        it (nothing waits, nothing is retried).
        """
        self.link.full = True
        self.assertFalse(self.outbox.deliver(_m("d")))
        self.assertEqual(list(self.outbox.waiting), [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.link.full = False
        self.clock.advance(1)
        self.assertEqual(self.link.taken, [])

    def test_deliverRefusedWhileControlWaits(self) -> None:
        """
        A delivery is refused while control messages wait, and accepted
        once they were flushed, after them.
        """
        self.link.full = True
        self.outbox.send(_m("a"))
        self.assertFalse(self.outbox.deliver(_m("d")))
        self.assertEqual(list(self.outbox.waiting), [_m("a")])
        self.link.full = False
        self.clock.advance(0.05)
        self.assertEqual(self.link.taken, [_m("a")])
        self.assertTrue(self.outbox.deliver(_m("d")))
        self.assertEqual(self.link.taken, [_m("a"), _m("d")])

    def test_deliverFlushesFirst(self) -> None:
        """
        A delivery made when the link has room again sends what waits
        first, then itself: the control messages keep their place.
        """
        self.link.full = True
        self.outbox.send(_m("a"))
        self.outbox.send(_m("b"))
        self.link.full = False
        self.assertTrue(self.outbox.deliver(_m("d")))
        self.assertEqual(self.link.taken, [_m("a"), _m("b"), _m("d")])
        self.assertEqual(list(self.outbox.waiting), [])

    def test_deliverRefusedWhenFlushStopsShort(self) -> None:
        """
        A delivery is refused when the link fills before what waits is
        flushed; what is left still waits, in order.
        """
        self.link.full = True
        for name in "abc":
            self.outbox.send(_m(name))
        self.link.full = False
        self.link.room = 1
        self.assertFalse(self.outbox.deliver(_m("d")))
        self.assertEqual(self.link.taken, [_m("a")])
        self.assertEqual(list(self.outbox.waiting), [_m("b"), _m("c")])

    def test_deliverRefusedWhenOnlyControlFits(self) -> None:
        """
        A delivery is refused when the link takes everything that waited but
        has no room left for it.
        """
        self.link.full = True
        self.outbox.send(_m("a"))
        self.link.full = False
        self.link.room = 1
        self.assertFalse(self.outbox.deliver(_m("d")))
        self.assertEqual(self.link.taken, [_m("a")])
        self.assertEqual(list(self.outbox.waiting), [])

    def test_flush(self) -> None:
        """flush() says whether nothing waits any more."""
        self.assertTrue(self.outbox.flush())
        self.link.full = True
        self.outbox.send(_m("a"))
        self.assertFalse(self.outbox.flush())
        self.link.full = False
        self.assertTrue(self.outbox.flush())
        self.assertEqual(self.link.taken, [_m("a")])

    def test_limitNotExceeded(self) -> None:
        """Up to C{limit} bytes of control messages (overhead counted) wait without an overflow."""
        self.outbox = self.make(limit=3 * (MESSAGE_OVERHEAD + 1))
        self.link.full = True
        for name in "abc":
            self.outbox.send(_m(name))
        self.assertEqual(self.overflows, 0)
        self.assertFalse(self.outbox.overflowed)
        self.assertEqual(len(self.outbox.waiting), 3)
        self.assertEqual(self.outbox.waiting_bytes, 3 * (MESSAGE_OVERHEAD + 1))

    def test_overflow(self) -> None:
        """
        One control message past C{limit} bytes calls on_overflow once and
        drops what waited; nothing is sent afterwards, retries and new sends
        included.
        """
        self.outbox = self.make(limit=3 * (MESSAGE_OVERHEAD + 1))
        self.link.full = True
        for name in "abcd":
            self.outbox.send(_m(name))
        self.assertEqual(self.overflows, 1)
        self.assertTrue(self.outbox.overflowed)
        self.assertEqual(list(self.outbox.waiting), [])
        for name in "efgh":
            self.outbox.send(_m(name))
        self.assertEqual(self.overflows, 1)
        self.link.full = False
        self.clock.advance(0.05)
        self.clock.advance(0.05)
        self.outbox.send(_m("i"))
        self.assertEqual(self.link.taken, [])
        self.assertEqual(list(self.outbox.waiting), [])
        self.assertEqual(self.outbox.sent, 0)
        self.assertEqual(self.overflows, 1)

    def test_stop(self) -> None:
        """
        stop() cancels the retry (no delayed call is left), drops what
        waited, and nothing is sent afterwards.
        """
        self.link.full = True
        self.outbox.send(_m("a"))
        self.outbox.send(_m("b"))
        self.outbox.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(list(self.outbox.waiting), [])
        self.link.full = False
        self.clock.advance(1)
        self.outbox.send(_m("c"))
        self.assertEqual(self.link.taken, [])
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.overflows, 0)

    def test_stopIdle(self) -> None:
        """stop() with nothing waiting, and stop() twice, are harmless."""
        self.outbox.send(_m("a"))
        self.outbox.stop()
        self.outbox.stop()
        self.outbox.send(_m("b"))
        self.assertEqual(self.link.taken, [_m("a")])
        self.assertEqual(self.clock.getDelayedCalls(), [])
