"""
Tests for L{malamute_pack.multicast.proxy}: a proxy reading a real broker
(the service C{twistd malamute} runs, in this process, over tcp on
loopback, journaling to a temporary directory) and publishing on a real
PUB read by a real SUB (no multicast).
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.base import DelayedCall
from twisted.trial.unittest import TestCase

from malamute_pack.client.options import ClientOptions
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.multicast import proxy, sockets
from malamute_pack.multicast.proxy import ProxySource
from malamute_pack.multicast.publisher import PACK_BYTES, Publisher
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess, fresh_ipc_endpoint
from tests.multicast_support import InProcessBroker, Wire, clock, settle, the_reactor
from tests.support import skip_slow, wait_for

# The proxy notices a restarted source within a few heartbeats.
OPTIONS = ClientOptions(timeout=1.0, heartbeat=0.1)


class ProxyTestCase(TestCase):
    """A source broker, a PUB and SUB (a L{Wire}), and a proxy between them."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.source = InProcessBroker(self, self.context, Path(self.mktemp()))
        self.endpoint = self.source.start()
        self.wire = Wire(self, self.context, self.url())

    def url(self) -> str:
        return "tcp://127.0.0.1:*"

    async def proxy(self, stream: str = "s", pattern: str = ".*") -> ProxySource:
        """A proxy publishing C{stream} from the source, started once the SUB has subscribed."""
        await self.wire.subscribed()
        self.publisher = Publisher(
            clock, self.wire.pub.send, self.endpoint, self.endpoint, stream, pattern
        )
        source = ProxySource(the_reactor, self.context, self.endpoint, [self.publisher], OPTIONS)
        self.addCleanup(source.stop)
        source.start()
        return source

    async def writer(self, stream: str = "s") -> MalamuteClient:
        """A client writing C{stream} on the source (closed when the test ends)."""
        client = await MalamuteClient.connect(
            the_reactor, self.endpoint, "w", context=self.context, heartbeat=0.1, timeout=2.0
        )
        self.addCleanup(client.close)
        await client.set_producer(stream)
        return client

    async def reading(self, writer: MalamuteClient, subject: str = "probe") -> int:
        """
        Write records to the source's fresh stream until the proxy publishes
        one (it reads from the latest, once it has connected), then wait
        until it has published the last: its sequence number.
        """
        written = 0

        def published() -> bool:
            nonlocal written
            writer.send(subject, [b""])
            written += 1
            return bool(self.wire.received)

        await wait_for(published)
        await wait_for(lambda: self.publisher.prev == written)
        # The SUB had subscribed before: it gets everything published.
        await wait_for(lambda: len(self.wire.received) == self.publisher.counters.published)
        return written


class ProxyTests(ProxyTestCase):
    async def test_published(self) -> None:
        """
        Records written to the source are published with the source's
        sequence numbers, each naming the one before, with their subject,
        sender, time and content; the source's endpoint names the origin.
        """
        source = await self.proxy()
        writer = await self.writer()
        last = await self.reading(writer)
        for n in range(1, 6):
            writer.send(f"r{n}", [b"%d" % n, b"more"])
        await wait_for(lambda: self.publisher.prev == last + 5)
        await settle(0.02)
        records = self.wire.records()[-5:]
        self.assertEqual(
            [(h.seq, h.prev) for h, _ in records], [(last + n, last + n - 1) for n in range(1, 6)]
        )
        self.assertEqual([h.subject for h, _ in records], [f"r{n}" for n in range(1, 6)])
        self.assertEqual([c for _, c in records], [[b"%d" % n, b"more"] for n in range(1, 6)])
        header = records[0][0]
        self.assertEqual((header.origin, header.endpoint), (self.endpoint, self.endpoint))
        self.assertEqual((header.stream, header.sender), ("s", "w"))
        self.assertGreater(header.timestamp, 0)
        # Every record the source has since the first published, once, in order.
        seqs = [h.seq for h, _ in self.wire.records()]
        self.assertEqual(seqs, list(range(seqs[0], last + 6)))
        self.assertEqual(source.received, len(seqs))

    async def test_pattern(self) -> None:
        """The source delivers only what the bridge's pattern finds."""
        await self.proxy(pattern="keep.*")
        writer = await self.writer()
        last = await self.reading(writer, "keep.probe")
        writer.send("drop.1", [b""])
        writer.send("keep.2", [b""])
        await wait_for(lambda: self.publisher.prev == last + 2)
        await settle(0.02)
        header = self.wire.records()[-1][0]
        self.assertEqual((header.seq, header.prev, header.subject), (last + 2, last, "keep.2"))

    async def test_stop(self) -> None:
        """Once stopped, the proxy closes its connection and publishes nothing more."""
        source = await self.proxy()
        writer = await self.writer()
        await self.reading(writer)
        await source.stop()
        # Counted once stopped and what it sent before has arrived (an idle
        # beat may go out while it stops).
        await settle(0.1)
        count = len(self.wire.received)
        self.assertIsNone(source.client)
        writer.send("after", [b""])
        await settle(0.1)
        self.assertEqual(len(self.wire.received), count)

    async def test_sourceRestarts(self) -> None:
        """
        The source broker restarting (same data directory and endpoint): the
        proxy reconnects and reads on from the last record it got, so what
        was written meanwhile is published, and nothing twice.
        """
        source = await self.proxy()
        writer = await self.writer()
        last = await self.reading(writer)
        for n in range(1, 4):
            writer.send(f"a{n}", [b""])
        await wait_for(lambda: self.publisher.prev == last + 3)
        await writer.close()
        await self.source.restart()
        writer = await self.writer()
        for n in range(1, 6):
            writer.send(f"b{n}", [b""])
        await wait_for(lambda: self.publisher.prev == last + 8, timeout=10)
        await settle(0.1)
        headers = [h for h, _ in self.wire.records()]
        seqs = [h.seq for h in headers]
        self.assertEqual(seqs, list(range(seqs[0], last + 9)))
        self.assertEqual([h.prev for h in headers[1:]], seqs[:-1])
        self.assertEqual(
            [h.subject for h in headers[-8:]], ["a1", "a2", "a3", "b1", "b2", "b3", "b4", "b5"]
        )
        assert source.client is not None
        self.assertGreaterEqual(source.client.reconnects, 1)

    async def test_unreachable(self) -> None:
        """
        A source that does not answer is tried again later; a proxy stopped
        while it waits to try again leaves no timer behind; a source that
        comes late is found.
        """
        self.patch(proxy, "RECONNECT", 30.0)
        endpoint = fresh_ipc_endpoint("proxy")
        options = ClientOptions(timeout=0.2, heartbeat=0.1)
        publisher = Publisher(clock, self.wire.pub.send, "o", "", "s", ".*")
        source = ProxySource(the_reactor, self.context, endpoint, [publisher], options)
        source.start()

        def waiting() -> list[DelayedCall]:
            calls = reactor.getDelayedCalls()
            return [c for c in calls if isinstance(c, DelayedCall) and c.func == source.start]

        await wait_for(lambda: bool(waiting()))
        self.assertIsNone(source.client)
        await source.stop()
        self.assertEqual(waiting(), [])
        # A late source is found.
        self.patch(proxy, "RECONNECT", 0.05)
        source = ProxySource(the_reactor, self.context, endpoint, [publisher], options)
        self.addCleanup(source.stop)
        source.start()
        await settle(0.3)
        self.assertIsNone(source.client)
        InProcessBroker(self, self.context, Path(self.mktemp()), endpoint).start()
        await wait_for(lambda: source.client is not None)

    async def test_stopWhileConnecting(self) -> None:
        """A proxy stopped before its source answered closes the connection once it does."""
        source = await self.proxy()
        self.assertIsNone(source.client)
        await source.stop()
        self.assertIsNone(source.client)


class WindowTests(ProxyTestCase):
    """
    A PUB whose queue fills (tiny high-water marks; inproc, so no kernel
    buffer hides them): the proxy holds at most its credit window.
    """

    def setUp(self) -> None:
        self.patch(sockets, "HWM", 4)
        self.patch(proxy, "WINDOW", 8)
        super().setUp()

    def url(self) -> str:
        return f"inproc://proxy-{id(self)}"

    async def test_window(self) -> None:
        """
        While the SUB reads nothing, the proxy stops taking records once its
        window is used up (the source holds the rest); once the SUB drains,
        every record is published in order, once.
        """
        source = await self.proxy()
        writer = await self.writer()
        last = await self.reading(writer)
        self.wire.sub.pauseReading()
        for n in range(1, 41):
            # Half a pack each: the queue fills with packs of two.
            writer.send(f"r{n}", [b"x" * (PACK_BYTES // 2)])
        await wait_for(lambda: self.publisher.counters.full > 0)
        await settle(0.2)
        # Published into the full queue, plus what waits here: no more than the window.
        waiting = source.received - self.publisher.counters.published
        self.assertLessEqual(waiting, proxy.WINDOW)
        self.assertLess(source.received, last + 40)
        self.wire.sub.resumeReading()
        await wait_for(lambda: self.publisher.prev == last + 40)
        await settle(0.05)
        seqs = [h.seq for h, _ in self.wire.records()]
        self.assertEqual(seqs, list(range(seqs[0], last + 41)))


class SourceProcessTests(TestCase):
    """The source a real C{twistd malamute} process, stopped and started again."""

    skip = skip_slow

    async def test_sourceProcessRestarts(self) -> None:
        """
        The source broker's process stopped (SIGTERM) and started again on
        the same data directory and endpoint: the proxy reconnects and
        publishes what was written after the restart, following what it
        published before, with no gap and nothing twice.
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.destroy, 0)
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        broker = BrokerProcess(directory, bind=ANY_TCP_PORT)
        broker.start()
        self.addCleanup(lambda: broker.stop() if broker.alive() else None)
        wire = Wire(self, context, "tcp://127.0.0.1:*")
        await wire.subscribed()
        endpoint = broker.endpoint
        publisher = Publisher(clock, wire.pub.send, endpoint, endpoint, "s", ".*")
        source = ProxySource(the_reactor, context, endpoint, [publisher], OPTIONS)
        self.addCleanup(source.stop)
        source.start()

        async def writer() -> MalamuteClient:
            client = await MalamuteClient.connect(
                the_reactor, endpoint, "w", context=context, heartbeat=0.1, timeout=5.0
            )
            await client.set_producer("s")
            return client

        client = await writer()
        written = 0

        def published() -> bool:
            nonlocal written
            client.send("probe", [b""])
            written += 1
            return bool(wire.received)

        await wait_for(published)
        await wait_for(lambda: publisher.prev == written)
        await client.close()
        broker.stop()
        broker.start()
        client = await writer()
        for subject in ("b1", "b2", "b3"):
            client.send(subject, [b""])
        await client.close()
        first = written
        await wait_for(lambda: publisher.prev == first + 3, timeout=15)
        await settle(0.1)
        headers = [h for h, _ in wire.records()]
        seqs = [h.seq for h in headers]
        self.assertEqual(seqs, list(range(seqs[0], first + 4)))
        self.assertEqual([h.prev for h in headers[1:]], seqs[:-1])
        self.assertEqual([h.subject for h in headers[-3:]], ["b1", "b2", "b3"])
