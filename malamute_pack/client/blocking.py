"""
The Malamute client for scripts: plain pyzmq and C{zmq.Poller}, no reactor
and no threads. Every call blocks until it is done, and heartbeats are
handled while a call blocks (in C{recv} or waiting for OK), by the same
L{ClientCore} the Twisted client uses.

    with BlockingClient("ipc://@/malamute", "me", timeout=2.0) as client:
        client.set_consumer("weather", r"^temp\\.")
        delivery = client.recv(timeout=1.0)

A script that does not call the client for longer than the broker's
timeout is expired by the broker; its next call meets ERROR 500, and the
client opens again and replays its settings.

The endpoint may be several (a list, or separated by commas: a
primary/backup pair); the client fails over between them as the Twisted
client does (L{malamute_pack.client.reactor_client}): C{endpoint} is the
one it is on, C{switches} counts the moves. The monitor of its DEALER is
polled with it: a broken connection moves the client on at once, and a
send finds no connection at once instead of blocking. With one endpoint
or several, the monitor tells too when the broker refuses the
credentials: the constructor raises L{AuthenticationRefusedError} then,
not after its timeout; for a client whose handshakes the broker keeps
breaking off (a CURVE client's key for the broker is wrong; another's
refusal lost to the broker's reset), L{WrongServerKeyError} or
L{AuthenticationRefusedError} as soon as two did, or at the timeout after
one.

Options (L{ClientOptions}) are given as C{options=} and/or as keyword
overrides, as for the Twisted client. The client speaks protocol version 2
by default (``version=1`` for the C broker; see
L{malamute_pack.client.core}). With version 2, C{sendto} and
C{sendfor} wait for the broker's STORED and return the message's id (raising
L{MalamuteError} if it refused the message, or L{BrokerUnreachableError} if
the connection is lost first: the message is then still sent when the broker
is back, so whether it was stored is not known); C{recv} answers mailbox and
service deliveries with DONE as it returns them (unless C{auto_done=False}:
then call C{done(delivery)}); STREAM_GAPs go to C{on_gap}.

Tests: ``tests/system/test_client_blocking.py``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar, Unpack

import zmq
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
    wait_writable,
)
from malamute_pack.client.options import ClientOptions, OptionOverrides, resolve_options
from malamute_pack.client.outbox import StoredCallback

_log = Logger()

_T = TypeVar("_T")

# Messages read from the socket in one go before timers get a look in.
_DRAIN = 1000


class _MonotonicClock:
    def seconds(self) -> float:
        return time.monotonic()


class BlockingClient(ClientFacade[None, int]):
    """
    A connection to a Malamute broker for code without a reactor.

    The constructor connects and blocks until OK (raising L{MalamuteError}
    on ERROR, L{BrokerUnreachableError} after C{timeout} seconds, and
    L{AuthenticationRefusedError} as soon as the broker refuses the
    credentials or requires some that were not given).

    @ivar on_gap: if set, called with each L{Gap} (version 2) as it arrives
        (inside whichever call is waiting for input); C{gaps} counts them.
    @ivar dropped_sends: messages dropped because the socket's send queue
        stayed full for the timeout.
    """

    def __init__(
        self,
        endpoint: EndpointSpec,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        on_gap: Callable[[Gap], object] | None = None,
        **overrides: Unpack[OptionOverrides],
    ) -> None:
        """
        Connect to the broker at C{endpoint} as C{address} ("" = anonymous).

        @param endpoint: one endpoint, or several (a list, or separated by
            commas): they are tried in order, and the client fails over
            between them.
        @param options: the L{ClientOptions} (the defaults if None);
            C{address} and the keyword C{overrides} replace their fields.
        @param context: the ZeroMQ context (the global one if None).
        @raise ValueError: for options that are not valid.
        @raise BadEndpointError: if ZeroMQ refuses an endpoint.
        """
        resolved = resolve_options(options, address, overrides)
        endpoints = parse_endpoints(endpoint)
        self._context = context or zmq.Context.instance()
        check_endpoints(self._context, endpoints[1:])
        self._clock = _MonotonicClock()
        self._core = ClientCore(self._clock, self, resolved, endpoints)
        self.on_gap = on_gap
        self._poller = zmq.Poller()
        # The monitor of the DEALER (with several endpoints, whether its
        # connection is up; with any, whether the broker refused us), and
        # what the monitor said that the core has not heard yet.
        self._several = len(endpoints) > 1
        self._monitor: zmq.Socket[bytes] | None = None
        self._linked = True
        self._changes: deque[LinkChange | Refusal] = deque()
        self._handshakes = Handshakes()
        self._socket = self._dealer(endpoints[0])
        self._deliveries: deque[Delivery] = deque()
        self._confirmations: deque[Confirmation] = deque()
        self.dropped_sends = 0
        self._due = 0.0  # when the core next wants its timers run
        try:
            self._run_command(self._core.connect)
        except BaseException as e:
            refused = self._refused_instead(e)
            self._close_sockets()
            if refused is not e:
                raise refused from None
            raise

    def close(self) -> None:
        """Say CONNECTION_CLOSE, wait briefly for OK, close the socket."""
        if self._socket.closed:
            return
        try:
            self._run_command(self._core.close)
        finally:
            self._close_sockets()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _dealer(self, endpoint: str) -> zmq.Socket[bytes]:
        """
        A DEALER connected to C{endpoint}, polled from now on, and its
        monitor too.
        """
        options = self._core.options
        socket, monitor = make_watched_dealer(
            self._context, endpoint, options.plain, options.curve, immediate=self._several
        )
        self._poller.register(monitor, zmq.POLLIN)
        self._monitor = monitor
        self._linked = not self._several
        # A full send queue blocks a script for at most the timeout, then drops.
        socket.setsockopt(zmq.SNDTIMEO, int(options.timeout * 1000))
        self._poller.register(socket, zmq.POLLIN)
        return socket

    def _close_sockets(self) -> None:
        """Close the DEALER (and its monitor): what the monitor said is forgotten."""
        socket, monitor = self._socket, self._monitor
        if monitor is not None:
            unwatch(socket)
            self._poller.unregister(monitor)
            monitor.close(linger=0)
            self._monitor = None
        if not socket.closed:
            self._poller.unregister(socket)
            socket.close(linger=0)
        self._changes.clear()

    # Receiving

    def recv(self, timeout: float | None = None) -> Delivery | None:
        """
        The next delivery, or None if none came within C{timeout} seconds.
        With C{auto_done}, a mailbox or service record is answered with DONE
        as it is returned.
        """
        delivery = self._next(self._deliveries, timeout)
        return None if delivery is None else self._hand_over(delivery)

    def recv_confirm(self, timeout: float | None = None) -> Confirmation | None:
        """The next forwarded CONFIRM, or None if none came within C{timeout} seconds."""
        return self._next(self._confirmations, timeout)

    def pause(self, seconds: float) -> None:
        """
        Wait C{seconds} while keeping the connection alive (a C{time.sleep}
        that answers heartbeats); deliveries that arrive wait for L{recv}.
        """
        until = self._clock.seconds() + seconds
        while self._clock.seconds() < until and self._core.state is not ClientState.CLOSED:
            self._turn(until)

    def _next(self, queue: deque[_T], timeout: float | None) -> _T | None:
        until = None if timeout is None else self._clock.seconds() + timeout
        while not queue:
            if self._core.state is ClientState.CLOSED:
                raise ClientClosedError("the client is closed")
            if until is not None and self._clock.seconds() >= until:
                return None
            self._turn(until)
        return queue.popleft()

    # CoreOwner

    def send_frames(self, frames: list[bytes]) -> None:
        if not self._several or self._monitor is None:
            try:
                self._socket.send_multipart(frames)
            except zmq.Again:
                self._dropped()
            return
        # Several endpoints: the DEALER queues only on a connection that is
        # up; without room, wait for some (the timeout at most), but not once
        # the monitor says there is no connection. Then nothing waits for
        # one: it was a ping, or what goes again on reopening.
        monitor = self._monitor
        until = self._clock.seconds() + self._core.options.timeout
        while not self.try_send(frames):
            self._read_monitor()
            if not self._linked:
                return
            if self._clock.seconds() >= until:
                self._dropped()
                return
            wait_writable(self._socket, monitor, until)

    def _dropped(self) -> None:
        self.dropped_sends += 1
        _log.warn("message dropped: the send queue stayed full ({n} so far)", n=self.dropped_sends)

    def try_send(self, frames: list[bytes]) -> bool:
        try:
            self._socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def connect_to(self, endpoint: str) -> None:
        self._close_sockets()
        self._socket = self._dealer(endpoint)

    def delivered(self, delivery: Delivery) -> None:
        self._deliveries.append(delivery)

    def withdraw(self, stale: Callable[[Delivery], bool]) -> list[Delivery]:
        kept, dropped = partition(self._deliveries, stale)
        if dropped:
            self._deliveries.clear()
            self._deliveries.extend(kept)
        return dropped

    def confirmed(self, confirmation: Confirmation) -> None:
        self._confirmations.append(confirmation)

    # The I/O for the facade

    @property
    def _socket_dropped(self) -> int:
        return self.dropped_sends

    def _run_command(self, start: Callable[[Done], None]) -> None:
        """Start a command and turn the loop until it is done; raise its error."""
        result: list[ClientError | None] = []
        start(result.append)
        while not result:
            self._turn(None)
        if result[0] is not None:
            raise result[0]

    def _await_stored(self, send: Callable[[StoredCallback], None]) -> int:
        """Send a message that gets STORED; turn the loop until it comes."""
        result: list[int | ClientError] = []
        send(result.append)
        # With several brokers, a round of them that failed (a pair's passive
        # still refusing while it waits out its partner) is gone round again
        # after a back-off: give that the client's timeout before giving up.
        patience = self._core.options.timeout if len(self.endpoints) > 1 else 0.0
        deadline = self._clock.seconds() + patience
        while not result:
            disconnected = self._core.state is ClientState.DISCONNECTED
            if disconnected and self._clock.seconds() >= deadline:
                raise BrokerUnreachableError(
                    f"nothing heard from the broker for {self._core.options.timeout}s; the "
                    "message is held and will be sent when it answers"
                )
            self._turn(deadline if disconnected else None)
        if isinstance(result[0], ClientError):
            raise result[0]
        return result[0]

    def _sent(self) -> None:
        self._tick()

    def _keep_gap(self, gap: Gap) -> None:
        pass  # counted in C{gaps}; only C{on_gap} sees them

    # Driving the core

    def _turn(self, until: float | None) -> None:
        """Wait for input until C{until} or the core's next timer; handle both."""
        now = self._clock.seconds()
        wakeup = self._core.wakeup_at()
        ends = [t for t in (until, wakeup) if t is not None]
        wait_ms = None if not ends else max(0, math.ceil((min(ends) - now) * 1000))
        ready = dict(self._poller.poll(0 if self._changes else wait_ms))
        socket = self._socket
        if socket in ready:
            receive = self._core.receive
            recv = socket.recv_multipart
            try:
                for _ in range(_DRAIN):
                    receive(recv(zmq.NOBLOCK))
                    if self._socket is not socket:
                        break  # moved to another endpoint: the old socket is closed
            except zmq.Again:
                pass
        # After the messages: those the broker sent before it went come first.
        if self._socket is socket and self._monitor is not None:
            if self._monitor in ready:
                self._read_monitor()
            self._tell_changes()
        if wakeup is not None and self._clock.seconds() >= wakeup:
            self._core.on_time()
        wakeup = self._core.wakeup_at()
        self._due = math.inf if wakeup is None else wakeup

    def _refused_instead(self, error: BaseException) -> BaseException:
        """
        What the constructor raises for C{error}: at the timeout, the
        refusal the handshakes make (a broker that broke them off), if
        any.
        """
        if not isinstance(error, BrokerUnreachableError) or isinstance(
            error, AuthenticationRefusedError
        ):
            return error
        if self._monitor is not None:
            self._read_monitor()  # what it said since the last turn counts too
        refusal = self._handshakes.refusal()
        if refusal is None:
            return error
        options = self._core.options
        return refusal_error(refusal, self._core.endpoint, options.plain, options.curve)

    def _read_monitor(self) -> None:
        """Take what the monitor says (the core hears it on the next turn)."""
        monitor = self._monitor
        assert monitor is not None
        try:
            while True:
                change = self._handshakes.heard(link_change(monitor.recv_multipart(zmq.NOBLOCK)))
                if change is not None:
                    self._changes.append(change)
                    if self._several:
                        self._linked = change is LinkChange.MADE
        except zmq.Again:
            pass

    def _tell_changes(self) -> None:
        """Tell the core what the monitor said (a move to another endpoint drops the rest)."""
        while self._changes:
            change = self._changes.popleft()
            if isinstance(change, Refusal):
                options = self._core.options
                error = refusal_error(change, self._core.endpoint, options.plain, options.curve)
                self._core.connection_refused(error)
            elif change is LinkChange.MADE:
                self._core.connection_made()
            else:
                self._core.connection_lost()

    def _tick(self) -> None:
        """
        Between sends: run the heartbeat when it is due, and tell the core
        what a send learnt from the monitor (the connection broke: sends
        are held from now on), without waiting.
        """
        if self._changes or self._clock.seconds() >= self._due:
            self._turn(self._clock.seconds())
