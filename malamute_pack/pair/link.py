"""
The pair link's sockets: a ROUTER bound where the partner connects (what
the partner sends arrives there) and a DEALER connected to the partner's
(what this broker sends). Each direction is one ZeroMQ connection, which
reconnects by itself; the DEALER queues nothing for a partner that is not
connected (``IMMEDIATE``), so a message sent while the link is down is
refused at once, not delivered stale later: replication then starts over
with a catch-up, and heartbeats are simply missed.

Decoding is the codec's (L{malamute_pack.protocol.pair}); what arrives is
handed to C{received}, and what does not decode is counted and dropped.

Tests: ``tests/test_pair_service.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.protocol import pair as wire
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# Messages queued towards the partner before a send is refused.
SEND_QUEUE = 100_000


class PairLink:
    """The two sockets of the pair link; C{received} gets each decoded message."""

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        bind: str,
        connect: str,
        received: Callable[[wire.PairMessage], None],
    ) -> None:
        self._reactor = reactor
        self._context = context
        self.bind_endpoint = bind
        self.connect_endpoint = connect
        self._received = received
        self.bound: str | None = None
        self.malformed = 0
        self.sent = 0
        self.refused = 0
        self._inbound: ZmqSocket | None = None
        self._outbound: ZmqSocket | None = None

    def start(self) -> None:
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVHWM, SEND_QUEUE)
        try:
            router.bind(self.bind_endpoint)
        except zmq.ZMQError:
            router.close(linger=0)
            raise
        self.bound = router.getsockopt_string(zmq.LAST_ENDPOINT)
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IMMEDIATE, 1)
        dealer.setsockopt(zmq.SNDHWM, SEND_QUEUE)
        dealer.setsockopt(zmq.RECONNECT_IVL, 100)
        dealer.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        dealer.connect(self.connect_endpoint)
        self._inbound = ZmqSocket(self._reactor, router, self._batch)
        self._inbound.startReading()
        self._outbound = ZmqSocket(self._reactor, dealer, _ignore_batch)
        _log.info(
            "pair link bound to {bound}, partner at {partner}",
            bound=self.bound,
            partner=self.connect_endpoint,
        )

    def send(self, message: wire.PairMessage) -> bool:
        """Send C{message} to the partner; False when it cannot be queued."""
        if self._outbound is None:
            return False
        try:
            ok = self._outbound.send(wire.encode(message))
        except zmq.ZMQError:
            ok = False
        if ok:
            self.sent += 1
        else:
            self.refused += 1
        return ok

    def pauseReading(self) -> None:
        """Read nothing from the partner until L{resumeReading} (the journal is behind)."""
        if self._inbound is not None:
            self._inbound.pauseReading()

    def resumeReading(self) -> None:
        if self._inbound is not None:
            self._inbound.resumeReading()

    def _batch(self, batch: Batch) -> None:
        for frames in batch:
            try:
                message = wire.decode(frames[1:])
            except wire.MalformedPairMessage as e:
                self.malformed += 1
                _log.warn("pair link: dropped a malformed message: {e}", e=e)
                continue
            try:
                self._received(message)
            except Exception:
                _log.failure("pair link: handling {kind} failed", kind=type(message).__name__)

    def stop(self) -> None:
        for sock in (self._inbound, self._outbound):
            if sock is not None:
                sock.close()
        self._inbound = self._outbound = None


def _ignore_batch(batch: Batch) -> None:
    """The DEALER only sends: the partner answers on its own DEALER."""
