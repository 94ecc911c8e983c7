"""
The broker's ROUTER socket as a Twisted service: binds every configured
endpoint and feeds what arrives to the L{MlmSessions} of that socket, which
decode it for the broker; the sessions answer through the same socket.

Tests: ``tests/test_end_to_end.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.broker.limits import Limits
from malamute_pack.broker.session import Receiver
from malamute_pack.transport.sessions import MlmSessions
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# The ZAP domain the broker's sockets authenticate in.
ZAP_DOMAIN = "malamute"


class RouterService(Service):
    """
    Binds a ROUTER socket on C{endpoints}; its peers are sessions of
    C{receiver} (the broker).

    @ivar plain: require PLAIN authentication (a ZAP handler must run).
    @ivar bound: the endpoints bound, as ZeroMQ reports them (a C{*} port
        replaced by the real one), once started.
    @ivar sessions: the peers, once started.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        receiver: Receiver,
        limits: Limits,
        endpoints: Sequence[str],
        plain: bool = False,
        sndhwm: int = 100_000,
        rcvhwm: int = 100_000,
    ) -> None:
        self._reactor = reactor
        self._context = context
        self._receiver = receiver
        self._limits = limits
        self.endpoints = list(endpoints)
        self.plain = plain
        self._sndhwm = sndhwm
        self._rcvhwm = rcvhwm
        self.socket: ZmqSocket | None = None
        self.sessions: MlmSessions | None = None
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
        self.sessions = MlmSessions(self._receiver, self.socket.send_to, self._limits)
        self.socket.startReading()
        super().startService()

    def _received(self, batch: Batch) -> None:
        assert self.sessions is not None
        receive = self.sessions.receive
        for frames in batch:
            if len(frames) < 2:
                continue  # a ROUTER always prepends the routing id
            try:
                receive(frames[0], frames[1:])
            except Exception:
                # A bug met by one message must not cost the rest of the
                # batch, nor the socket (the reactor drops a reader that raises).
                _log.failure("handling a message from {route} failed", route=frames[0].hex())

    def stopService(self) -> None:
        super().stopService()
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        self.bound = []
