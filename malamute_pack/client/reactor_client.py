"""
The Malamute client for Twisted programs: a DEALER socket in the reactor
(through L{ZmqSocket}) driving the shared L{ClientCore}, with Deferreds for
command results and for deliveries.

    client = await MalamuteClient.connect(reactor, "ipc://@/malamute", "me")
    await client.set_consumer("weather", r"^temp\\.")
    delivery = await client.recv()

Commands (C{set_producer}, C{set_consumer}, C{remove_consumer},
C{set_worker}) fire with None on OK and fail with L{MalamuteError} on
ERROR. Deliveries queue until C{recv()} takes them, or go straight to an
C{on_delivery} callback (no Deferred per message: for high rates). Names
too long for the wire (over 255 bytes) raise ValueError at the call. When the
broker forgets the client (it restarted, or expired it), the core opens
again and replays the settings; C{reconnects} counts those times.

The client speaks protocol version 2 by default (``version=1`` for the C
broker); see L{malamute_pack.client.core} for what that adds. With version
2, C{sendto} and C{sendfor} return a Deferred that fires with the message's
id once the broker stored it (failing with L{MalamuteError} if it refused
it); mailbox and service deliveries are answered with DONE when C{recv()}
hands them over or C{on_delivery} returns (or, with C{auto_done=False}, when
the application calls C{done(delivery)}); C{set_consumer} can start from a
position (C{whence}); STREAM_GAPs go to C{on_gap} or C{recv_gap()}.

Tests: ``tests/test_client_reactor.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, cast

import zmq
from twisted.internet import defer
from twisted.internet.defer import Deferred, DeferredQueue
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.client.core import ClientCore, ClientState, Done
from malamute_pack.client.errors import BadEndpointError, ClientClosedError, ClientError
from malamute_pack.client.events import Confirmation, Delivery, Gap
from malamute_pack.client.facade import CoreFacade
from malamute_pack.protocol import mlm
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

_T = TypeVar("_T")

# Deep queues so that a burst from the application is not dropped at once.
SOCKET_HWM = 100_000


class _DelayedCall(Protocol):
    def active(self) -> bool: ...
    def cancel(self) -> None: ...
    def getTime(self) -> float: ...


class _Timers(Protocol):
    """The part of C{IReactorTime} the client uses."""

    def seconds(self) -> float: ...
    def callLater(self, delay: float, f: Callable[[], None]) -> _DelayedCall: ...


def make_dealer(
    context: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    plain: tuple[str, str] | None = None,
) -> zmq.Socket[bytes]:
    """
    A DEALER connected to C{endpoint}, with PLAIN credentials if given.

    @raise BadEndpointError: if ZeroMQ refuses the endpoint.
    """
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SNDHWM, SOCKET_HWM)
    socket.setsockopt(zmq.RCVHWM, SOCKET_HWM)
    if plain is not None:
        socket.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
        socket.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as e:
        socket.close(linger=0)
        raise BadEndpointError(f"cannot connect to {endpoint!r}: {e}") from e
    return socket


class MalamuteClient(CoreFacade):
    """
    A connection to a Malamute broker, in the reactor.

    Make one with L{MalamuteClient.connect}.

    @ivar on_delivery: if set, called with each L{Delivery} instead of
        queueing it for L{recv}.
    @ivar on_gap: if set, called with each L{Gap} (version 2) instead of
        queueing it for L{recv_gap}.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        socket: zmq.Socket[bytes],
        address: str = "",
        timeout: float = 5.0,
        heartbeat: float = 1.0,
        on_delivery: Callable[[Delivery], object] | None = None,
        version: int = 2,
        auto_done: bool = True,
        on_gap: Callable[[Gap], object] | None = None,
    ) -> None:
        self._clock = cast(_Timers, reactor)
        self._core = ClientCore(
            self._clock, self, address, timeout, heartbeat, version=version, auto_done=auto_done
        )
        self._socket = ZmqSocket(reactor, socket, self._received)
        self._deliveries: DeferredQueue[Delivery] = DeferredQueue()
        self._confirmations: DeferredQueue[Confirmation] = DeferredQueue()
        self._gaps: DeferredQueue[Gap] = DeferredQueue()
        self._timer: _DelayedCall | None = None
        self.on_delivery = on_delivery
        self.on_gap = on_gap

    @classmethod
    def connect(
        cls,
        reactor: IReactorFDSet,
        endpoint: str,
        address: str = "",
        timeout: float = 5.0,
        heartbeat: float = 1.0,
        plain: tuple[str, str] | None = None,
        on_delivery: Callable[[Delivery], object] | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        version: int = 2,
        auto_done: bool = True,
        on_gap: Callable[[Gap], object] | None = None,
    ) -> Deferred[MalamuteClient]:
        """
        Connect to the broker at C{endpoint} as C{address} ("" = anonymous).

        @param timeout: seconds to wait for OK to CONNECTION_OPEN, and of
            silence after which the connection counts as lost.
        @param heartbeat: seconds between CONNECTION_PINGs.
        @param plain: (user, password) for PLAIN security.
        @param version: the protocol version: 2 (journaled streams, durable
            mailboxes and queues, docs/protocol.md) or 1 (libmlm's, for the
            C broker).
        @param auto_done: (version 2) answer each mailbox and service
            delivery with DONE 200 when it is handed to the application;
            if False the application calls L{done}.
        @return: fires with the client once the broker said OK; fails with
            L{MalamuteError} on ERROR, L{BrokerUnreachableError} on timeout,
            L{BadEndpointError} if ZeroMQ refuses the endpoint.
        """
        try:
            socket = make_dealer(context or zmq.Context.instance(), endpoint, plain)
        except ClientError as e:
            return defer.fail(e)
        try:
            client = cls(
                reactor,
                socket,
                address,
                timeout,
                heartbeat,
                on_delivery,
                version,
                auto_done,
                on_gap,
            )
        except ValueError as e:  # bad timings or version, or an address too long for the wire
            socket.close(linger=0)
            return defer.fail(e)
        d: Deferred[MalamuteClient] = Deferred()

        def opened(error: ClientError | None) -> None:
            if error is None:
                d.callback(client)
            else:
                client._shutdown()
                d.errback(error)

        client._socket.startReading()
        client._core.connect(opened)
        client._reschedule()
        return d

    # State

    @property
    def dropped(self) -> int:
        """Messages dropped: the socket's queue was full, or too many were held."""
        return self._socket.dropped + self._core.held_dropped

    # Commands

    def set_producer(self, stream: str) -> Deferred[None]:
        """Publish to C{stream} from now on."""
        return self._command(lambda done: self._core.set_producer(stream, done))

    def set_consumer(
        self, stream: str, pattern: str, whence: int = mlm.LATEST, position: int = 0
    ) -> Deferred[None]:
        """
        Read C{stream} for the subjects C{pattern} finds, from C{whence}:
        C{mlm.LATEST} (from now on), or with version 2 C{mlm.EARLIEST},
        C{mlm.SEQUENCE} (from message number C{position}) or C{mlm.TIME}
        (from C{position}, milliseconds since the epoch).

        @raise ValueError: at the call, for a position with version 1.
        """
        return self._command(
            lambda done: self._core.set_consumer(stream, pattern, done, whence, position)
        )

    def remove_consumer(self, stream: str) -> Deferred[None]:
        """Stop reading C{stream}."""
        return self._command(lambda done: self._core.remove_consumer(stream, done))

    def set_worker(self, service: str, pattern: str) -> Deferred[None]:
        """Serve requests to C{service} whose subjects C{pattern} finds."""
        return self._command(lambda done: self._core.set_worker(service, pattern, done))

    def _command(self, start: Callable[[Done], None]) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        start(_settle(d))
        self._reschedule()
        return d

    def close(self) -> Deferred[None]:
        """Say CONNECTION_CLOSE, wait briefly for OK, then close the socket."""
        d: Deferred[None] = Deferred()

        def closed(error: ClientError | None) -> None:
            self._shutdown()
            d.callback(None)

        self._core.close(closed)
        self._reschedule()
        return d

    # Messages without a reply

    def send(self, subject: str, content: Sequence[bytes]) -> None:
        """Publish a message to the producer stream."""
        self._core.send(subject, content)

    def sendto(
        self,
        address: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
    ) -> Deferred[int] | None:
        """
        Send a letter to the mailbox C{address}.

        @return: with version 1, None; with version 2, a Deferred that fires
            with the message's id once the broker stored it, or fails with
            L{MalamuteError} if it refused it (e.g. 300, a full mailbox) or
            L{ClientClosedError} if the client closed first.
        """
        if self._core.version < 2:
            self._core.sendto(address, subject, content, tracker, timeout_ms)
            return None
        d: Deferred[int] = Deferred()
        self._core.sendto(address, subject, content, tracker, timeout_ms, _settle_stored(d))
        return d

    def sendfor(
        self,
        service: str,
        subject: str,
        content: Sequence[bytes],
        tracker: str = "",
        timeout_ms: int = 0,
    ) -> Deferred[int] | None:
        """
        Send a request to C{service}; the reply comes to our mailbox.

        @return: as for L{sendto}.
        """
        if self._core.version < 2:
            self._core.sendfor(service, subject, content, tracker, timeout_ms)
            return None
        d: Deferred[int] = Deferred()
        self._core.sendfor(service, subject, content, tracker, timeout_ms, _settle_stored(d))
        return d

    # Receiving

    def recv(self) -> Deferred[Delivery]:
        """
        The next delivery (stream, mailbox or service message). Deliveries
        that arrive while C{on_delivery} is set go to it instead. With
        C{auto_done}, a mailbox or service record is answered with DONE as
        it is handed over here.
        """
        return self._get(self._deliveries).addCallback(self._hand_over)

    def _hand_over(self, delivery: Delivery) -> Delivery:
        self._core.handed_over(delivery)
        return delivery

    def recv_gap(self) -> Deferred[Gap]:
        """The next STREAM_GAP (version 2), unless C{on_gap} is set."""
        return self._get(self._gaps)

    def recv_confirm(self) -> Deferred[Confirmation]:
        """The next CONFIRM the broker forwarded about a letter we sent."""
        return self._get(self._confirmations)

    def pending(self) -> int:
        """Deliveries queued for L{recv}."""
        return len(self._deliveries.pending)

    def _get(self, queue: DeferredQueue[_T]) -> Deferred[_T]:
        if not queue.pending and self._core.state is ClientState.CLOSED:
            return defer.fail(ClientClosedError("the client is closed"))
        return queue.get()

    # CoreOwner

    def send_frames(self, frames: list[bytes]) -> None:
        self._socket.send(frames)

    def delivered(self, delivery: Delivery) -> None:
        callback = self.on_delivery
        if callback is None:
            self._deliveries.put(delivery)
            return
        try:
            callback(delivery)
        except Exception:
            _log.failure("on_delivery raised; the delivery is lost")
            self._core.handed_over(delivery, mlm.FAILED, "the recipient failed to process it")
        else:
            self._core.handed_over(delivery)

    def confirmed(self, confirmation: Confirmation) -> None:
        self._confirmations.put(confirmation)

    def gap(self, gap: Gap) -> None:
        callback = self.on_gap
        if callback is None:
            self._gaps.put(gap)
            return
        try:
            callback(gap)
        except Exception:
            _log.failure("on_gap raised")

    # Driving the core

    def _received(self, batch: Batch) -> None:
        receive = self._core.receive
        for frames in batch:
            receive(frames)
        self._reschedule()

    def _reschedule(self) -> None:
        """Have the reactor call the core when it next wants to run timers."""
        when = self._core.wakeup_at()
        timer = self._timer
        if when is None:
            if timer is not None and timer.active():
                timer.cancel()
            self._timer = None
            return
        if timer is not None and timer.active():
            # A late wake-up would miss a timer; an early one is harmless.
            if timer.getTime() <= when:
                return
            timer.cancel()
        self._timer = self._clock.callLater(max(0.0, when - self._clock.seconds()), self._wake)

    def _wake(self) -> None:
        self._timer = None
        self._core.on_time()
        self._reschedule()

    def _shutdown(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._socket.close()
        for queue in (self._deliveries, self._confirmations, self._gaps):
            waiting: list[Deferred[object]] = queue.waiting  # type: ignore[assignment]
            while waiting:
                waiting.pop(0).errback(ClientClosedError("the client was closed"))


def _settle_stored(d: Deferred[int]) -> Callable[[int | ClientError], None]:
    """A core STORED callback that fires C{d}."""

    def stored(result: int | ClientError) -> None:
        if isinstance(result, ClientError):
            d.errback(result)
        else:
            d.callback(result)

    return stored


def _settle(d: Deferred[None]) -> Callable[[ClientError | None], None]:
    """A core completion callback that fires C{d}."""

    def done(error: ClientError | None) -> None:
        if error is None:
            d.callback(None)
        else:
            d.errback(error)

    return done
