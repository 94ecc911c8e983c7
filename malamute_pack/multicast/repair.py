"""
Repairs over TCP: what an inbound bridge lost, read from the origin
broker's journal as an ordinary MLM reader (protocol version 2, from a
sequence number), with the origin bridge's pattern, by a
L{MalamuteClient} per flow that lives as long as the repair.

The origin sends with credit: at most L{WINDOW} records ahead of what is
written here, and none more while this broker's journal is behind (its
read gate closed: the bridge sheds), so a long repair cannot outrun the
disk. A repair that makes no progress for C{stall} seconds (the origin is
unreachable, or silent) fails: the bridge reports what is still missing
as lost rather than hold the stream back for ever.

Tests: ``tests/unit/test_multicast_inbound.py`` (against a broker on real sockets).
"""

from __future__ import annotations

import zmq
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IDelayedCall, IReactorFDSet, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.client.errors import ClientError
from malamute_pack.client.events import Delivery, Gap
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.multicast.inbound import Flow, InboundBridge
from malamute_pack.protocol import mlm

_log = Logger()

# Seconds a repair may go without a record before it fails.
DEFAULT_STALL = 5.0
# Records the origin may send ahead of what is written (credit), and how
# often a repair held back by this broker's journal looks again.
WINDOW = 2_000
POLL = 0.1


class _Repair:
    """One flow's repair: its client (once connected) and its watchdog."""

    def __init__(self, flow: Flow, bridge: InboundBridge) -> None:
        self.flow = flow
        self.bridge = bridge
        self.client: MalamuteClient | None = None
        self.connecting: Deferred[MalamuteClient] | None = None  # until it connects
        self.watchdog: IDelayedCall | None = None
        self.poll: IDelayedCall | None = None
        self.taken = 0  # records written since credit was last granted
        self.stopped = False


class TcpRepairs:
    """
    L{Repairs} by reading the origin's stream over ZeroMQ.

    @ivar started: repairs started.
    """

    def __init__(
        self,
        reactor: IReactorFDSet,
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        options: ClientOptions | None = None,
        stall: float = DEFAULT_STALL,
    ) -> None:
        self._reactor = reactor
        self._clock: IReactorTime = reactor  # type: ignore[assignment]
        self._context = context
        self._options = options or ClientOptions()
        self._stall = stall
        self._repairs: dict[Flow, _Repair] = {}
        # Clients of stopped repairs still closing (waiting for the origin's OK).
        self._closing: set[Deferred[None]] = set()
        self.started = 0

    def start(self, flow: Flow, bridge: InboundBridge) -> None:
        if not flow.endpoint:
            bridge.failed(flow, "the origin names no endpoint to repair from")
            return
        repair = self._repairs[flow] = _Repair(flow, bridge)
        self.started += 1
        self._arm(repair)
        repair.connecting = MalamuteClient.connect(
            self._reactor,
            flow.endpoint,
            options=self._options,
            version=2,
            context=self._context,
            on_delivery=lambda delivery: self._delivered(repair, delivery),
            on_gap=lambda gap: self._gap(repair, gap),
        )
        repair.connecting.addCallbacks(
            self._connected, self._failed, callbackArgs=(repair,), errbackArgs=(repair,)
        )

    def stop(self, flow: Flow) -> None:
        repair = self._repairs.pop(flow, None)
        if repair is None:
            return
        repair.stopped = True
        for call in (repair.watchdog, repair.poll):
            if call is not None and call.active():
                call.cancel()
        if repair.client is not None:
            self._close(repair.client)
        elif repair.connecting is not None:
            repair.connecting.cancel()  # a client still connecting leaves now

    def closed(self) -> Deferred[None]:
        """Fires once every client of a stopped repair has closed (for a clean stop)."""
        closing = list(self._closing)
        return DeferredList(closing, consumeErrors=True).addCallback(lambda _: None)

    def _close(self, client: MalamuteClient) -> None:
        closing = client.close()
        self._closing.add(closing)
        closing.addErrback(lambda failure: None)
        closing.addBoth(lambda _: self._closing.discard(closing))

    def _connected(self, client: MalamuteClient, repair: _Repair) -> None:
        repair.connecting = None
        if repair.stopped:
            self._close(client)
            return
        repair.client = client
        flow = repair.flow
        client.credit(WINDOW)
        client.set_consumer(flow.stream, flow.pattern, mlm.SEQUENCE, flow.mark + 1).addErrback(
            self._failed, repair
        )

    def _failed(self, failure: Failure, repair: _Repair) -> None:
        if repair.stopped:
            return
        reason = failure.getErrorMessage()
        if not failure.check(ClientError):  # type: ignore[no-untyped-call]
            _log.failure("repair of {key}", failure, key=repair.flow.key)
        repair.bridge.failed(repair.flow, f"{repair.flow.endpoint}: {reason}")

    def _delivered(self, repair: _Repair, delivery: Delivery) -> None:
        if repair.stopped or delivery.sequence is None:
            return
        self._arm(repair)
        repair.bridge.repaired(
            repair.flow,
            delivery.sequence,
            delivery.timestamp or self._clock.seconds(),
            delivery.sender,
            delivery.subject,
            delivery.content,
        )
        repair.taken += 1
        if repair.taken >= WINDOW // 2 and repair.poll is None:
            self._grant(repair)

    def _grant(self, repair: _Repair) -> None:
        """
        Let the origin send as much again as was written, unless this
        broker's journal is behind (its bridge sheds): then look again soon.
        """
        repair.poll = None
        if repair.stopped or repair.client is None or not repair.taken:
            return
        if repair.bridge.shedding:
            self._arm(repair)  # waiting on this broker is no silence of the origin
            repair.poll = self._clock.callLater(POLL, self._grant, repair)
            return
        try:
            repair.client.credit(repair.taken)
        except ClientError:
            return  # closing
        repair.taken = 0

    def _gap(self, repair: _Repair, gap: Gap) -> None:
        if not repair.stopped:
            self._arm(repair)
            repair.bridge.lost(repair.flow, gap.missed, gap.available)

    def _arm(self, repair: _Repair) -> None:
        """(Re)start the watchdog: the repair fails after C{stall} seconds of nothing."""
        if repair.watchdog is not None and repair.watchdog.active():
            repair.watchdog.reset(self._stall)
            return

        def stalled() -> None:
            if not repair.stopped:
                repair.bridge.failed(
                    repair.flow,
                    f"{repair.flow.endpoint} sent nothing for {self._stall:g}s",
                )

        repair.watchdog = self._clock.callLater(self._stall, stalled)
