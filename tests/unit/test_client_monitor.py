"""
Tests for L{malamute_pack.client.monitor}: what handshakes the broker broke
off make of a client's connect, by the mechanism it offers; and the watched
DEALER of L{malamute_pack.client.dealer.make_watched_dealer}: real ZeroMQ
sockets (a ROUTER bound on a loopback port of its choosing, endpoints
nothing is bound to), no broker.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client import monitor
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.dealer import make_watched_dealer
from malamute_pack.client.errors import AuthenticationRefusedError, WrongServerKeyError
from malamute_pack.client.monitor import LinkChange, link_change, unwatch
from malamute_pack.client.options import CurveKeys
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


class HandshakesTests(SynchronousTestCase):
    """What handshakes the broker broke off make of a client's connect."""

    def broken_off(
        self, handshakes: monitor.Handshakes, times: int
    ) -> list[LinkChange | monitor.Refusal | None]:
        return [handshakes.heard(LinkChange.BROKEN_OFF) for _ in range(times)]

    def test_curveConcludesEarly(self) -> None:
        """
        A CURVE client's handshakes broken off, none succeeding, are a
        refusal once they are L{monitor.BROKEN_OFF_CONCLUSIVE}: its broker key is
        probably wrong.
        """
        handshakes = monitor.Handshakes()
        heard = self.broken_off(handshakes, monitor.BROKEN_OFF_CONCLUSIVE)
        self.assertEqual(
            heard, [None] * (monitor.BROKEN_OFF_CONCLUSIVE - 1) + [monitor.Refusal(broken_off=2)]
        )
        keys = CurveKeys(server="K" * 40, public="P" * 40, secret="S" * 40)
        error = monitor.refusal_error(monitor.Refusal(broken_off=2), "tcp://b:1", None, keys)
        self.assertIsInstance(error, WrongServerKeyError)

    def test_noCredentialsConcludesEarly(self) -> None:
        """
        A client without credentials whose handshakes the broker broke off
        (its refusal of the mechanism lost to the reset) is refused the
        same way: once, at L{monitor.BROKEN_OFF_CONCLUSIVE}, with an error that says
        the broker probably requires credentials; at a timeout, one is
        enough.
        """
        handshakes = monitor.Handshakes()
        heard = self.broken_off(handshakes, monitor.BROKEN_OFF_CONCLUSIVE + 2)
        refused = [change for change in heard if change is not None]
        self.assertEqual(refused, [monitor.Refusal(broken_off=monitor.BROKEN_OFF_CONCLUSIVE)])
        error = monitor.refusal_error(monitor.Refusal(broken_off=2), "tcp://b:1", None, None)
        self.assertNotIsInstance(error, WrongServerKeyError)
        self.assertEqual((error.mechanism, error.status), ("NULL", None))
        self.assertIn("twice", str(error))
        self.assertIn("requires PLAIN/CURVE authentication", str(error))
        once = monitor.Handshakes()
        once.heard(LinkChange.BROKEN_OFF)
        self.assertEqual(once.refusal(), monitor.Refusal(broken_off=1))

    def test_plainBrokenOff(self) -> None:
        """
        A PLAIN client's broken-off handshakes: the broker refused the
        credentials (its ERROR lost to the reset) or takes another
        mechanism; the error names the user.
        """
        error = monitor.refusal_error(
            monitor.Refusal(broken_off=1), "tcp://b:1", ("bob", "pw"), None
        )
        self.assertIsInstance(error, AuthenticationRefusedError)
        self.assertEqual(error.mechanism, "PLAIN")
        self.assertIn("once", str(error))
        self.assertIn("'bob'", str(error))

    def test_succeededNeverRefused(self) -> None:
        """Once a handshake succeeded, handshakes broken off later are no refusal."""
        handshakes = monitor.Handshakes()
        handshakes.heard(LinkChange.MADE)
        self.assertEqual(self.broken_off(handshakes, 3), [None] * 3)
        self.assertIsNone(handshakes.refusal())

    def test_noneBrokenOff(self) -> None:
        """A client whose handshakes the broker never broke off has no refusal to report."""
        self.assertIsNone(monitor.Handshakes().refusal())


class ResettingListener:
    """A TCP listener on loopback that resets every connection it accepts."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._listener.getsockname()[1]}"
        self.resets = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return  # closed
            self.resets += 1  # before the reset: the client may count it at once
            # Linger 0: close() resets the connection, as a refusing
            # broker's close with the client's bytes unread does.
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            connection.close()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)


class ResetHandshakeTests(SynchronousTestCase):
    def test_resetHandshakesRefuse(self) -> None:
        """
        A client without credentials whose every connection is reset in
        the handshake fails connect with L{AuthenticationRefusedError}
        saying that the broker probably requires credentials, long before
        its timeout, not with "no answer" at it.
        """
        listener = ResettingListener()
        self.addCleanup(listener.close)
        started = time.monotonic()
        with self.assertRaises(AuthenticationRefusedError) as raised:
            BlockingClient(listener.endpoint, "me", timeout=60.0)
        self.assertLess(time.monotonic() - started, 30.0)  # a bound against the 60 s timeout
        self.assertIn("requires PLAIN/CURVE authentication", str(raised.exception))
        self.assertGreaterEqual(listener.resets, monitor.BROKEN_OFF_CONCLUSIVE)


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
