"""
The Malamute client for Twisted programs: a DEALER socket in the reactor
(through L{ZmqSocket}) driving the shared L{ClientCore}, with Deferreds for
command results and for deliveries.

    client = await MalamuteClient.connect(reactor, "ipc://@/malamute", "me", timeout=2.0)
    await client.set_consumer("weather", r"^temp\\.")
    delivery = await client.recv()

Commands (C{set_producer}, C{set_consumer}, C{remove_consumer},
C{set_worker}) fire with None on OK and fail with L{MalamuteError} on
ERROR. Deliveries queue until C{recv()} takes them, or go straight to an
C{on_delivery} callback (no Deferred per message: for high rates). Names
too long for the wire (over 255 bytes) raise ValueError at the call. When the
broker forgets the client (it restarted, or expired it), the core opens
again and replays the settings; C{reconnects} counts those times.

The endpoint may be several: a list, or endpoints separated by commas
(C{"tcp://a:9999,tcp://b:9999"}, a primary/backup pair). The client opens
on the first that accepts it, trying them in order, and moves to the next
(a new socket, reopening and replaying there) when the broker it is on
answers ERROR 503 (the passive of a pair) or goes silent; C{endpoint} is the
one it is on, C{switches} counts the moves. With several endpoints, a
socket monitor on the DEALER (read through a L{ZmqSocket} of its own)
tells the core at once when the connection breaks (a broker killed: the
client moves on without waiting for silence) or comes up, and the DEALER
queues only on a connection that is up, so that an endpoint nobody listens
on is left after a short grace (``malamute_pack.client.monitor``). With
one endpoint or several, that monitor also says at once when the broker
refuses the credentials (or requires some and none were given):
C{connect} fails with L{AuthenticationRefusedError} then, not after its
timeout. A CURVE client whose handshakes the broker keeps breaking off (the
broker's key it was given is wrong) fails with L{WrongServerKeyError} as
soon as two did, or at its timeout after one (L{Handshakes}).

Options (L{ClientOptions}) are given as C{options=} and/or as keyword
overrides (C{timeout=2.0, version=1}...). The client speaks protocol
version 2 by default (``version=1`` for the C broker); see
L{malamute_pack.client.core} for what that adds. With version
2, C{sendto} and C{sendfor} return a Deferred that fires with the message's
id once the broker stored it (failing with L{MalamuteError} if it refused
it); mailbox and service deliveries are answered with DONE when C{recv()}
hands them over or C{on_delivery} returns (or, with C{auto_done=False}, when
the application calls C{done(delivery)}); C{set_consumer} can start from a
position (C{whence}); STREAM_GAPs go to C{on_gap} or C{recv_gap()}.

Tests: ``tests/unit/test_client_reactor.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar, Unpack, cast

import zmq
from twisted.internet import defer
from twisted.internet.defer import Deferred, DeferredQueue
from twisted.internet.interfaces import IReactorFDSet
from twisted.logger import Logger

from malamute_pack.client.core import ClientCore, ClientState, Done
from malamute_pack.client.dealer import check_endpoints, make_watched_dealer
from malamute_pack.client.endpoints import EndpointSpec, parse_endpoints
from malamute_pack.client.errors import (
    AuthenticationRefusedError,
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
)
from malamute_pack.client.events import Confirmation, Delivery, Gap, partition
from malamute_pack.client.facade import ClientFacade
from malamute_pack.client.monitor import (
    Handshakes,
    LinkChange,
    Refusal,
    link_change,
    refusal_error,
    unwatch,
)
from malamute_pack.client.options import ClientOptions, OptionOverrides, resolve_options
from malamute_pack.client.outbox import StoredCallback
from malamute_pack.protocol import mlm
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

_T = TypeVar("_T")


class _DelayedCall(Protocol):
    def active(self) -> bool: ...
    def cancel(self) -> None: ...
    def getTime(self) -> float: ...


class _Timers(Protocol):
    """The part of C{IReactorTime} the client uses."""

    def seconds(self) -> float: ...
    def callLater(self, delay: float, f: Callable[[], None]) -> _DelayedCall: ...


class MalamuteClient(ClientFacade[Deferred[None], Deferred[int]]):
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
        options: ClientOptions,
        on_delivery: Callable[[Delivery], object] | None = None,
        on_gap: Callable[[Gap], object] | None = None,
        *,
        endpoints: Sequence[str] = (),
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        monitor: zmq.Socket[bytes] | None = None,
    ) -> None:
        """
        @param socket: a DEALER connected to the first of C{endpoints}.
        @param endpoints: every endpoint, in order; with several, the
            client fails over between them, making its new sockets in
            C{context} (the global one if None).
        @param monitor: the PAIR socket of C{socket}'s monitor
            (L{make_watched_dealer}): with several endpoints, whether the
            connection is up; with any, whether the broker refused the
            credentials.
        """
        self._reactor = reactor
        self._clock = cast(_Timers, reactor)
        self._context = context
        self._core = ClientCore(self._clock, self, options, endpoints)
        self._socket = ZmqSocket(reactor, socket, self._received)
        self._monitor: ZmqSocket | None = None
        self._linked = True  # whether the connection is up (always, as far as one endpoint goes)
        self._several = len(endpoints) > 1
        self._handshakes = Handshakes()
        if monitor is not None:
            self._watch(monitor)
        self._dropped_before = 0  # by the sockets of endpoints left
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
        endpoint: EndpointSpec,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        on_delivery: Callable[[Delivery], object] | None = None,
        on_gap: Callable[[Gap], object] | None = None,
        **overrides: Unpack[OptionOverrides],
    ) -> Deferred[MalamuteClient]:
        """
        Connect to the broker at C{endpoint} as C{address} ("" = anonymous).

        @param endpoint: one endpoint, or several (a list, or separated by
            commas): they are tried in order, and the client fails over
            between them (see the module).
        @param options: the L{ClientOptions} (the defaults if None);
            C{address} and the keyword C{overrides} (C{timeout},
            C{heartbeat}, C{plain}, C{version}, C{auto_done}...) replace
            their fields.
        @param context: the ZeroMQ context (the global one if None).
        @return: fires with the client once the broker said OK; fails with
            L{MalamuteError} on ERROR, L{BrokerUnreachableError} on timeout,
            L{AuthenticationRefusedError} (at once) if the broker refused
            the credentials or requires some and none were given (its
            L{WrongServerKeyError} if it broke off the CURVE handshakes),
            L{BadEndpointError} if ZeroMQ refuses the endpoint, ValueError
            for options that are not valid. Cancelling it closes the
            client at once (CancelledError).
        """
        try:
            resolved = resolve_options(options, address, overrides)
            endpoints = parse_endpoints(endpoint)
            zmq_context = context or zmq.Context.instance()
            check_endpoints(zmq_context, endpoints[1:])
            socket, monitor = make_watched_dealer(
                zmq_context,
                endpoints[0],
                resolved.plain,
                resolved.curve,
                immediate=len(endpoints) > 1,
            )
        except (ClientError, ValueError) as e:
            return defer.fail(e)
        client = cls(
            reactor,
            socket,
            resolved,
            on_delivery,
            on_gap,
            endpoints=endpoints,
            context=context,
            monitor=monitor,
        )

        def cancel(_: Deferred[MalamuteClient]) -> None:
            # Given up before the broker answered: the half-open client goes
            # at once (its socket, its timer), not at its connect timeout.
            client._shutdown()

        d: Deferred[MalamuteClient] = Deferred(cancel)

        def opened(error: ClientError | None) -> None:
            if d.called:  # cancelled
                return
            if error is None:
                d.callback(client)
            else:
                error = client._refused_instead(error)
                client._shutdown()
                d.errback(error)

        client._socket.startReading()
        client._core.connect(opened)
        client._reschedule()
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

    # Receiving

    def recv(self) -> Deferred[Delivery]:
        """
        The next delivery (stream, mailbox or service message). Deliveries
        that arrive while C{on_delivery} is set go to it instead. With
        C{auto_done}, a mailbox or service record is answered with DONE as
        it is handed over here.
        """
        return self._get(self._deliveries).addCallback(self._hand_over)

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
        if not self._socket.send(frames) and not self._linked:
            # No connection (several endpoints): not a full queue. Nothing
            # waits for one: a ping, or what goes again after the reopen.
            self._dropped_before -= 1

    def try_send(self, frames: list[bytes]) -> bool:
        sent = self._socket.send(frames)
        if not sent:
            self._dropped_before -= 1  # not dropped: the core keeps it until a connection is up
        return sent

    def connect_to(self, endpoint: str) -> None:
        old = self._socket
        self._dropped_before += old.dropped
        self._unwatch()
        old.close()
        options = self._core.options
        socket, monitor = make_watched_dealer(
            self._context or zmq.Context.instance(), endpoint, options.plain, options.curve
        )
        self._socket = ZmqSocket(self._reactor, socket, self._received)
        self._watch(monitor)
        self._socket.startReading()

    def withdraw(self, stale: Callable[[Delivery], bool]) -> list[Delivery]:
        kept, dropped = partition(self._deliveries.pending, stale)
        if dropped:
            self._deliveries.pending[:] = kept
        return dropped

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

    # The I/O for the facade

    @property
    def _socket_dropped(self) -> int:
        return self._dropped_before + self._socket.dropped

    def _run_command(self, start: Callable[[Done], None]) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        start(_settle(d))
        self._reschedule()
        return d

    def _await_stored(self, send: Callable[[StoredCallback], None]) -> Deferred[int]:
        d: Deferred[int] = Deferred()
        send(_settle_stored(d))
        self._reschedule()  # a commit has a deadline
        return d

    def _sent(self) -> None:
        pass  # the timer is already set for the next ping

    def _keep_gap(self, gap: Gap) -> None:
        self._gaps.put(gap)

    # Driving the core

    def _watch(self, monitor: zmq.Socket[bytes]) -> None:
        """Read the current DEALER's monitor from now on; its connection is not up yet."""
        self._monitor = ZmqSocket(self._reactor, monitor, self._monitored)
        self._monitor.startReading()
        self._linked = not self._several

    def _unwatch(self) -> None:
        """Stop the current DEALER's monitor (before the DEALER closes)."""
        if self._monitor is not None:
            unwatch(self._socket.socket)
            self._monitor.close()
            self._monitor = None

    def _refused_instead(self, error: ClientError) -> ClientError:
        """
        What connect() fails with for C{error}: at the timeout, the refusal
        the handshakes make (a broker that broke them off), if any.
        """
        if isinstance(error, BrokerUnreachableError) and not isinstance(
            error, AuthenticationRefusedError
        ):
            refusal = self._handshakes.refusal()
            if refusal is not None:
                options = self._core.options
                return refusal_error(refusal, self._core.endpoint, options.plain, options.curve)
        return error

    def _monitored(self, batch: Batch) -> None:
        monitor = self._monitor
        for frames in batch:
            if self._monitor is not monitor:
                break  # the client moved to another endpoint: the rest is the old one's
            change = self._handshakes.heard(link_change(frames))
            if isinstance(change, Refusal):
                options = self._core.options
                error = refusal_error(change, self._core.endpoint, options.plain, options.curve)
                self._core.connection_refused(error)
            elif change is LinkChange.MADE:
                self._linked = True
                self._core.connection_made()
            elif change is LinkChange.LOST:
                self._linked = not self._several
                socket = self._socket
                socket.doRead()  # first what the broker said before it went
                if self._socket is socket:
                    self._core.connection_lost()
        self._reschedule()

    def _received(self, batch: Batch) -> None:
        receive = self._core.receive
        socket = self._socket
        for frames in batch:
            if self._socket is not socket:
                break  # the client moved to another endpoint: the rest is from the old one
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
        self._unwatch()
        self._socket.close()
        for queue in (self._deliveries, self._confirmations, self._gaps):
            waiting: list[Deferred[object]] = queue.waiting  # type: ignore[assignment]
            while waiting:
                waiting.pop(0).errback(ClientClosedError("the client was closed"))


def _settle_stored(d: Deferred[int]) -> StoredCallback:
    """A core STORED callback that fires C{d}."""

    def stored(result: int | ClientError) -> None:
        if isinstance(result, ClientError):
            d.errback(result)
        else:
            d.callback(result)

    return stored


def _settle(d: Deferred[None]) -> Done:
    """A core completion callback that fires C{d}."""

    def done(error: ClientError | None) -> None:
        if error is None:
            d.callback(None)
        else:
            d.errback(error)

    return done
