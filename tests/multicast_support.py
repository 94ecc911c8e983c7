"""
Support for the multicast bridges' tests over real sockets (no multicast:
tcp on loopback, ipc, inproc): waiting on the real reactor, a PUB and a
SUB made as the bridges make them, and brokers run in this process.

Tests: used by ``tests/unit/test_multicast_outbound.py``,
``tests/system/test_multicast_proxy.py`` and ``tests/unit/test_multicast_service.py``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import zmq
from twisted.application.service import MultiService
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from malamute_pack.multicast import sockets
from malamute_pack.multicast.config import BridgeSettings
from malamute_pack.protocol import multicast
from malamute_pack.protocol.multicast import Header
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket
from tests.support import wait_for

the_reactor = cast(IReactorFDSet, reactor)
clock = cast(IReactorTime, reactor)

# A message the bridges' SUBs never take (it is not a bridge message): sent
# until one arrives, it shows a SUB's subscription has reached the PUB.
PROBE = b"probe"


async def settle(seconds: float = 0.05) -> None:
    """Let the reactor run for C{seconds} (before checking that nothing more came)."""
    await deferLater(clock, seconds)


class Wire:
    """
    A PUB bound to a URL (L{sockets.open_publisher}) and a SUB connected to
    it (L{sockets.open_subscriber}), both in the reactor; what the SUB gets
    is kept in C{received}, a message per record (the records of a pack
    each as a pack of one). Closed when the test ends.
    """

    def __init__(self, case: TestCase, context: zmq.Context[zmq.Socket[bytes]], url: str) -> None:
        raw = sockets.open_publisher(context, url, BridgeSettings())
        self.pub = ZmqSocket(the_reactor, raw, self._nothing)
        case.addCleanup(self.pub.close)
        self.endpoint = sockets.bound_url(raw, url)
        sub = sockets.open_subscriber(context, self.endpoint, BridgeSettings())
        sub.setsockopt(zmq.SUBSCRIBE, PROBE)
        self.sub = ZmqSocket(the_reactor, sub, self._receive)
        case.addCleanup(self.sub.close)
        self.sub.startReading()
        self.received: list[list[bytes]] = []
        self.probes = 0

    def _nothing(self, batch: Batch) -> None:
        """A PUB receives nothing."""

    def _receive(self, batch: Batch) -> None:
        for frames in batch:
            if frames[0] == PROBE:
                self.probes += 1
                continue
            for header, content in multicast.decode_pack(frames).headers():
                self.received.append(multicast.encode(header, content))

    async def subscribed(self) -> None:
        """
        Wait until the SUB's subscription has reached the PUB: until then a
        PUB drops what it sends.
        """

        def probed() -> bool:
            self.pub.send([PROBE])
            return self.probes > 0

        await wait_for(probed)

    def records(self) -> list[tuple[Header, list[bytes]]]:
        """What the SUB received, decoded."""
        return [multicast.decode(frames) for frames in self.received]

    def numbers(self) -> list[tuple[int, int]]:
        """The (seq, prev) of every record received."""
        return [(header.seq, header.prev) for header, _ in self.records()]


class InProcessBroker:
    """
    A broker service (C{twistd malamute}'s) in this process, on a data
    directory, restartable on the same endpoint; stopped when the test ends.
    """

    def __init__(
        self,
        case: TestCase,
        context: zmq.Context[zmq.Socket[bytes]],
        data_dir: Path,
        endpoint: str = "tcp://127.0.0.1:*",
        bridge: BridgeSettings | None = None,
    ) -> None:
        self._context = context
        self.data_dir = data_dir
        self.endpoint = endpoint
        self.bridge = bridge or BridgeSettings()
        self.service: MultiService | None = None
        case.addCleanup(self.stop)

    def start(self) -> str:
        """Start it; the endpoint it bound (the first time, a C{*} port resolved)."""
        settings = Settings(
            endpoints=(self.endpoint,), data_dir=self.data_dir, timeout_ms=3000, bridge=self.bridge
        )
        self.service = makeBrokerService(settings, the_reactor, self._context)
        self.service.startService()
        router = self.service.getServiceNamed("router")
        assert isinstance(router, RouterService)
        self.endpoint = router.bound[0]
        return self.endpoint

    async def stop(self) -> None:
        """Stop it and wait until its journal is closed."""
        service, self.service = self.service, None
        if service is not None and service.running:
            await service.stopService()

    async def restart(self) -> None:
        """Stop it and start it again on the same endpoint and data directory."""
        await self.stop()
        end = time.monotonic() + 5
        while True:
            try:
                self.start()
                return
            except zmq.ZMQError as e:
                # libzmq's I/O thread closes the old listener a moment later.
                if e.errno != zmq.EADDRINUSE or time.monotonic() > end:
                    raise
                await self.stop()
                await settle(0.05)
