"""
Tests for L{malamute_pack.transport.gate}: closing the gate stops reading
real ZeroMQ sockets (what peers send waits), opening it reads what waited,
and the gate keeps its count and tells whoever asked when it opens.
"""

from __future__ import annotations

import zmq
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.trial.unittest import TestCase

from malamute_pack.transport.gate import ReadGate
from malamute_pack.transport.zmqsocket import ZmqSocket
from tests.e2e_support import ipc_endpoint, settle
from tests.unit.test_transport_zmqsocket import Collector


class ReadGateTests(TestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        endpoint = ipc_endpoint()
        raw = self.context.socket(zmq.PULL)
        raw.bind(endpoint)
        self.collector = Collector(expected=10)
        self.socket = ZmqSocket(reactor, raw, self.collector)
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(endpoint)
        self.clock = Clock()
        self.gate = ReadGate(self.clock)
        self.gate.add(self.socket)

    def tearDown(self) -> None:
        self.socket.close()
        self.push.close()
        self.context.term()

    async def test_closedGateReadsNothing(self) -> None:
        """
        While the gate is closed nothing is read, however much is sent; once
        it opens, everything that waited is read, in order.
        """
        self.socket.startReading()
        self.gate.backlog(over=True)
        for n in range(10):
            self.push.send(b"%d" % n)
        await settle(0.2)
        self.assertEqual(self.collector.messages, [])
        self.clock.advance(1.5)
        self.gate.backlog(over=False)
        await self.collector.done
        self.assertEqual(self.collector.messages, [[b"%d" % n] for n in range(10)])
        self.assertEqual((self.gate.closings, self.gate.closed_for), (1, 1.5))

    def test_openCallbacksAndIdempotence(self) -> None:
        """
        Closing a closed gate or opening an open one does nothing; every
        closing and opening calls back whoever asked to know, with whether
        it is open.
        """
        opened: list[bool] = []
        self.gate.watch(opened.append)
        self.gate.open()
        self.gate.close()
        self.gate.close()
        self.assertTrue(self.gate.closed)
        self.gate.open()
        self.gate.open()
        self.assertEqual((opened, self.gate.closings), ([False, True], 1))

    def test_readerAddedWhileClosed(self) -> None:
        """A reader added while the gate is closed starts paused."""
        self.gate.close()
        other = ZmqSocket(reactor, self.context.socket(zmq.PULL), self.collector)
        self.addCleanup(other.close)
        self.gate.add(other)
        self.assertTrue(other.paused)
