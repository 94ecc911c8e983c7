"""
Tests for L{malamute_pack.pack.service}: two brokers' pack services in one
process, finding each other through gossip on loopback and forwarding a
stream record over real sockets; a service given an identity (a pair's)
joins with it.
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.pack.service import PackService
from malamute_pack.protocol import mlm
from malamute_pack.settings import PackSettings
from tests.memory_session import InMemorySession


class TwoBrokersTests(TestCase):
    timeout = 20

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def broker(
        self, settings: PackSettings, identity: bytes | None = None
    ) -> tuple[Broker, PackService]:
        broker = Broker(reactor, BrokerConfig())
        base = Path(self.mktemp())
        base.mkdir(parents=True)
        service = PackService(
            reactor,
            self.context,
            broker,
            None,
            settings,
            base,
            identity=None if identity is None else (lambda: identity),
        )
        service.startService()
        self.addCleanup(service.stopService)
        return broker, service

    async def until(self, check: object, what: str) -> None:
        for _ in range(150):
            if callable(check) and check():
                return
            await deferLater(reactor, 0.05, lambda: None)
        self.fail(f"never: {what}")

    def test_gossipPackForwardsAStream(self) -> None:
        """
        Two brokers of a gossip-only pack on loopback federate, and a record
        written on one reaches a reader on the other.
        """

        async def run() -> None:
            a, service_a = self.broker(
                PackSettings(
                    name="t",
                    gossip_bind=("tcp://127.0.0.1:*",),
                    peer_endpoint="tcp://127.0.0.1:*",
                    broker_name="a",
                ),
            )
            assert service_a.zyre is not None and service_a.zyre.gossip is not None
            gossip = service_a.zyre.gossip.bound[0]
            b, service_b = self.broker(
                PackSettings(
                    name="t",
                    gossip_connect=(gossip,),
                    peer_endpoint="tcp://127.0.0.1:*",
                    broker_name="b",
                ),
            )
            pack_a, pack_b = service_a.pack, service_b.pack
            assert pack_a is not None and pack_b is not None
            await self.until(lambda: pack_a.peers and pack_b.peers, "the two federate")
            reader = InMemorySession("reader")
            b.receive(reader, mlm.ConnectionOpen(address="reader"))
            b.receive(reader, mlm.StreamRead("s", ""))
            # B's interest reaches A.
            await self.until(lambda: "s" in a.streams.streams, "A hears B's interest")
            writer = InMemorySession("writer")
            a.receive(writer, mlm.ConnectionOpen(address="writer"))
            a.receive(writer, mlm.StreamWrite("s"))
            a.receive(writer, mlm.StreamSend("hello", [b"x"]))
            await self.until(lambda: reader.records, "the record reaches B's reader")
            self.assertEqual([(r.subject, r.sender) for r in reader.records], [("hello", "writer")])

        d: Deferred[None] = Deferred.fromCoroutine(run())
        return d  # type: ignore[return-value]

    def test_givenIdentityJoinsWithIt(self) -> None:
        """
        A pack service given an identity (a pair's, shared by its two
        brokers) joins with it instead of its data directory's: its peer
        knows it by that id, the origin of what it forwards.
        """

        async def run() -> None:
            shared = bytes(range(16))
            _, service_a = self.broker(
                PackSettings(
                    name="t", gossip_bind=("tcp://127.0.0.1:*",), peer_endpoint="tcp://127.0.0.1:*"
                ),
                identity=shared,
            )
            assert service_a.zyre is not None and service_a.zyre.gossip is not None
            gossip = service_a.zyre.gossip.bound[0]
            _, service_b = self.broker(
                PackSettings(name="t", gossip_connect=(gossip,), peer_endpoint="tcp://127.0.0.1:*"),
            )
            pack_a, pack_b = service_a.pack, service_b.pack
            assert pack_a is not None and pack_b is not None
            self.assertEqual(pack_a.broker_id, shared.hex().upper())
            await self.until(lambda: pack_b.by_origin, "the two federate")
            self.assertEqual(list(pack_b.by_origin), [shared.hex().upper()])

        d: Deferred[None] = Deferred.fromCoroutine(run())
        return d  # type: ignore[return-value]
