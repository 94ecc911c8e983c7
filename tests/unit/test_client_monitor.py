"""
Tests for L{malamute_pack.client.monitor} and the watched DEALER of
L{malamute_pack.client.dealer.make_watched_dealer}: real ZeroMQ sockets
(a ROUTER bound on a loopback port of its choosing, endpoints nothing is
bound to), no broker.
"""

from __future__ import annotations

import struct

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.dealer import make_watched_dealer
from malamute_pack.client.monitor import LinkChange, link_change, unwatch
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, fresh_ipc_endpoint


class LinkChangeTests(SynchronousTestCase):
    def test_eventsRead(self) -> None:
        """The handshake's success is MADE, a disconnection LOST."""
        made = [struct.pack("=HI", zmq.EVENT_HANDSHAKE_SUCCEEDED, 0), b"tcp://a:1"]
        lost = [struct.pack("=HI", zmq.EVENT_DISCONNECTED, 7), b"tcp://a:1"]
        self.assertEqual((link_change(made), link_change(lost)), (LinkChange.MADE, LinkChange.LOST))

    def test_otherOrMalformedIgnored(self) -> None:
        """Any other event, or a message that is no event, says nothing (None)."""
        self.assertIsNone(link_change([struct.pack("=HI", zmq.EVENT_CONNECTED, 9), b"x"]))
        self.assertIsNone(link_change([b"short", b"x"]))
        self.assertIsNone(link_change([struct.pack("=HI", zmq.EVENT_DISCONNECTED, 0)]))


class WatchedDealerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)

    def router(self) -> tuple[zmq.Socket[bytes], str]:
        """A ROUTER bound on a loopback port of its choosing, and its endpoint."""
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(ANY_TCP_PORT)
        return router, router.getsockopt_string(zmq.LAST_ENDPOINT)

    def watched(self, endpoint: str) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
        dealer, pair = make_watched_dealer(self.context, endpoint)
        self.addCleanup(dealer.close, 0)
        self.addCleanup(pair.close, 0)
        return dealer, pair

    def next_change(self, pair: zmq.Socket[bytes]) -> LinkChange:
        """The next change the monitor reports, waiting up to 5 s."""
        while pair.poll(5000):
            change = link_change(pair.recv_multipart())
            if isinstance(change, LinkChange):
                return change
        raise AssertionError("no connection event within 5 s")

    def test_madeThenLost(self) -> None:
        """
        The monitor reports the connection up (a message then goes) and, once
        the peer's socket closes, lost.
        """
        router, endpoint = self.router()
        dealer, pair = self.watched(endpoint)
        self.assertEqual(self.next_change(pair), LinkChange.MADE)
        dealer.send(b"hello", zmq.NOBLOCK)
        self.assertTrue(router.poll(5000))
        self.assertEqual(router.recv_multipart()[1:], [b"hello"])
        router.close(linger=0)
        self.assertEqual(self.next_change(pair), LinkChange.LOST)

    def test_immediateWithoutConnection(self) -> None:
        """
        With nothing bound at its endpoint, the watched DEALER queues
        nothing: a send fails at once (zmq.Again) instead of waiting.
        """
        dealer, _ = self.watched(fresh_ipc_endpoint("dead"))
        self.assertEqual(dealer.getsockopt(zmq.IMMEDIATE), 1)
        self.assertRaises(zmq.Again, dealer.send, b"open", zmq.NOBLOCK)

    def test_eachDealerItsOwnEvents(self) -> None:
        """
        Two watched DEALERs each hear only their own connection: closing the
        first (after unwatch) tells the second's monitor nothing.
        """
        router, endpoint = self.router()
        self.addCleanup(router.close, 0)  # kept open (and referenced) throughout
        first, first_pair = self.watched(endpoint)
        _, second_pair = self.watched(endpoint)
        self.assertEqual(self.next_change(first_pair), LinkChange.MADE)
        self.assertEqual(self.next_change(second_pair), LinkChange.MADE)
        unwatch(first)
        first.close(linger=0)
        self.assertFalse(second_pair.poll(200))
        unwatch(first)  # harmless once closed
