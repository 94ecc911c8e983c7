"""
A harness for driving the broker model in tests: it sends encoded frames in
from named peers and collects what the broker sends back, decoded. The
durable variant gives the broker a real journal (a SQLite file, its writer
and reader threads) on a clock whose thread callbacks the test runs itself,
so tests stay synchronous and deterministic.

Tests: used by ``tests/test_broker_model.py`` and ``tests/test_broker_durable.py``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from twisted.internet.task import Clock

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.journal import Journal, JournalConfig
from malamute_pack.protocol import mlm


class RecordingSink:
    """A L{FrameSink} that keeps every message the broker sends, per route."""

    def __init__(self) -> None:
        self.sent: dict[bytes, list[list[bytes]]] = {}

    def send(self, route: bytes, frames: Sequence[bytes]) -> bool:
        self.sent.setdefault(route, []).append(list(frames))
        return True


class ThreadedClock(Clock):
    """
    A L{Clock} that also takes calls from other threads (the journal's), to
    be run by L{pump} in the test's own thread.
    """

    def __init__(self) -> None:
        super().__init__()
        self._calls: queue.SimpleQueue[tuple[Callable[..., object], tuple[object, ...]]]
        self._calls = queue.SimpleQueue()

    def callFromThread(self, f: Callable[..., object], *args: object) -> None:
        self._calls.put((f, args))

    def run_thread_calls(self, idle: Callable[[], bool], timeout: float = 10.0) -> None:
        """Run thread callbacks until C{idle()} holds and none are waiting."""
        deadline = time.monotonic() + timeout
        while True:
            self.advance(0)  # the journal hands writes to its thread on the next turn
            try:
                f, args = self._calls.get(timeout=0.005)
            except queue.Empty:
                if idle():
                    return
                if time.monotonic() > deadline:
                    raise AssertionError("the journal did not settle") from None
                continue
            f(*args)


class BrokerHarness:
    """A broker on a L{Clock}, with peers named by their routing ids."""

    def __init__(
        self,
        config: BrokerConfig | None = None,
        journal_at: Path | None = None,
        journal_config: JournalConfig | None = None,
    ) -> None:
        self.clock = ThreadedClock()
        self.sink = RecordingSink()
        self.journal: Journal | None = None
        if journal_at is not None:
            self.journal = Journal(
                journal_at, self.clock, journal_config or JournalConfig(prune_interval_s=3600)
            )
            self.recovered = self.journal.open()
        self.broker = Broker(
            self.sink, self.clock, config or BrokerConfig(timeout=5.0), self.journal
        )
        if journal_at is not None:
            self.broker.restore(self.recovered.queued)
        self.broker.start()

    def settle(self) -> None:
        """Let the journal write and read everything asked of it so far."""
        if self.journal is None:
            return
        journal = self.journal
        clients = self.broker.clients
        self.clock.run_thread_calls(
            lambda: journal.pending_writes == 0 and not any(c.replaying for c in clients.values())
        )

    def close(self) -> None:
        """Stop the broker and close its journal (flushing it)."""
        self.broker.stop()
        if self.journal is not None:
            closed = self.journal.close()
            done: list[object] = []
            closed.addBoth(done.append)
            self.clock.run_thread_calls(lambda: bool(done))

    def send(self, route: bytes, message: mlm.Message) -> None:
        """Deliver C{message} from peer C{route} to the broker."""
        self.broker.receive(route, mlm.encode(message))

    def raw(self, route: bytes, frames: list[bytes]) -> None:
        """Deliver raw C{frames} from peer C{route}."""
        self.broker.receive(route, frames)

    def take(self, route: bytes) -> list[mlm.Message]:
        """
        Every message sent to C{route} since the last take, decoded (after
        letting the journal settle).
        """
        self.settle()
        return [mlm.decode(frames) for frames in self.sink.sent.pop(route, [])]

    def open(self, route: bytes, address: str = "", version: int = 1) -> list[mlm.Message]:
        """
        Open a connection for C{route} under C{address}, expecting OK; return
        what followed the OK (mail waiting for that address).
        """
        self.send(route, mlm.ConnectionOpen(version=version, address=address))
        messages = self.take(route)
        assert messages[:1] == [mlm.Ok()], f"OPEN was answered with {messages}"
        return messages[1:]

    def command(self, route: bytes, message: mlm.Message) -> list[mlm.Message]:
        """Send C{message} and return what came back."""
        self.send(route, message)
        return self.take(route)
