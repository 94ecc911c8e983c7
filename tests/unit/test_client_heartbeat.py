"""
Tests for L{malamute_pack.client.heartbeat}: pings and the silence timer on
a L{Clock}.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.heartbeat import Heartbeat
from malamute_pack.protocol import mlm


class HeartbeatTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[mlm.Message] = []
        self.heartbeat = Heartbeat(
            self.clock, lambda frames: self.sent.append(mlm.decode(frames)), 1.0, 5.0
        )

    def test_noPingsUntilStarted(self) -> None:
        """Before start() nothing is due and nothing is sent."""
        self.assertIsNone(self.heartbeat.wakeup_at(watched=False))
        self.clock.advance(3)
        self.heartbeat.ping_if_due(self.clock.seconds())
        self.assertEqual(self.sent, [])

    def test_pingsEveryInterval(self) -> None:
        """Once started, a CONNECTION_PING when due, then the next an interval later."""
        self.heartbeat.start()
        self.assertEqual(self.heartbeat.wakeup_at(watched=False), 1.0)
        self.clock.advance(0.5)
        self.heartbeat.ping_if_due(self.clock.seconds())
        self.assertEqual(self.sent, [])
        self.clock.advance(0.5)
        self.heartbeat.ping_if_due(self.clock.seconds())
        self.assertEqual(self.sent, [mlm.ConnectionPing()])
        self.assertEqual(self.heartbeat.wakeup_at(watched=False), 2.0)

    def test_stop(self) -> None:
        """After stop() no ping is due."""
        self.heartbeat.start()
        self.heartbeat.stop()
        self.assertIsNone(self.heartbeat.wakeup_at(watched=False))

    def test_silence(self) -> None:
        """Silent once nothing was heard for the timeout; hearing starts it again."""
        self.clock.advance(4.9)
        self.assertFalse(self.heartbeat.silent(self.clock.seconds()))
        self.heartbeat.heard()
        self.clock.advance(4.9)
        self.assertFalse(self.heartbeat.silent(self.clock.seconds()))
        self.clock.advance(0.1)
        self.assertTrue(self.heartbeat.silent(self.clock.seconds()))

    def test_watchedWakeup(self) -> None:
        """Watched, the wake-up is the earlier of the next ping and the silence."""
        self.heartbeat.start()
        self.clock.advance(10)
        self.heartbeat.ping_if_due(self.clock.seconds())  # next at 11
        self.assertEqual(self.heartbeat.wakeup_at(watched=True), 5.0)
        self.heartbeat.heard()
        self.assertEqual(self.heartbeat.wakeup_at(watched=True), 11.0)
