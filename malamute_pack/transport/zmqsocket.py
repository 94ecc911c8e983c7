"""
A ZeroMQ socket inside the Twisted reactor, with no I/O threads.

The socket's ``zmq.FD`` is edge-triggered: it signals readable once when the
socket's state changes, not while messages wait. So a read drains until
a receive finds nothing (which, like a ``ZMQ_EVENTS`` check, first takes
in ZeroMQ's pending commands, and re-arms the edge), in batches handed to
the owner in one call, and the state is checked again after sends, since
a send can consume the edge that announced new input. A long flood is
drained a bounded number of batches at a time so timers and other
sockets still get their turn.

Sends can be deferred while a batch is handled (L{ZmqSocket.defer}): they
go out together, in order, once the owner is done with the batch. Each
message that completes a ZeroMQ pipe wakes the I/O thread if it was idle,
and a message sent between two of the owner's messages finds it idle
every time; a burst wakes it once. (Measured with libmlm's client on the
stream 1:1 scenario, journal off: a quarter more messages a second.) A
deferred message that cannot go after all is reported to a callback given
with it.

Tests: ``tests/unit/test_transport_zmqsocket.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import zmq
from twisted.internet.interfaces import IReactorFDSet, IReadDescriptor
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from malamute_pack.transport.zmqcore import (
    RecvBatch,
    recv_batch,
    recv_identified_batch,
    send_message,
)

_get = zmq.backend.Socket.get
_EVENTS: Final = int(zmq.EVENTS)
_SEND_ONLY: Final = frozenset({zmq.PUB, zmq.PUSH})

# One delivery to the owner: a list of multipart messages.
Batch = list[list[bytes]]


# Called when a deferred message could not be sent after all.
Undelivered = Callable[[], None]

_log = Logger()


@implementer(IReadDescriptor)
class ZmqSocket:
    """
    Reads a ZeroMQ socket from the reactor and sends on it without blocking.

    @ivar socket: the pyzmq socket, owned by this object once started.
    @ivar dropped: messages that could not be sent (the peer's queue was full).
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        socket: zmq.Socket[bytes],
        onBatch: Callable[[Batch], None],
        batchSize: int = 256,
        batchesPerTurn: int = 8,
        identified: bool = False,
    ) -> None:
        """
        @param identified: put before each message's frames the user its
            connection authenticated as (a ROUTER only; see
            L{malamute_pack.transport.zmqcore.recv_identified_batch}).
        """
        self._reactor = reactor
        self.socket = socket
        self._onBatch = onBatch
        self._batchSize = batchSize
        self._batchesPerTurn = batchesPerTurn
        # A socket that only sends (PUB, PUSH) cannot be asked to receive:
        # its readable edge is met with the ZMQ_EVENTS check alone.
        self._receive: RecvBatch | None = None
        if socket.type not in _SEND_ONLY:
            self._receive = recv_identified_batch if identified else recv_batch
        self._fd: int = socket.getsockopt(zmq.FD)  # type: ignore[assignment]
        self._recheckScheduled = False
        self._reading = False
        self._closed = False
        self._paused = False
        self.dropped = 0
        # Sends deferred while a batch is handled: (first, rest, undelivered).
        self._deferred: list[tuple[bytes, Sequence[bytes], Undelivered]] = []

    # IReadDescriptor

    def fileno(self) -> int:
        return -1 if self._closed else self._fd

    def logPrefix(self) -> str:
        return "ZmqSocket"

    def connectionLost(self, reason: Failure) -> None:
        _log.warn("ZeroMQ socket removed from the reactor: {reason}", reason=reason)

    def doRead(self) -> None:
        """Drain up to C{batchesPerTurn} batches; come back soon if more wait."""
        if self._closed or self._paused:
            return
        sock = self.socket
        receive = self._receive
        if receive is None:
            _get(sock, _EVENTS)  # takes in ZeroMQ's commands, re-arming the edge
            return
        self._reading = True
        try:
            for _ in range(self._batchesPerTurn):
                batch = receive(sock, self._batchSize)
                if not batch:
                    # A receive that finds nothing has processed ZeroMQ's
                    # pending commands first, as the ZMQ_EVENTS check does:
                    # nothing waits, and the edge will fire again.
                    return
                try:
                    self._onBatch(batch)
                finally:
                    while self._deferred:  # a report of one may defer more
                        self._send_deferred()
                if self._closed or self._paused:
                    return
            # Still input after a full turn: the edge will not fire again.
            self._scheduleRecheck()
        finally:
            self._reading = False

    # Sending

    def send(self, frames: Sequence[bytes]) -> bool:
        """
        Send one multipart message without blocking.

        @return: False if it was dropped because the peer's queue is full
            (or, on a ROUTER with mandatory routing, the peer is unknown).
        """
        return self.send_to(frames[0], frames[1:])

    def send_to(self, first: bytes, rest: Sequence[bytes]) -> bool:
        """
        Send C{first} then C{rest} as one message (on a ROUTER, C{first} is
        the peer's routing id); as L{send}. What was deferred goes first.
        """
        if self._deferred:
            self._send_deferred()
        return self._send_now(first, rest)

    def defer(self, first: bytes, rest: Sequence[bytes], undelivered: Undelivered) -> bool:
        """
        As L{send_to}, except while a batch is being handled: then the
        message waits, with the others deferred, until the owner is done
        with the batch (or something is sent with L{send_to}), and this
        returns True. If it cannot go then, C{undelivered} is called, and
        every later deferred message to the same C{first} is not sent
        either (each its C{undelivered} called), so that a peer never gets
        a message after one it missed.
        """
        if not self._reading:
            return self._send_now(first, rest)
        self._deferred.append((first, rest, undelivered))
        return True

    def _send_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        refused: set[bytes] = set()
        for first, rest, undelivered in deferred:
            if first in refused:
                self.dropped += 1
            elif not self._send_now(first, rest):
                refused.add(first)
            else:
                continue
            try:
                undelivered()
            except Exception:
                # The reactor drops a reader that raises: a bug here must
                # cost this report, not the socket.
                _log.failure("reporting a message to {route} undelivered failed", route=first.hex())

    def _send_now(self, first: bytes, rest: Sequence[bytes]) -> bool:
        if self._closed:
            # Closed (the broker stopping) while a journal read was still
            # on its way: nobody to send to any more, and no retry to make.
            self.dropped += 1
            return True
        try:
            send_message(self.socket, first, rest)
        except zmq.ZMQError as e:
            if e.errno not in (zmq.EAGAIN, zmq.EHOSTUNREACH):
                raise
            self.dropped += 1
            return False
        finally:
            if not self._reading:
                self._scheduleRecheck()
        return True

    def _scheduleRecheck(self) -> None:
        if not self._recheckScheduled and not self._closed:
            self._recheckScheduled = True
            self._reactor.callLater(0, self._recheck)  # type: ignore[attr-defined]

    def _recheck(self) -> None:
        self._recheckScheduled = False
        self.doRead()

    # Lifetime

    def startReading(self) -> None:
        """Register with the reactor and read anything already waiting."""
        self._reactor.addReader(self)
        self._scheduleRecheck()

    @property
    def paused(self) -> bool:
        """Whether reading is paused (L{pauseReading})."""
        return self._paused

    def pauseReading(self) -> None:
        """
        Read nothing until L{resumeReading}: what peers send waits in
        ZeroMQ's queues, and once those are full, in theirs (backpressure).
        Sending goes on.
        """
        self._paused = True

    def resumeReading(self) -> None:
        """Read again, starting with whatever waited."""
        if self._paused:
            self._paused = False
            self._scheduleRecheck()

    def close(self, linger: int = 0) -> None:
        """Leave the reactor and close the socket."""
        if self._closed:
            return
        self._reactor.removeReader(self)
        self._closed = True
        self._deferred = []
        self.socket.close(linger=linger)
