"""
The broker's ROUTER socket as a Twisted service: binds every configured
endpoint, feeds each received message to the broker model and sends the
model's output back through the same socket.

Tests: ``tests/test_end_to_end.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# The ZAP domain the broker's sockets authenticate in.
ZAP_DOMAIN = "malamute"


class RouterSink:
    """The broker's L{FrameSink}: a ROUTER socket, addressed by routing id."""

    def __init__(self) -> None:
        self.socket: ZmqSocket | None = None

    def send(self, route: bytes, frames: Sequence[bytes]) -> bool:
        assert self.socket is not None, "the router is not bound"
        return self.socket.send([route, *frames])


class RouterService(Service):
    """
    Binds a ROUTER socket on C{endpoints} and connects it to C{broker}.

    @ivar plain: require PLAIN authentication (a ZAP handler must run).
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        broker: Broker,
        sink: RouterSink,
        endpoints: Sequence[str],
        plain: bool = False,
        sndhwm: int = 100_000,
        rcvhwm: int = 100_000,
    ) -> None:
        self._reactor = reactor
        self._context = context
        self.broker = broker
        self._sink = sink
        self.endpoints = list(endpoints)
        self.plain = plain
        self._sndhwm = sndhwm
        self._rcvhwm = rcvhwm
        self.socket: ZmqSocket | None = None
        self.bound: list[str] = []

    def startService(self) -> None:
        raw = self._context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.SNDHWM, self._sndhwm)
        raw.setsockopt(zmq.RCVHWM, self._rcvhwm)
        if self.plain:
            raw.setsockopt(zmq.PLAIN_SERVER, 1)
            raw.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        try:
            for endpoint in self.endpoints:
                raw.bind(endpoint)
                self.bound.append(raw.getsockopt_string(zmq.LAST_ENDPOINT))
                _log.info("Malamute broker bound to {endpoint}", endpoint=self.bound[-1])
        except zmq.ZMQError:
            raw.close(linger=0)
            raise
        self.socket = ZmqSocket(self._reactor, raw, self._received)
        self._sink.socket = self.socket
        self.broker.start()
        self.socket.startReading()
        super().startService()

    def _received(self, batch: Batch) -> None:
        receive = self.broker.receive
        for frames in batch:
            if len(frames) < 2:
                continue  # a ROUTER always prepends the routing id
            receive(frames[0], frames[1:])

    def stopService(self) -> None:
        super().stopService()
        self.broker.stop()
        if self.socket is not None:
            self.socket.close()
            self.socket = None
            self._sink.socket = None
        self.bound = []
