"""
Support for end-to-end tests: a broker service on real ZeroMQ sockets in the
test's reactor, and raw DEALER peers read through the same reactor adapter
the broker uses, with Deferreds for "the next message".

Tests: used by ``tests/unit/test_end_to_end.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

import zmq
from twisted.application.service import MultiService
from twisted.internet import defer, reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFDSet, IReactorTime

from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, fresh_ipc_endpoint
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket
from tests.support import wait_for


def ipc_endpoint() -> str:
    """A fresh abstract-namespace ipc endpoint."""
    return fresh_ipc_endpoint("test")


def tcp_endpoint() -> str:
    """
    A tcp endpoint on loopback for a broker to bind: its C{*} port lets
    ZeroMQ pick a free one when binding, so no other process can take it
    in between. Connect to what the router reports it bound
    (C{router.bound}, from L{start_broker}).
    """
    return ANY_TCP_PORT


def the_reactor() -> IReactorFDSet:
    return reactor


def clock() -> IReactorTime:
    return reactor


def start_broker(
    settings: Settings, context: zmq.Context[zmq.Socket[bytes]]
) -> tuple[MultiService, RouterService]:
    """
    Start a broker service for C{settings}; return it and its router, whose
    C{bound} lists the endpoints it really bound (a C{*} port resolved).
    """
    service = makeBrokerService(settings, the_reactor(), context)
    service.startService()
    router = service.getServiceNamed("router")
    assert isinstance(router, RouterService)
    return service, router


class Peer:
    """A raw DEALER peer: sends encoded messages and awaits decoded replies."""

    def __init__(
        self,
        context: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        plain: tuple[str, str] | None = None,
        curve: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        """
        @param plain: PLAIN user and password.
        @param curve: CURVE keys (Z85): the broker's public key, then the
            peer's public and secret keys.
        """
        raw = context.socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        if plain is not None:
            raw.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
            raw.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
        if curve is not None:
            raw.setsockopt(zmq.CURVE_SERVERKEY, curve[0])
            raw.setsockopt(zmq.CURVE_PUBLICKEY, curve[1])
            raw.setsockopt(zmq.CURVE_SECRETKEY, curve[2])
        raw.connect(endpoint)
        self.socket = ZmqSocket(the_reactor(), raw, self._batch)
        self.socket.startReading()
        self._inbox: deque[mlm.Message] = deque()
        self._waiting: deque[Deferred[mlm.Message]] = deque()

    def _batch(self, batch: Batch) -> None:
        for frames in batch:
            message = mlm.decode(frames)
            if self._waiting:
                self._waiting.popleft().callback(message)
            else:
                self._inbox.append(message)

    def send(self, message: mlm.Message) -> None:
        self.socket.send(mlm.encode(message))

    def send_raw(self, frames: Sequence[bytes]) -> None:
        self.socket.send(frames)

    def next(self, timeout: float = 5.0) -> Deferred[mlm.Message]:
        """The next message from the broker; fails after C{timeout} seconds."""
        if self._inbox:
            return defer.succeed(self._inbox.popleft())
        d: Deferred[mlm.Message] = Deferred()
        self._waiting.append(d)
        d.addTimeout(timeout, clock(), onTimeoutCancel=self._timedOut)
        return d

    def _timedOut(self, result: object, timeout: float) -> object:
        raise TimeoutError(f"no message from the broker within {timeout} s")

    def pending(self) -> int:
        return len(self._inbox)

    async def command(self, message: mlm.Message) -> mlm.Message:
        self.send(message)
        return await self.next()

    async def next_subject(self) -> str:
        """The subject of the next message, which must be a delivery."""
        message = await self.next()
        assert isinstance(message, mlm.StreamDeliver | mlm.MailboxDeliver | mlm.ServiceDeliver), (
            message
        )
        return message.subject

    async def open(self, address: str = "") -> None:
        reply = await self.command(mlm.ConnectionOpen(address=address))
        assert reply == mlm.Ok(), reply

    def close(self) -> None:
        for d in list(self._waiting):
            d.cancel()
        self.socket.close()


async def settle(seconds: float = 0.05) -> None:
    """Let the reactor run for C{seconds} (for "nothing arrives" checks)."""
    d: Deferred[None] = Deferred()
    clock().callLater(seconds, d.callback, None)
    await d


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """
    Let the reactor run until C{condition()} holds.

    @raise AssertionError: it does not within C{timeout} seconds.
    """
    await wait_for(condition, timeout)
