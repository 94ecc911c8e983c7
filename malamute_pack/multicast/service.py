"""
A broker's multicast bridges as one service: for each ``--bridge-out`` a
PUB socket and a L{Publisher} fed by the broker's stream (through an
L{OutboundSession}) or, with a source, by another broker's over TCP
(L{malamute_pack.multicast.proxy}); for each ``--bridge-in`` a SUB socket
feeding an L{InboundBridge} that repairs over TCP (L{TcpRepairs}).

While the broker's read gate is closed (its journal is behind) the inbound
bridges shed what arrives and repair it once the gate opens. L{status} says
what each bridge has done; it is logged when the service stops.

Tests: ``tests/unit/test_multicast_service.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import zmq
from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.client.options import ClientOptions
from malamute_pack.multicast.config import BridgeSettings
from malamute_pack.multicast.inbound import InboundBridge, Marks
from malamute_pack.multicast.proxy import ProxySource
from malamute_pack.multicast.publisher import BEAT_INTERVAL, Publisher
from malamute_pack.multicast.repair import TcpRepairs
from malamute_pack.multicast.sessions import OutboundSession
from malamute_pack.multicast.sockets import bound_url, open_publisher, open_subscriber, pack_bytes
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket

_log = Logger()

# A SUB's messages are packs of records (up to 8 KiB each): a reactor turn
# takes at most some 2,000 records of 100 bytes, as many as a turn of
# ZmqSocket's default batches of single records did.
PACKS_PER_BATCH = 16
BATCHES_PER_TURN = 2


def _ignore(batch: Batch) -> None:
    """A PUB receives nothing."""


class BridgeService(Service):
    """
    Every bridge of one process, from start to stop.

    @ivar publishers: the outbound bridges' publishers, while running, with
        the URL each publishes on (for a bound one, the endpoint it bound).
    @ivar inbound: the inbound bridges, while running.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]],
        settings: BridgeSettings,
        broker: Broker | None,
        origin: str,
        marks: Callable[[], Marks] = dict,
        client_options: ClientOptions | None = None,
    ) -> None:
        """
        @param broker: the broker whose streams are bridged (None for a
            proxy with no broker of its own: outbound bridges only).
        @param origin: the name records published from the broker's own
            streams go by (its identity); a proxy's come from its settings.
        @param marks: the journal's origin marks, read once at start.
        @param client_options: how repairs and the proxy connect to brokers.
        """
        assert broker is not None or not settings.inbound
        assert broker is not None or settings.source
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._context = context
        self.settings = settings
        self._broker = broker
        self._origin = origin
        self._marks = marks
        self._options = client_options or ClientOptions()
        self._sockets: list[ZmqSocket] = []
        self._sessions: list[OutboundSession] = []
        self._proxy: ProxySource | None = None
        self._repairs: TcpRepairs | None = None
        self.publishers: list[tuple[str, Publisher]] = []
        self.inbound: list[InboundBridge] = []
        self._paused = False
        self._beats = LoopingCall(self._tick)
        self._beats.clock = self._clock

    def _tick(self) -> None:
        for _, publisher in self.publishers:
            publisher.tick()

    def startService(self) -> None:
        settings = self.settings
        origin = settings.origin or settings.source or self._origin
        for out in settings.outbound:
            raw = open_publisher(self._context, out.url, settings)
            url = bound_url(raw, out.url)
            socket = ZmqSocket(self._reactor, raw, _ignore)
            self._sockets.append(socket)
            publisher = Publisher(
                self._clock,
                socket.send,
                origin,
                settings.endpoint,
                out.stream,
                out.pattern,
                pack_bytes(out.url),
            )
            self.publishers.append((url, publisher))
            _log.info(
                "multicast bridge: stream {stream!r} ({pattern}) published on {url}",
                stream=out.stream,
                pattern=out.pattern,
                url=url,
            )
        if self.publishers:
            self._beats.start(BEAT_INTERVAL, now=False)
        if settings.source:
            self._proxy = ProxySource(
                self._reactor,
                self._context,
                settings.source,
                [p for _, p in self.publishers],
                self._options,
            )
            self._proxy.start()
        elif self.publishers:
            assert self._broker is not None
            for _, publisher in self.publishers:
                session = OutboundSession(publisher)
                session.attach(self._broker)
                self._sessions.append(session)
        if settings.inbound:
            assert self._broker is not None
            marks = self._marks()
            repairs = self._repairs = TcpRepairs(self._reactor, self._context, self._options)
            for into in settings.inbound:
                bridge = InboundBridge(
                    self._clock, self._broker, into.stream, into.url, marks, repairs
                )
                socket = ZmqSocket(
                    self._reactor,
                    open_subscriber(self._context, into.url, settings),
                    bridge.received,
                    batchSize=PACKS_PER_BATCH,
                    batchesPerTurn=BATCHES_PER_TURN,
                )
                self.inbound.append(bridge)
                self._sockets.append(socket)
                if self._paused:
                    bridge.pause()
                socket.startReading()
                _log.info(
                    "multicast bridge: {url} received into stream {stream!r}",
                    url=into.url,
                    stream=into.stream,
                )
        super().startService()

    def stopService(self) -> Deferred[None] | None:
        """
        Stop every bridge; fires once the proxy's connection and the
        repairs' clients are closed.
        """
        super().stopService()
        if self._beats.running:
            self._beats.stop()
        if self.publishers or self.inbound:
            _log.info("multicast bridge status: {status}", status=json.dumps(self.status()))
        stopping: list[Deferred[None]] = []
        if self._proxy is not None:
            stopping.append(self._proxy.stop())
            self._proxy = None
        if self._broker is not None:
            for session in self._sessions:
                self._broker.detach_remote(session)
        for _, publisher in self.publishers:
            publisher.close()
        for bridge in self.inbound:
            bridge.close()
        for socket in self._sockets:
            socket.close()
        if self._repairs is not None:
            stopping.append(self._repairs.closed())
            self._repairs = None
        self._sessions, self._sockets = [], []
        self.publishers, self.inbound = [], []
        if not stopping:
            return None
        return DeferredList(stopping, consumeErrors=True).addCallback(lambda _: None)

    # Pausable (the broker's read gate). A PGM socket left unread aborts the
    # process when its queue fills (sockets.py): the inbound bridges shed
    # what arrives instead, and repair it once the gate opens.

    def pauseReading(self) -> None:
        self._paused = True
        for bridge in self.inbound:
            bridge.pause()

    def resumeReading(self) -> None:
        self._paused = False
        for bridge in self.inbound:
            bridge.resume()

    def status(self) -> dict[str, Any]:
        """What every bridge has done, for the logs and the management API."""
        return {
            "outbound": [
                {
                    "url": url,
                    "stream": publisher.stream,
                    "pattern": publisher.pattern,
                    "last": publisher.prev,
                    **vars(publisher.counters),
                }
                for url, publisher in self.publishers
            ],
            "inbound": [
                {
                    "url": bridge.url,
                    "stream": bridge.stream,
                    "flows": {flow.key: flow.mark for flow in bridge.flows.values()},
                    **vars(bridge.counters),
                }
                for bridge in self.inbound
            ],
        }
