"""
A ROUTER socket of the broker as a Twisted service: binds its endpoints
(all of one security mechanism: NULL, PLAIN or CURVE) and feeds what
arrives to the L{MlmSessions} of that socket, which decode it for the
broker; the sessions answer through the same socket. On a PLAIN or CURVE
socket every message is read with the user ZAP gave its connection
(L{ZmqSocket}'s C{identified} mode), so the sessions know their users and
a routing id taken over by another user's connection is seen at once.

Tests: ``tests/test_end_to_end.py``, ``tests/test_transport_security.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import zmq
from twisted.application.service import Service
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
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

    @ivar mechanism: the security its peers must pass: C{"null"} (none),
        C{"plain"} or C{"curve"} (a ZAP handler must run for either; with
        C{"curve"}, C{curve_secret} is the broker's secret key). Each
        authenticated peer's session knows its user.
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
        mechanism: str = "null",
        curve_secret: bytes | None = None,
    ) -> None:
        if mechanism not in ("null", "plain", "curve"):
            raise ValueError(f"unknown security mechanism {mechanism!r}")
        if (mechanism == "curve") != (curve_secret is not None):
            raise ValueError("CURVE needs the broker's secret key, and only CURVE takes one")
        self._reactor = reactor
        self._context = context
        self._receiver = receiver
        self._limits = limits
        self.endpoints = list(endpoints)
        self.mechanism = mechanism
        self._curve_secret = curve_secret
        self.socket: ZmqSocket | None = None
        self.sessions: MlmSessions | None = None
        self.bound: list[str] = []
        self._paused = False

    def startService(self) -> None:
        raw = self._context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        # Bounded queues per peer. A send to a peer whose queue is full fails
        # at once (ROUTER_MANDATORY) instead of being dropped unseen, so the
        # broker knows the peer does not drain and stops pushing at it.
        raw.setsockopt(zmq.ROUTER_MANDATORY, 1)
        raw.setsockopt(zmq.SNDHWM, self._limits.send_queue)
        raw.setsockopt(zmq.RCVHWM, self._limits.receive_queue)
        if self.mechanism == "plain":
            raw.setsockopt(zmq.PLAIN_SERVER, 1)
        elif self.mechanism == "curve":
            assert self._curve_secret is not None
            raw.setsockopt(zmq.CURVE_SERVER, 1)
            raw.setsockopt(zmq.CURVE_SECRETKEY, self._curve_secret)
        if self.mechanism != "null":
            raw.setsockopt_string(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        try:
            for endpoint in self.endpoints:
                raw.bind(endpoint)
                self.bound.append(raw.getsockopt_string(zmq.LAST_ENDPOINT))
                _log.info("Malamute broker bound to {endpoint}", endpoint=self.bound[-1])
        except zmq.ZMQError:
            raw.close(linger=0)
            raise
        identified = self.mechanism != "null"
        self.socket = ZmqSocket(
            self._reactor,
            raw,
            self._received_identified if identified else self._received,
            identified=identified,
        )
        clock: IReactorTime = self._reactor  # type: ignore[assignment]
        self.sessions = MlmSessions(self._receiver, self.socket.send_to, self._limits, clock)
        self.socket.startReading()
        if self._paused:
            self.socket.pauseReading()
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

    def _received_identified(self, batch: Batch) -> None:
        """As L{_received}, each message preceded by its connection's user."""
        assert self.sessions is not None
        receive = self.sessions.receive
        for frames in batch:
            if len(frames) < 3:
                continue
            try:
                user = frames[0].decode("utf-8", "surrogateescape") or None
                receive(frames[1], frames[2:], user)
            except Exception:
                _log.failure("handling a message from {route} failed", route=frames[1].hex())

    def pauseReading(self) -> None:
        """Read nothing from the peers until L{resumeReading} (backpressure)."""
        self._paused = True
        if self.socket is not None:
            self.socket.pauseReading()

    def resumeReading(self) -> None:
        self._paused = False
        if self.socket is not None:
            self.socket.resumeReading()

    def stopService(self) -> None:
        super().stopService()
        if self.sessions is not None:
            self.sessions.stop()
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        self.bound = []
