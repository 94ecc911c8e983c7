"""
The tests' one clock for code that also reports back from other threads
(the journal's writer and reader): L{ThreadedClock}, a twisted L{Clock}
that takes C{callFromThread} calls too, either to run them itself when the
test says (synchronous tests) or handing them to the real reactor (tests
that wait on Deferreds).

Tests: ``tests/unit/test_clock_support.py``; used by ``tests/broker_support.py``
and ``tests/unit/test_journal_retention.py``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.task import Clock

ThreadCall = tuple[Callable[..., object], tuple[object, ...], dict[str, object]]


class ThreadedClock(Clock):
    """
    A L{Clock} whose C{callFromThread} is safe to call from any thread.

    Without C{reactor}, calls from other threads wait in a queue until the
    test runs them in its own thread with L{run_thread_calls}; with one,
    they go to that reactor's C{callFromThread} (for a test that waits on
    Deferreds the real reactor fires), while timers and time stay this
    clock's.
    """

    def __init__(self, reactor: IReactorFromThreads | None = None) -> None:
        super().__init__()
        self._reactor = reactor
        # A Queue, not a SimpleQueue: CPython 3.11's SimpleQueue.get(timeout=)
        # interrupted by a signal (a child process ending: SIGCHLD) can wait
        # on with a negative time left, which means for ever (a unit run hung
        # so in BrokerHarness.close; gdb showed the wait with -454 us).
        self._calls: queue.Queue[ThreadCall] = queue.Queue()

    def callFromThread(self, f: Callable[..., object], *args: object, **kwargs: object) -> None:
        if self._reactor is not None:
            self._reactor.callFromThread(f, *args, **kwargs)
        else:
            self._calls.put((f, args, kwargs))

    def waiting_calls(self) -> int:
        """How many calls other threads made that the test has not run yet."""
        return self._calls.qsize()

    def run_thread_calls(self, idle: Callable[[], bool], timeout: float = 30.0) -> None:
        """
        Run the calls other threads made, in the order they made them,
        until C{idle()} holds and none is waiting. Each turn first runs
        the clock's calls due now (C{advance(0)}): code that hands work to
        a thread on the next turn gets that turn.

        @raise AssertionError: if that takes longer than C{timeout} seconds
            (a bound against a hang, generous: the unit suite runs beside
            the system suite, and a starved thread took over 10 s).
        """
        deadline = time.monotonic() + timeout
        while True:
            # Checked every turn: threads that never stop calling must not
            # keep a test from its bound (a unit run once hung so for minutes).
            if time.monotonic() > deadline:
                raise AssertionError(f"the other threads did not settle within {timeout}s")
            self.advance(0)
            try:
                f, args, kwargs = self._calls.get(timeout=0.005)
            except queue.Empty:
                if idle():
                    return
                continue
            f(*args, **kwargs)
