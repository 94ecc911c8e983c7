"""
Tests for L{tests.clock_support.ThreadedClock}: calls from other threads
wait for the test to run them, in order, or go to a reactor it was given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from twisted.internet.interfaces import IReactorFromThreads
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from tests.clock_support import ThreadedClock


def from_thread(call: Callable[[], None]) -> None:
    """Run C{call} in a new thread and wait for that thread to end."""
    thread = threading.Thread(target=call)
    thread.start()
    thread.join()


@implementer(IReactorFromThreads)
class ForwardingReactor:
    """Just enough of a reactor to record the thread calls handed to it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]] = []

    def callFromThread(
        self, callable: Callable[..., object], *args: object, **kwargs: object
    ) -> None:
        self.calls.append((callable, args, kwargs))


class ThreadedClockTests(SynchronousTestCase):
    def test_threadCallsWaitForTheTest(self) -> None:
        """
        A call made from another thread does not run there: it runs, with
        its arguments, in the test's thread when the test runs the calls,
        in the order the calls were made.
        """
        clock = ThreadedClock()
        ran: list[tuple[str, int, str]] = []

        def record(name: str, n: int, tag: str = "") -> None:
            ran.append((name, n, tag))

        def calls() -> None:
            clock.callFromThread(record, "a", 1)
            clock.callFromThread(record, "b", 2, tag="kw")

        from_thread(calls)
        self.assertEqual(ran, [])
        clock.run_thread_calls(lambda: len(ran) == 2)
        self.assertEqual(ran, [("a", 1, ""), ("b", 2, "kw")])

    def test_timersDueNowRunFirst(self) -> None:
        """
        Running the thread calls also runs the clock's calls due now (a
        callLater(0) that hands work to a thread), without moving time.
        """
        clock = ThreadedClock()
        ran: list[str] = []
        clock.callLater(0, ran.append, "now")
        clock.callLater(1, ran.append, "later")
        clock.run_thread_calls(lambda: True)
        self.assertEqual((ran, clock.seconds()), (["now"], 0.0))

    def test_unsettledFails(self) -> None:
        """Waiting for a condition that never holds fails after the timeout."""
        clock = ThreadedClock()
        error = self.assertRaises(
            AssertionError, clock.run_thread_calls, lambda: False, timeout=0.05
        )
        self.assertIn("did not settle", str(error))

    def test_waitingCallsCounted(self) -> None:
        """waiting_calls() counts the calls made from other threads not run yet."""
        clock = ThreadedClock()
        from_thread(lambda: clock.callFromThread(lambda: None))
        self.assertEqual(clock.waiting_calls(), 1)
        clock.run_thread_calls(lambda: True)
        self.assertEqual(clock.waiting_calls(), 0)

    def test_endlessCallsFail(self) -> None:
        """
        Calls that never stop coming (each call makes the next) do not hold
        the test past the timeout: waiting fails then, calls still waiting.
        """
        clock = ThreadedClock()
        # Ends by itself after 5 s, so that a clock without the bound fails
        # this test rather than hanging it.
        until = time.monotonic() + 5.0

        def again() -> None:
            if time.monotonic() < until:
                clock.callFromThread(again)

        clock.callFromThread(again)
        started = time.monotonic()
        error = self.assertRaises(
            AssertionError, clock.run_thread_calls, lambda: False, timeout=0.2
        )
        self.assertIn("did not settle", str(error))
        self.assertLess(time.monotonic() - started, 5.0)

    def test_forwardedToReactor(self) -> None:
        """
        Given a reactor, the clock hands thread calls to its
        callFromThread, arguments and all, while time stays the clock's.
        """
        reactor = ForwardingReactor()
        clock = ThreadedClock(reactor)

        def calls() -> None:
            clock.callFromThread(print, "x", sep="")

        from_thread(calls)
        clock.advance(5)
        self.assertEqual(reactor.calls, [(print, ("x",), {"sep": ""})])
        self.assertEqual(clock.seconds(), 5.0)
