"""
Tests for L{malamute_pack.multicast.service}: brokers with bridges, each
the service C{twistd malamute} runs (L{malamute_pack.tap}), in this
process, journaling to temporary directories, bridged over tcp on loopback
(no multicast): records written on one arrive in the other's stream. And a
bridge with no broker of its own (C{twistd malamute-bridge},
L{malamute_pack.multicast.tap}) between two brokers.
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.trial.unittest import TestCase

from malamute_pack.client.events import Delivery
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.datadir import pack_identity
from malamute_pack.multicast.config import BridgeSettings, Inbound, Outbound
from malamute_pack.multicast.publisher import Publisher
from malamute_pack.multicast.service import BridgeService
from malamute_pack.multicast.tap import makeBridgeService
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import fresh_ipc_endpoint
from tests.multicast_support import InProcessBroker, settle, the_reactor
from tests.support import wait_for

ANY = "tcp://127.0.0.1:*"


class BridgedBrokersTestCase(TestCase):
    """
    Broker A bridging its stream C{s} out on a tcp URL, broker B bridging
    that URL into its stream C{local}; a writer on A, a reader on B.
    """

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.received: list[Delivery] = []
        self.publisher: Publisher

    async def client(self, endpoint: str) -> MalamuteClient:
        client = await MalamuteClient.connect(
            the_reactor, endpoint, context=self.context, heartbeat=0.1, timeout=2.0
        )
        self.addCleanup(client.close)
        return client

    def bridges(self, broker: InProcessBroker) -> BridgeService:
        assert broker.service is not None
        bridges = broker.service.getServiceNamed("bridges")
        assert isinstance(bridges, BridgeService)
        return bridges

    async def start_a(self, outbound: BridgeSettings | None = None) -> str:
        """Start A (with C{outbound} bridges, by default C{s} on a tcp URL); its URL."""
        outbound = outbound or BridgeSettings(outbound=(Outbound("s", ".*", ANY),))
        self.a = InProcessBroker(self, self.context, Path(self.mktemp()), bridge=outbound)
        self.a_endpoint = self.a.start()
        self.writer = await self.client(self.a_endpoint)
        await self.writer.set_producer("s")
        [(url, self.publisher)] = self.bridges(self.a).publishers
        return url

    async def start_b(self, url: str) -> None:
        """Start B, bridging C{url} into its stream C{local}, and read that stream."""
        inbound = BridgeSettings(inbound=(Inbound(url, "local"),))
        self.b = InProcessBroker(self, self.context, Path(self.mktemp()), bridge=inbound)
        self.b.start()
        self.reader = await self.client(self.b.endpoint)
        self.reader.on_delivery = self.received.append
        await self.reader.set_consumer("local", ".*")

    async def joined(self) -> None:
        """
        Write probes on A (a fresh stream) until one reaches B's stream (B's
        SUB has subscribed), then wait until A's bridge (C{self.publisher})
        has published them all, B has written them all and its reader has
        them all; forget them.
        """
        written = 0

        def arrived() -> bool:
            nonlocal written
            self.writer.send("probe", [b""])
            written += 1
            return bool(self.received)

        await wait_for(arrived)
        await wait_for(lambda: self.publisher.prev == written)
        [inbound] = self.bridges(self.b).inbound
        await wait_for(lambda: [f.mark for f in inbound.flows.values()] == [written])
        await wait_for(lambda: self.received[-1].sequence == inbound.counters.written)
        self.received.clear()


class BridgeServiceTests(BridgedBrokersTestCase):
    async def test_recordsArrive(self) -> None:
        """
        Records written on A arrive in B's local stream in order, each once,
        with their sender, subject and content.
        """
        await self.start_b(await self.start_a())
        await self.joined()
        for n in range(1, 21):
            self.writer.send(f"r{n}", [b"%d" % n, b"more"])
        await wait_for(lambda: len(self.received) >= 20)
        await settle(0.05)
        self.assertEqual([d.subject for d in self.received], [f"r{n}" for n in range(1, 21)])
        self.assertEqual(
            [d.content for d in self.received], [(b"%d" % n, b"more") for n in range(1, 21)]
        )
        self.assertEqual({d.address for d in self.received}, {"local"})
        sequences = [d.sequence for d in self.received]
        self.assertEqual(sequences, sorted(set(sequences)))

    async def test_status(self) -> None:
        """
        status() says, for each outbound bridge, its URL (the endpoint it
        bound), stream, pattern, last record published and counters; for
        each inbound bridge, its URL, stream, the origin streams heard and
        how far each was written, and counters.
        """
        url = await self.start_a(BridgeSettings(outbound=(Outbound("s", "r.*", ANY),)))
        self.assertTrue(url.startswith("tcp://127.0.0.1:"))
        self.assertNotEqual(url, ANY)
        await self.start_b(url)
        written = 0

        def arrived() -> bool:
            nonlocal written
            self.writer.send("r", [b"abc"])
            written += 1
            return bool(self.received)

        await wait_for(arrived)
        self.writer.send("x", [b""])
        self.writer.send("r", [b"abc"])
        # Published once its pack is sent (the last pack may wait for the
        # turn's end after its record took its number: the count lags).
        await wait_for(
            lambda: self.bridges(self.a).status()["outbound"][0]["published"] == written + 1
        )
        a = self.bridges(self.a).status()
        self.assertEqual(a["inbound"], [])
        [out] = a["outbound"]
        self.assertEqual(
            (out["url"], out["stream"], out["pattern"], out["last"]),
            (url, "s", "r.*", written + 2),
        )
        self.assertEqual((out["published"], out["full"], out["unfit"]), (written + 1, 0, 0))
        self.assertGreater(out["bytes"], 0)
        origin = pack_identity(self.a.data_dir).hex().upper()
        key = f"{origin}/s"
        await wait_for(
            lambda: self.bridges(self.b).status()["inbound"][0]["flows"].get(key) == written + 2
        )
        b = self.bridges(self.b).status()
        self.assertEqual(b["outbound"], [])
        [into] = b["inbound"]
        self.assertEqual((into["url"], into["stream"]), (url, "local"))
        self.assertEqual(into["flows"], {key: written + 2})
        self.assertEqual(into["written"], into["received"])
        self.assertEqual((into["malformed"], into["duplicates"], into["notices"]), (0, 0, 0))

    async def test_stopped(self) -> None:
        """
        A stopped bridge service leaves the broker: records written on A
        are no longer published, and it has nothing more to say.
        """
        await self.start_b(await self.start_a())
        await self.joined()
        bridges = self.bridges(self.a)
        [(_, publisher)] = bridges.publishers
        published = publisher.counters.published
        self.assertIsNone(bridges.stopService())  # nothing to wait for without a proxy
        self.assertEqual(bridges.status(), {"outbound": [], "inbound": []})
        self.writer.send("after", [b""])
        await settle(0.1)
        self.assertEqual(self.received, [])
        self.assertEqual(publisher.counters.published, published)


class RepairTests(BridgedBrokersTestCase):
    async def start_a_repairable(self) -> Publisher:
        """Start A with a repair endpoint in its headers, and B bridging A's stream in."""
        endpoint = fresh_ipc_endpoint("bridge-a")
        a = BridgeSettings(outbound=(Outbound("s", ".*", ANY),), endpoint=endpoint)
        self.a = InProcessBroker(self, self.context, Path(self.mktemp()), endpoint, a)
        self.a.start()
        self.writer = await self.client(endpoint)
        await self.writer.set_producer("s")
        [(url, publisher)] = self.bridges(self.a).publishers
        self.publisher = publisher
        await self.start_b(url)
        await self.joined()
        return publisher

    async def test_pauseReading(self) -> None:
        """
        While B's bridges are paused (its read gate closed) what arrives
        from the group is shed, counted, and nothing is written; once
        resumed, the shed records are repaired from A, in order, once.
        """
        publisher = await self.start_a_repairable()
        bridges = self.bridges(self.b)
        [inbound] = bridges.inbound
        self.received.clear()
        bridges.pauseReading()
        published = publisher.counters.published
        for n in range(1, 6):
            self.writer.send(f"r{n}", [b""])
        await wait_for(lambda: publisher.counters.published == published + 5)
        await wait_for(lambda: inbound.counters.shed == 5)
        self.assertEqual(self.received, [])
        bridges.resumeReading()
        await wait_for(lambda: len(self.received) >= 5)
        await settle(0.1)
        self.assertEqual([d.subject for d in self.received], [f"r{n}" for n in range(1, 6)])
        self.assertEqual(inbound.counters.repaired, 5)

    async def test_lostTailRepairedOnABeat(self) -> None:
        """
        Records B missed at the end of a burst (it was paused, and shed
        them) are repaired once A's idle bridge beats, with no later record
        to reveal them.
        """
        publisher = await self.start_a_repairable()
        bridges = self.bridges(self.b)
        [inbound] = bridges.inbound
        self.received.clear()
        inbound.pause()
        for n in range(1, 4):
            self.writer.send(f"r{n}", [b""])
        await wait_for(lambda: inbound.counters.shed == 3)
        inbound.shedding = False  # taking records again, but with no resume(): no repair yet
        self.assertEqual(inbound.counters.repairs, 0)
        await wait_for(lambda: len(self.received) == 3, timeout=5.0)
        self.assertGreaterEqual(inbound.counters.beats, 1)
        self.assertEqual([d.subject for d in self.received], ["r1", "r2", "r3"])
        self.assertGreaterEqual(publisher.counters.beats, 1)

    async def test_restartedReceiverRepairs(self) -> None:
        """
        B stopped while A writes: once B is back, what it missed is
        repaired from A's journal over the endpoint A's headers name, and
        B's stream has every record of A's, in order, each once.
        """
        publisher = await self.start_a_repairable()
        self.received.clear()
        self.writer.send("r1", [b""])
        await wait_for(lambda: len(self.received) == 1)
        await self.reader.close()
        await self.b.stop()
        sent = publisher.counters.published
        for n in range(2, 7):
            self.writer.send(f"r{n}", [b""])
        # Sent to nobody (a record taken waits in a pack a moment: sent after
        # B is back, it would reach B live, repaired by nobody).
        await wait_for(lambda: publisher.counters.published == sent + 5)
        await self.b.restart()
        self.received.clear()
        reader = await self.client(self.b.endpoint)
        reader.on_delivery = self.received.append
        await reader.set_consumer("local", ".*", mlm.EARLIEST)
        await settle(0.2)  # B's SUB joins A's PUB
        for n in range(7, 9):
            self.writer.send(f"r{n}", [b""])
        await wait_for(lambda: any(d.subject == "r8" for d in self.received), timeout=10)
        subjects = [d.subject for d in self.received if d.subject != "probe"]
        self.assertEqual(subjects, [f"r{n}" for n in range(1, 9)])
        [into] = self.bridges(self.b).status()["inbound"]
        self.assertGreaterEqual(into["repaired"], 5)
        self.assertEqual(into["notices"], 0)


class ProxyServiceTests(BridgedBrokersTestCase):
    async def test_proxy(self) -> None:
        """
        A bridge with no broker of its own (C{twistd malamute-bridge}) reads
        A's stream over TCP and publishes it; B writes what it publishes
        into its stream, in order; the origin is the proxy's --origin.
        """
        a = InProcessBroker(self, self.context, Path(self.mktemp()))
        a_endpoint = a.start()
        settings = BridgeSettings(
            outbound=(Outbound("s", ".*", ANY),),
            source=a_endpoint,
            endpoint=a_endpoint,
            origin="east",
        )
        top = makeBridgeService(
            settings, the_reactor, self.context, ClientOptions(timeout=1.0, heartbeat=0.1)
        )
        top.startService()
        self.addCleanup(top.stopService)
        bridges = top.getServiceNamed("bridges")
        assert isinstance(bridges, BridgeService)
        [(url, publisher)] = bridges.publishers
        self.publisher = publisher
        self.writer = await self.client(a_endpoint)
        await self.writer.set_producer("s")
        await self.start_b(url)
        await self.joined()
        for n in range(1, 11):
            self.writer.send(f"r{n}", [b""])
        await wait_for(lambda: len(self.received) >= 10)
        self.assertEqual([d.subject for d in self.received], [f"r{n}" for n in range(1, 11)])
        [into] = self.bridges(self.b).status()["inbound"]
        self.assertEqual(list(into["flows"]), ["east/s"])
        self.assertEqual(into["flows"]["east/s"], publisher.prev)
