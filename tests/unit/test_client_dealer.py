"""
Tests for L{malamute_pack.client.dealer}: the DEALER socket the clients
connect through (a real ZeroMQ context, no broker needed).
"""

from __future__ import annotations

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.dealer import SOCKET_HWM, make_dealer
from malamute_pack.client.errors import BadEndpointError


class DealerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)

    def test_options(self) -> None:
        """A DEALER with no linger, deep queues, and PLAIN credentials when given."""
        socket = make_dealer(self.context, "tcp://127.0.0.1:1", ("user", "secret"))
        self.addCleanup(socket.close, 0)
        self.assertEqual(socket.type, zmq.DEALER)
        self.assertEqual(socket.getsockopt(zmq.LINGER), 0)
        self.assertEqual(
            (socket.getsockopt(zmq.SNDHWM), socket.getsockopt(zmq.RCVHWM)),
            (SOCKET_HWM, SOCKET_HWM),
        )
        self.assertEqual(socket.getsockopt_string(zmq.PLAIN_USERNAME), "user")
        self.assertEqual(socket.getsockopt(zmq.MECHANISM), zmq.PLAIN)

    def test_withoutCredentials(self) -> None:
        """Without credentials the socket uses the NULL mechanism."""
        socket = make_dealer(self.context, "tcp://127.0.0.1:1")
        self.addCleanup(socket.close, 0)
        self.assertEqual(socket.getsockopt(zmq.MECHANISM), zmq.NULL)

    def test_badEndpoint(self) -> None:
        """An endpoint ZeroMQ refuses raises BadEndpointError."""
        self.assertRaises(BadEndpointError, make_dealer, self.context, "nonsense://x")
