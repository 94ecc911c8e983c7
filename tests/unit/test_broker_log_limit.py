"""
Tests for L{malamute_pack.broker.log_limit}: a flood of one kind of event
is logged a few lines a second, the rest counted and reported when logging
resumes; kinds are limited separately.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import Logger, LogPublisher, formatEvent
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.log_limit import LogLimit, OncePer


class LogLimitTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.lines: list[str] = []
        publisher = LogPublisher()

        def observe(event: dict[str, Any]) -> None:
            self.lines.append(formatEvent(event))

        publisher.addObserver(observe)  # type: ignore[arg-type]
        self.clock = Clock()
        self.limit = LogLimit(self.clock, Logger(observer=publisher), per_second=3)

    def test_floodIsLimitedAndCounted(self) -> None:
        """
        Of 10 events in one second, 3 are logged and 7 counted; the first
        line of the next second says how many were not logged.
        """
        for n in range(10):
            self.limit.info("malformed", "bad {n}", n=n)
        self.assertEqual(self.lines, ["bad 0", "bad 1", "bad 2"])
        self.assertEqual(self.limit.suppressed, {"malformed": 7})
        self.clock.advance(1)
        self.limit.info("malformed", "bad {n}", n=10)
        self.assertEqual(self.lines[3:], ["7 more malformed events were not logged", "bad 10"])
        self.assertEqual(self.limit.suppressed, {})

    def test_kindsSeparately(self) -> None:
        """One kind's flood does not silence another kind."""
        for n in range(5):
            self.limit.info("malformed", "bad {n}", n=n)
        self.limit.info("refused", "refused {n}", n=0)
        self.assertIn("refused 0", self.lines)


class OncePerTests(SynchronousTestCase):
    def test_oncePerIntervalPerKey(self) -> None:
        """A key is due once per interval; other keys are independent of it."""
        clock = Clock()
        once = OncePer(clock, 600.0)
        self.assertEqual([once.due("a"), once.due("a"), once.due("b")], [True, False, True])
        clock.advance(599)
        self.assertFalse(once.due("a"))
        clock.advance(1)
        self.assertTrue(once.due("a"))

    def test_boundedMemory(self) -> None:
        """At most C{size} keys are remembered: the one logged longest ago is due again first."""
        once = OncePer(Clock(), 600.0, size=2)
        for key in ("a", "b", "c"):
            self.assertTrue(once.due(key))
        self.assertEqual([once.due("b"), once.due("c"), once.due("a")], [False, False, True])
