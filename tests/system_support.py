"""
Support for slow system tests: raw blocking DEALER peers that speak the
protocol through the codec (deliberately not the project's client
library), and L{SystemCase}, a test case with a directory and a ZeroMQ
context that starts brokers as real processes
(L{malamute_pack.testing.brokerprocess.BrokerProcess}).

Tests: used by the ``tests/system/test_system_*.py`` modules.
"""

from __future__ import annotations

from pathlib import Path
from time import monotonic

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess


class Peer:
    """A raw DEALER connected to the broker: encoded sends, decoded receives."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        *,
        plain: tuple[str, str] | None = None,
        curve: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        """
        @param plain: PLAIN user and password.
        @param curve: CURVE keys (Z85): the server's public key, then the
            peer's public and secret keys.
        """
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if plain is not None:
            self.socket.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
            self.socket.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
        if curve is not None:
            self.socket.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
            self.socket.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
            self.socket.setsockopt(zmq.CURVE_SECRETKEY, curve[2])
        # Room for everything a load run pipelines while the broker is down.
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        self.socket.connect(endpoint)

    def send(self, message: mlm.Message) -> None:
        self.socket.send_multipart(mlm.encode(message))

    def receive(self, timeout: float) -> mlm.Message | None:
        """The next message within C{timeout} seconds, or None."""
        if not self.socket.poll(int(timeout * 1000)):
            return None
        return mlm.decode(self.socket.recv_multipart())

    def receive_ready(self) -> list[mlm.Message]:
        """Every message already waiting, without blocking."""
        found: list[mlm.Message] = []
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return found
            found.append(mlm.decode(frames))

    def command(self, message: mlm.Message, timeout: float = 5.0) -> mlm.Message | None:
        self.send(message)
        return self.receive(timeout)

    def expect(self, cls: type[mlm.Message], timeout: float = 5.0) -> mlm.Message:
        """The next message that is a C{cls}, skipping others; fails after C{timeout}."""
        deadline = monotonic() + timeout
        skipped: list[mlm.Message] = []
        while True:
            message = self.receive(max(0.0, deadline - monotonic()))
            if message is None:
                raise AssertionError(f"no {cls.__name__} within {timeout}s; got {skipped}")
            if isinstance(message, cls):
                return message
            skipped.append(message)

    def close(self) -> None:
        self.socket.close(linger=0)


class SystemCase(SynchronousTestCase):
    """
    A test with C{base}, a directory of its own, and C{context}, a ZeroMQ
    context; brokers it starts are stopped (and that stop checked) after it.
    """

    def setUp(self) -> None:
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def start(
        self,
        *args: str,
        bind: str | None = None,
        curve: tuple[str, str, str] | None = None,
        plain: tuple[str, str] | None = None,
    ) -> BrokerProcess:
        """A broker in C{base}/broker with C{args} for C{twistd malamute}, started."""
        broker = BrokerProcess(
            self.base / "broker",
            args=args,
            bind=bind,
            plain=plain,
            curve=curve,
        )
        self.addCleanup(broker.stop)
        broker.start()
        return broker
