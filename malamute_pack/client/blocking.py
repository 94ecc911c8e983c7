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

Tests: ``tests/test_client_blocking.py``.
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
from malamute_pack.client.dealer import make_dealer
from malamute_pack.client.errors import BrokerUnreachableError, ClientClosedError, ClientError
from malamute_pack.client.events import Confirmation, Delivery, Gap
from malamute_pack.client.facade import ClientFacade
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
    on ERROR, L{BrokerUnreachableError} after C{timeout} seconds).

    @ivar on_gap: if set, called with each L{Gap} (version 2) as it arrives
        (inside whichever call is waiting for input); C{gaps} counts them.
    @ivar dropped_sends: messages dropped because the socket's send queue
        stayed full for the timeout.
    """

    def __init__(
        self,
        endpoint: str,
        address: str | None = None,
        *,
        options: ClientOptions | None = None,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        on_gap: Callable[[Gap], object] | None = None,
        **overrides: Unpack[OptionOverrides],
    ) -> None:
        """
        Connect to the broker at C{endpoint} as C{address} ("" = anonymous).

        @param options: the L{ClientOptions} (the defaults if None);
            C{address} and the keyword C{overrides} replace their fields.
        @param context: the ZeroMQ context (the global one if None).
        @raise ValueError: for options that are not valid.
        """
        resolved = resolve_options(options, address, overrides)
        self._clock = _MonotonicClock()
        self._core = ClientCore(self._clock, self, resolved)
        self.on_gap = on_gap
        self._socket = make_dealer(
            context or zmq.Context.instance(), endpoint, resolved.plain, resolved.curve
        )
        # A full send queue blocks a script for at most the timeout, then drops.
        self._socket.setsockopt(zmq.SNDTIMEO, int(resolved.timeout * 1000))
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._deliveries: deque[Delivery] = deque()
        self._confirmations: deque[Confirmation] = deque()
        self.dropped_sends = 0
        self._due = 0.0  # when the core next wants its timers run
        try:
            self._run_command(self._core.connect)
        except BaseException:
            self._socket.close(linger=0)
            raise

    def close(self) -> None:
        """Say CONNECTION_CLOSE, wait briefly for OK, close the socket."""
        if self._socket.closed:
            return
        try:
            self._run_command(self._core.close)
        finally:
            self._socket.close(linger=0)

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

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
        try:
            self._socket.send_multipart(frames)
        except zmq.Again:
            self.dropped_sends += 1
            _log.warn(
                "message dropped: the send queue stayed full ({n} so far)", n=self.dropped_sends
            )

    def delivered(self, delivery: Delivery) -> None:
        self._deliveries.append(delivery)

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
        while not result:
            if self._core.state is ClientState.DISCONNECTED:
                raise BrokerUnreachableError(
                    f"nothing heard from the broker for {self._core.options.timeout}s; the "
                    "message is held and will be sent when it answers"
                )
            self._turn(None)
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
        if self._poller.poll(wait_ms):
            receive = self._core.receive
            recv = self._socket.recv_multipart
            try:
                for _ in range(_DRAIN):
                    receive(recv(zmq.NOBLOCK))
            except zmq.Again:
                pass
        if wakeup is not None and self._clock.seconds() >= wakeup:
            self._core.on_time()
        wakeup = self._core.wakeup_at()
        self._due = math.inf if wakeup is None else wakeup

    def _tick(self) -> None:
        """Between sends: run the heartbeat when it is due, without waiting."""
        if self._clock.seconds() >= self._due:
            self._turn(self._clock.seconds())
