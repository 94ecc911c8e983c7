"""
Tests for L{malamute_pack.transport.zmqsocket}: ZeroMQ sockets read from the
reactor over real inproc and ipc sockets, with the edge-triggered FD's
pitfalls: input waiting before registration, floods larger than a batch,
and input that only a send reveals.
"""

from __future__ import annotations

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
