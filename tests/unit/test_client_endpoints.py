"""
Tests for L{malamute_pack.client.endpoints}: reading the endpoints an
application gives, and the ring that moves between them.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.endpoints import EndpointRing, parse_endpoints
from malamute_pack.client.errors import BadEndpointError


class ParseTests(SynchronousTestCase):
    def test_one(self) -> None:
        """One endpoint is one endpoint."""
        self.assertEqual(parse_endpoints("tcp://a:9999"), ("tcp://a:9999",))

    def test_commas(self) -> None:
        """Endpoints separated by commas, blanks and empty parts ignored, keep their order."""
        self.assertEqual(
            parse_endpoints(" tcp://a:9999 ,tcp://b:9999,"), ("tcp://a:9999", "tcp://b:9999")
        )

    def test_sequence(self) -> None:
        """A list or tuple of endpoints is taken as it is."""
        self.assertEqual(parse_endpoints(["ipc://@/a", "ipc://@/b"]), ("ipc://@/a", "ipc://@/b"))

    def test_none(self) -> None:
        """No endpoint at all is a BadEndpointError."""
        self.assertRaises(BadEndpointError, parse_endpoints, " , ")
        self.assertRaises(BadEndpointError, parse_endpoints, [])


class RingTests(SynchronousTestCase):
    def test_roundRobin(self) -> None:
        """Each failure moves to the next endpoint; every one failing in a row is a round."""
        ring = EndpointRing(["a", "b", "c"])
        self.assertTrue(ring.several)
        self.assertEqual(ring.current, "a")
        self.assertEqual([ring.failed(), ring.current], [False, "b"])
        self.assertEqual([ring.failed(), ring.current], [False, "c"])
        self.assertEqual([ring.failed(), ring.current], [True, "a"])
        self.assertEqual([ring.failed(), ring.current], [False, "b"])

    def test_acceptedStartsCountingAgain(self) -> None:
        """Once an endpoint accepted us, a round needs every endpoint to fail again."""
        ring = EndpointRing(["a", "b"])
        self.assertFalse(ring.failed())
        ring.accepted()
        self.assertFalse(ring.failed())
        self.assertTrue(ring.failed())

    def test_switches(self) -> None:
        """Switches count the new connections made."""
        ring = EndpointRing(["a", "b"])
        ring.switched()
        ring.switched()
        self.assertEqual(ring.switches, 2)

    def test_single(self) -> None:
        """One endpoint (or none named) leaves fail-over off."""
        self.assertFalse(EndpointRing(["a"]).several)
        self.assertEqual(EndpointRing(()).current, "")
