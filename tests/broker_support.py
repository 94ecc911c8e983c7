"""
A harness for driving the broker model in tests: it sends encoded frames in
from named peers, through the real MLM session table, and collects what the
broker sends back, decoded. The
durable variant gives the broker a real journal (a SQLite file, its writer
and reader threads) on a clock whose thread callbacks the test runs itself,
so tests stay synchronous and deterministic.

Tests: used by ``tests/unit/test_broker_model.py`` and ``tests/unit/test_broker_durable.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.journal import Journal, JournalConfig
from malamute_pack.protocol import mlm
from malamute_pack.transport.sessions import MlmSessions
from tests.clock_support import ThreadedClock


class BrokerHarness:
    """
    A broker on a L{Clock}, with MLM peers named by their routing ids: the
    frames they send go through the broker's real session table
    (L{MlmSessions}: decoding, size limits, dialects), and what the broker
    sends each of them is recorded.
    """

    def __init__(
        self,
        config: BrokerConfig | None = None,
        journal_at: Path | None = None,
        journal_config: JournalConfig | None = None,
    ) -> None:
        config = config or BrokerConfig(timeout=5.0)
        self.clock = ThreadedClock()
        self.sent: dict[bytes, list[list[bytes]]] = {}
        # Peers whose queues are full: nothing can be sent to them.
        self.full: set[bytes] = set()
        self.journal: Journal | None = None
        if journal_at is not None:
            self.journal = Journal(
                journal_at, self.clock, journal_config or JournalConfig(prune_interval_s=3600)
            )
            self.recovered = self.journal.open()
        self.broker = Broker(self.clock, config, self.journal)
        # Live stream records the broker was told were sent, while the
        # test defers them as a socket does during a batch (defer_sends).
        self.deferred: list[tuple[bytes, Sequence[bytes], Callable[[], None]]] | None = None
        self.sessions = MlmSessions(
            self.broker, self._record, config.limits, deferred_output=self._defer
        )
        if journal_at is not None:
            self.broker.restore(self.recovered.queued)
            self.broker.streams.appends.restore(self.recovered.appends)
            self.broker.consumers.restore(self.recovered.consumers)
        self.broker.start()

    def _record(self, route: bytes, frames: Sequence[bytes]) -> bool:
        if route in self.full:
            return False
        self.sent.setdefault(route, []).append(list(frames))
        return True

    def _defer(
        self, route: bytes, frames: Sequence[bytes], undelivered: Callable[[], None]
    ) -> bool:
        if self.deferred is None:
            return self._record(route, frames)
        self.deferred.append((route, frames, undelivered))
        return True

    def defer_sends(self) -> None:
        """Hold live stream records back, as a socket does while it handles a batch."""
        self.deferred = []

    def send_deferred(self) -> None:
        """Send what was held back, in order; those to full peers are reported undelivered."""
        deferred, self.deferred = self.deferred or [], None
        for route, frames, undelivered in deferred:
            if not self._record(route, frames):
                undelivered()

    def connected(self, route: bytes) -> bool:
        """Whether peer C{route} has an open connection."""
        return self.broker.registry.get(self.sessions.session(route)) is not None

    def settle(self) -> None:
        """Let the journal write and read everything asked of it so far."""
        if self.journal is None:
            return
        journal = self.journal
        registry = self.broker.registry
        self.clock.run_thread_calls(
            lambda: (
                journal.pending_writes == 0
                and journal.pending_reads == 0
                and not any(
                    c.replaying or any(r.reading for r in c.ranges.values()) for c in registry
                )
            )
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
        self.sessions.receive(route, mlm.encode(message))

    def raw(self, route: bytes, frames: list[bytes]) -> None:
        """Deliver raw C{frames} from peer C{route}."""
        self.sessions.receive(route, frames)

    def take(self, route: bytes) -> list[mlm.Message]:
        """
        Every message sent to C{route} since the last take, decoded (after
        letting the journal settle).
        """
        self.settle()
        return [mlm.decode(frames) for frames in self.sent.pop(route, [])]

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
