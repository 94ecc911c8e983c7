"""
A harness for driving the broker model in tests: it sends encoded frames in
from named peers and collects what the broker sends back, decoded.

Tests: used by ``tests/test_broker_model.py`` and ``tests/test_broker_client.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.protocol import mlm


class RecordingSink:
    """A L{FrameSink} that keeps every message the broker sends, per route."""

    def __init__(self) -> None:
        self.sent: dict[bytes, list[list[bytes]]] = {}

    def send(self, route: bytes, frames: Sequence[bytes]) -> bool:
        self.sent.setdefault(route, []).append(list(frames))
        return True


class BrokerHarness:
    """A broker on a L{Clock}, with peers named by their routing ids."""

    def __init__(self, config: BrokerConfig | None = None) -> None:
        self.clock = Clock()
        self.sink = RecordingSink()
        self.broker = Broker(self.sink, self.clock, config or BrokerConfig(timeout=5.0))
        self.broker.start()

    def send(self, route: bytes, message: mlm.Message) -> None:
        """Deliver C{message} from peer C{route} to the broker."""
        self.broker.receive(route, mlm.encode(message))

    def raw(self, route: bytes, frames: list[bytes]) -> None:
        """Deliver raw C{frames} from peer C{route}."""
        self.broker.receive(route, frames)

    def take(self, route: bytes) -> list[mlm.Message]:
        """Every message sent to C{route} since the last take, decoded."""
        return [mlm.decode(frames) for frames in self.sink.sent.pop(route, [])]

    def open(self, route: bytes, address: str = "") -> list[mlm.Message]:
        """
        Open a connection for C{route} under C{address}, expecting OK; return
        what followed the OK (mail waiting for that address).
        """
        self.send(route, mlm.ConnectionOpen(address=address))
        messages = self.take(route)
        assert messages[:1] == [mlm.Ok()], f"OPEN was answered with {messages}"
        return messages[1:]

    def command(self, route: bytes, message: mlm.Message) -> list[mlm.Message]:
        """Send C{message} and return what came back."""
        self.send(route, message)
        return self.take(route)
