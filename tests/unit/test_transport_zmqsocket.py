"""
Tests for L{malamute_pack.transport.zmqsocket}: ZeroMQ sockets read from the
reactor over real inproc and ipc sockets, with the edge-triggered FD's
pitfalls: input waiting before registration, floods larger than a batch,
and input that only a send reveals.
"""

from __future__ import annotations

from collections.abc import Callable

import zmq
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.trial.unittest import TestCase

from malamute_pack.transport.zmqsocket import Batch, ZmqSocket
from tests.e2e_support import ipc_endpoint, settle


class Collector:
    """Counts received messages and fires when C{expected} have arrived."""

    def __init__(self, expected: int) -> None:
        self.messages: list[list[bytes]] = []
        self.batches: list[int] = []
        self.expected = expected
        self.done: Deferred[None] = Deferred()

    def __call__(self, batch: Batch) -> None:
        self.batches.append(len(batch))
        self.messages.extend(batch)
        if len(self.messages) >= self.expected and not self.done.called:
            self.done.callback(None)


class ZmqSocketTests(TestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.endpoint = ipc_endpoint()
        self.closing: list[ZmqSocket] = []

    def tearDown(self) -> None:
        for sock in self.closing:
            sock.close()
        self.context.term()

    def pair(
        self, collector: Collector, batchSize: int = 256
    ) -> tuple[ZmqSocket, zmq.Socket[bytes]]:
        raw = self.context.socket(zmq.PULL)
        raw.setsockopt(zmq.RCVHWM, 0)  # the test sends from the reactor thread: never block
        raw.bind(self.endpoint)
        wrapped = ZmqSocket(reactor, raw, collector, batchSize=batchSize)
        self.closing.append(wrapped)
        push = self.context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.setsockopt(zmq.SNDHWM, 0)
        push.connect(self.endpoint)
        return wrapped, push

    async def test_inputBeforeStart(self) -> None:
        """Messages that arrived before the socket joined the reactor are read."""
        collector = Collector(3)
        wrapped, push = self.pair(collector)
        for n in range(3):
            push.send_multipart([b"m", str(n).encode()])
        await settle(0.1)
        wrapped.startReading()
        await collector.done
        self.assertEqual(collector.messages, [[b"m", b"0"], [b"m", b"1"], [b"m", b"2"]])
        push.close()

    async def test_floodInBatches(self) -> None:
        """
        A flood many times the batch size is read completely, in bounded
        batches, with the reactor free to run between turns.
        """
        collector = Collector(5000)
        wrapped, push = self.pair(collector, batchSize=64)
        wrapped.startReading()
        ticks: list[int] = []
        for n in range(5000):
            push.send(b"%d" % n)
            if n % 1000 == 0:
                reactor.callLater(0, ticks.append, n)
        await collector.done
        self.assertEqual(len(collector.messages), 5000)
        self.assertLessEqual(max(collector.batches), 64)
        self.assertEqual(len(ticks), 5)
        push.close()

    async def test_replyRoundTrips(self) -> None:
        """
        A DEALER/ROUTER pair that answers from inside the read callback
        keeps going for many round trips: sends never lose the read edge.
        """
        router_raw = self.context.socket(zmq.ROUTER)
        router_raw.bind(self.endpoint)
        dealer_raw = self.context.socket(zmq.DEALER)
        dealer_raw.connect(self.endpoint)
        done: Deferred[None] = Deferred()
        count = [0]

        def on_router(batch: Batch) -> None:
            for frames in batch:
                router.send(frames)

        def on_dealer(batch: Batch) -> None:
            for _ in batch:
                count[0] += 1
                if count[0] == 2000:
                    done.callback(None)
                else:
                    dealer.send([b"ping"])

        router = ZmqSocket(reactor, router_raw, on_router)
        dealer = ZmqSocket(reactor, dealer_raw, on_dealer)
        self.closing += [router, dealer]
        router.startReading()
        dealer.startReading()
        dealer.send([b"ping"])
        await done
        self.assertEqual(count[0], 2000)

    async def test_sendOnlySocket(self) -> None:
        """
        A socket that only sends (PUB) can be read from the reactor: its
        readable edge is met without asking it to receive (which ZeroMQ
        refuses), and its subscribers get what it publishes.
        """
        pub_raw = self.context.socket(zmq.PUB)
        pub_raw.bind(self.endpoint)
        sub = self.context.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.endpoint)
        batches: list[Batch] = []
        pub = ZmqSocket(reactor, pub_raw, batches.append)
        self.closing.append(pub)
        got: bytes | None = None
        try:
            pub.startReading()
            for _ in range(500):  # until the subscription has reached the PUB
                pub.send([b"news"])
                pub.doRead()
                if sub.poll(0):
                    got = sub.recv(zmq.NOBLOCK)
                    break
                await settle(0.02)
            self.assertEqual(got, b"news")
            self.assertEqual(batches, [])
        finally:
            sub.close(0)


class DeferTests(TestCase):
    """
    L{ZmqSocket.defer} on a ROUTER with mandatory routing (as the broker's),
    its peers raw DEALERs over inproc.
    """

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.endpoint = f"inproc://defer-{id(self)}"
        raw = self.context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.ROUTER_MANDATORY, 1)
        raw.setsockopt(zmq.SNDHWM, 2)
        raw.bind(self.endpoint)
        self.handle: Callable[[list[bytes]], None] = lambda frames: None
        self.router = ZmqSocket(reactor, raw, self._batch)
        self.router.startReading()
        self.undelivered: list[bytes] = []
        self.peers: list[zmq.Socket[bytes]] = []

    def tearDown(self) -> None:
        self.router.close()
        for peer in self.peers:
            peer.close(linger=0)
        self.context.term()

    def _batch(self, batch: Batch) -> None:
        for frames in batch:
            self.handle(frames)

    def peer(self, name: bytes) -> zmq.Socket[bytes]:
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.ROUTING_ID, name)
        dealer.setsockopt(zmq.RCVHWM, 2)
        dealer.connect(self.endpoint)
        self.peers.append(dealer)
        return dealer

    def defer(self, route: bytes, body: bytes) -> bool:
        return self.router.defer(route, [body], lambda: self.undelivered.append(route + body))

    async def arrived(self, peer: zmq.Socket[bytes], count: int) -> list[bytes]:
        """The bodies of the next C{count} messages C{peer} has, in order."""
        await settle(0.05)
        return [peer.recv(zmq.NOBLOCK) for _ in range(count)]

    async def test_sentOnceTheBatchIsHandled(self) -> None:
        """
        While a batch is handled deferred messages are held (the peer has
        nothing yet); they go out in order once the batch is done.
        """
        alice = self.peer(b"alice")
        seen_during: list[int] = []

        def handle(frames: list[bytes]) -> None:
            self.assertTrue(self.defer(b"alice", b"1"))
            self.assertTrue(self.defer(b"alice", b"2"))
            seen_during.append(alice.poll(0))

        self.handle = handle
        alice.send(b"go")
        self.assertEqual(await self.arrived(alice, 2), [b"1", b"2"])
        self.assertEqual(seen_during, [0])
        self.assertEqual(self.undelivered, [])

    async def test_sendToSendsDeferredFirst(self) -> None:
        """A message sent at once during a batch goes after what was deferred before it."""
        alice = self.peer(b"alice")

        def handle(frames: list[bytes]) -> None:
            self.defer(b"alice", b"1")
            self.router.send_to(b"alice", [b"2"])

        self.handle = handle
        alice.send(b"go")
        self.assertEqual(await self.arrived(alice, 2), [b"1", b"2"])

    async def test_outsideABatchSentAtOnce(self) -> None:
        """Outside a batch, defer sends at once and says whether it could."""
        alice = self.peer(b"alice")
        alice.send(b"hello")  # the ROUTER learns its routing id
        await settle(0.05)
        self.assertTrue(self.defer(b"alice", b"1"))
        self.assertTrue(alice.poll(1000))
        self.assertEqual(alice.recv(), b"1")
        self.assertFalse(self.defer(b"nobody", b"1"))
        self.assertEqual(self.undelivered, [])

    async def test_sendAfterCloseDropped(self) -> None:
        """
        A message sent once the socket is closed (a journal read that ends
        after the broker stopped) is dropped and counted, not raised.
        """
        self.router.close()
        dropped = self.router.dropped
        self.assertTrue(self.defer(b"alice", b"1"))
        self.assertTrue(self.router.send_to(b"alice", [b"2"]))
        self.assertEqual(self.router.dropped, dropped + 2)
        self.assertEqual(self.undelivered, [])

    async def test_fullPeerReportedNotOthers(self) -> None:
        """
        A deferred message that finds its peer's queue full is reported,
        and so is every later one to that peer (none arrives after a
        missed one); another peer gets all of its own.
        """
        alice = self.peer(b"alice")
        bob = self.peer(b"bob")
        bob.send(b"hello")

        def handle(frames: list[bytes]) -> None:
            if frames[-1] != b"go":
                return
            for n in range(10):
                self.defer(b"alice", b"%d" % n)
                if n < 3:  # within bob's queue
                    self.defer(b"bob", b"%d" % n)

        self.handle = handle
        alice.send(b"go")
        await settle(0.1)
        got = []
        while alice.poll(0):
            got.append(alice.recv())
        self.assertGreater(len(got), 0)
        self.assertEqual(got, [b"%d" % n for n in range(len(got))])
        self.assertEqual(
            [u for u in self.undelivered if u.startswith(b"alice")],
            [b"alice%d" % n for n in range(len(got), 10)],
        )
        self.assertEqual(self.router.dropped, 10 - len(got))
        self.assertEqual([bob.recv(zmq.NOBLOCK) for _ in range(3)], [b"0", b"1", b"2"])

    async def test_failingReportLoggedSocketKept(self) -> None:
        """
        A report of an undelivered message that raises is logged; the
        socket stays in the reactor and keeps reading and sending.
        """
        alice = self.peer(b"alice")

        def broken() -> None:
            raise RuntimeError("a bug in the report")

        def handle(frames: list[bytes]) -> None:
            self.router.defer(b"nobody", [b"lost"], broken)
            self.router.defer(b"alice", [frames[-1]], lambda: None)

        self.handle = handle
        alice.send(b"one")
        self.assertEqual(await self.arrived(alice, 1), [b"one"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        alice.send(b"two")
        self.assertEqual(await self.arrived(alice, 1), [b"two"])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
