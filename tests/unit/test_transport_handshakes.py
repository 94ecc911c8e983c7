"""
Tests for L{malamute_pack.transport.handshakes}: the log of failed
handshakes fed monitor events (a clock for time, a plain function for the
peer lookup), the peer lookup on real sockets (closed, reused and ipc
descriptors included), and the monitor on real ROUTER sockets with real
clients that offer the wrong mechanism.
"""

from __future__ import annotations

import errno
import os
import socket

import zmq
from twisted.internet.task import Clock
from twisted.logger import LogEvent, formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.transport.handshakes import (
    CRYPTOGRAPHIC,
    MECHANISM_MISMATCH,
    HandshakeLog,
    HandshakeMonitor,
    peer_of,
)
from tests.e2e_support import settle, the_reactor
from tests.support import capture_log

ACCEPTED = int(zmq.EVENT_ACCEPTED)
DISCONNECTED = int(zmq.EVENT_DISCONNECTED)
FAILED_AUTH = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
FAILED_PROTOCOL = int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
FAILED_NO_DETAIL = int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
ENDPOINT = "tcp://127.0.0.1:9999"


def refusals(events: list[LogEvent]) -> list[str]:
    return [t for t in map(formatEvent, events) if t and "refused a client" in t]


def seen(events: list[LogEvent]) -> list[str]:
    """Lines for a mismatch, whichever end found it first."""
    return [
        t for t in map(formatEvent, events) if t and ("refused a client" in t or "broke off" in t)
    ]


class HandshakeLogTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.events = capture_log(self)
        self.peers = {7: "tcp://10.0.0.1:4000", 8: "tcp://10.0.0.2:5000"}
        self.log = HandshakeLog(self.clock, "plain", lambda fd, endpoint: self.peers.get(fd))

    def fail_handshake(self, fd: int, event: int, value: int) -> None:
        self.log.event(ACCEPTED, fd, ENDPOINT)
        self.log.event(event, value, ENDPOINT)
        self.log.event(DISCONNECTED, fd, ENDPOINT)

    def test_mismatchLoggedWithPeer(self) -> None:
        """
        A mechanism mismatch is logged once with the endpoint, the
        mechanism it requires and the peer looked up when it was accepted.
        """
        self.fail_handshake(7, FAILED_PROTOCOL, MECHANISM_MISMATCH)
        self.assertEqual(
            refusals(self.events),
            [
                f"refused a client on {ENDPOINT}: security mechanism mismatch: this endpoint "
                "requires PLAIN and the client offers another, or none (no credentials) "
                "(peer tcp://10.0.0.1:4000)"
            ],
        )
        self.assertEqual((self.log.refused, self.log.unknown_peers), (1, 0))

    def test_peerOfTheConnectionThatEnds(self) -> None:
        """
        With two connections accepted, the failure goes with the one whose
        end follows it; a connection that ends without a failure logs nothing.
        """
        self.log.event(ACCEPTED, 7, ENDPOINT)
        self.log.event(ACCEPTED, 8, ENDPOINT)
        self.log.event(FAILED_PROTOCOL, MECHANISM_MISMATCH, ENDPOINT)
        self.log.event(DISCONNECTED, 8, ENDPOINT)
        self.log.event(DISCONNECTED, 7, ENDPOINT)
        [line] = refusals(self.events)
        self.assertIn("(peer tcp://10.0.0.2:5000)", line)

    def test_unknownPeer(self) -> None:
        """A connection whose peer could not be had is logged as such, and counted."""
        self.fail_handshake(3, FAILED_PROTOCOL, MECHANISM_MISMATCH)
        [line] = refusals(self.events)
        self.assertIn("(peer unknown: its connection was already closed)", line)
        self.assertEqual(self.log.unknown_peers, 1)

    def test_zapRefusalNotLoggedAgain(self) -> None:
        """A refusal by ZAP (status 400) is counted; the ZAP handler logs it, not this."""
        self.fail_handshake(7, FAILED_AUTH, 400)
        self.assertEqual(refusals(self.events), [])
        self.assertEqual((self.log.refused_by_zap, self.log.refused), (1, 0))

    def test_brokenOffLogged(self) -> None:
        """
        A handshake the peer broke off (no detail: an errno; a client that
        found the mismatch first) is logged with the errno and counted apart.
        """
        self.fail_handshake(7, FAILED_NO_DETAIL, errno.EPIPE)
        self.assertEqual(refusals(self.events), [])
        self.assertEqual((self.log.broken_off, self.log.refused), (1, 0))
        texts = [formatEvent(e) for e in self.events]
        self.assertIn(
            f"a client on {ENDPOINT} broke off the PLAIN handshake ({os.strerror(errno.EPIPE)}): "
            "it offers another security mechanism, or none, or it only checked the port "
            "(peer tcp://10.0.0.1:4000)",
            texts,
        )

    def test_otherProtocolErrors(self) -> None:
        """A CURVE handshake that fails says so; another error is named."""
        self.fail_handshake(7, FAILED_PROTOCOL, CRYPTOGRAPHIC)
        self.fail_handshake(8, FAILED_PROTOCOL, int(zmq.PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND))
        first, second = refusals(self.events)
        self.assertIn("its PLAIN handshake failed (for CURVE: a wrong broker key)", first)
        self.assertIn("(ZMTP_UNEXPECTED_COMMAND)", second)

    def test_nullEndpoint(self) -> None:
        """On a NULL endpoint, a mismatch is a client that offers credentials."""
        log = HandshakeLog(self.clock, "null", lambda fd, endpoint: None)
        log.event(FAILED_PROTOCOL, MECHANISM_MISMATCH, ENDPOINT)
        log.event(DISCONNECTED, 1, ENDPOINT)
        [line] = refusals(self.events)
        self.assertIn("it offers PLAIN or CURVE and this endpoint takes no security (NULL)", line)

    def test_rateLimited(self) -> None:
        """
        A flood of refusals is counted in full but logged at most 5 lines
        a second; the number not logged is said when logging resumes.
        """
        for _ in range(50):
            self.fail_handshake(7, FAILED_PROTOCOL, MECHANISM_MISMATCH)
        self.assertEqual(len(refusals(self.events)), 5)
        self.assertEqual(self.log.refused, 50)
        self.clock.advance(1)
        self.fail_handshake(7, FAILED_PROTOCOL, MECHANISM_MISMATCH)
        texts = [formatEvent(e) for e in self.events]
        self.assertIn("45 more handshake-refused events were not logged", texts)

    def test_bounded(self) -> None:
        """Failures whose end never comes are reported, not kept without bound."""
        for _ in range(1_500):
            self.log.event(FAILED_PROTOCOL, MECHANISM_MISMATCH, ENDPOINT)
        self.assertEqual(self.log.refused, 500)


class PeerOfTests(SynchronousTestCase):
    def test_tcpPeer(self) -> None:
        """The peer of an accepted TCP connection, as C{tcp://host:port}."""
        server = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(server.close)
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(client.close)
        accepted, _ = server.accept()
        self.addCleanup(accepted.close)
        client_port = client.getsockname()[1]
        self.assertEqual(
            peer_of(accepted.fileno(), f"tcp://127.0.0.1:{port}"),
            f"tcp://127.0.0.1:{client_port}",
        )
        # The descriptor is another endpoint's (it was reused): not believed.
        self.assertIsNone(peer_of(accepted.fileno(), "tcp://127.0.0.1:1"))

    def test_closedOrNotASocket(self) -> None:
        """A closed descriptor, or one that is not a socket, has no peer (and raises nothing)."""
        read, write = os.pipe()
        self.addCleanup(os.close, read)
        os.close(write)
        self.assertIsNone(peer_of(write, ENDPOINT))
        self.assertIsNone(peer_of(read, ENDPOINT))

    def test_ipcPeer(self) -> None:
        """An ipc peer is named by its process and user."""
        left, right = socket.socketpair(socket.AF_UNIX)
        self.addCleanup(left.close)
        self.addCleanup(right.close)
        self.assertEqual(
            peer_of(left.fileno(), "ipc://@/somewhere"), f"pid {os.getpid()} uid {os.getuid()}"
        )
        self.assertIsNone(peer_of(left.fileno(), ENDPOINT))


class HandshakeMonitorTests(TestCase):
    """The monitor on a real ROUTER, with real clients offering the wrong mechanism."""

    def setUp(self) -> None:
        self.events = capture_log(self)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def router(self, mechanism: str) -> tuple[HandshakeMonitor, str]:
        raw = self.context.socket(zmq.ROUTER)
        raw.setsockopt(zmq.LINGER, 0)
        if mechanism == "plain":
            raw.setsockopt(zmq.PLAIN_SERVER, 1)
        raw.bind("tcp://127.0.0.1:*")
        endpoint = raw.getsockopt_string(zmq.LAST_ENDPOINT)
        monitor = HandshakeMonitor(the_reactor(), raw, mechanism)
        monitor.start()
        self.addCleanup(raw.close, 0)
        self.addCleanup(monitor.stop)
        return monitor, endpoint

    def dealer(self, endpoint: str, plain: tuple[str, str] | None = None) -> None:
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if plain is not None:
            dealer.setsockopt_string(zmq.PLAIN_USERNAME, plain[0])
            dealer.setsockopt_string(zmq.PLAIN_PASSWORD, plain[1])
        dealer.connect(endpoint)
        dealer.send(b"hello")
        self.addCleanup(dealer.close, 0)

    async def test_noCredentialsOnPlain(self) -> None:
        """
        A client without credentials on a PLAIN ROUTER is logged and
        counted: as a mismatch, or as a handshake broken off when the
        client found the mismatch first (a race on loopback).
        """
        monitor, endpoint = self.router("plain")
        self.dealer(endpoint)
        await settle(0.3)
        lines = seen(self.events)
        self.assertGreaterEqual(len(lines), 1)
        for line in lines:
            self.assertRegex(
                line,
                rf"^(refused a client on {endpoint}: security mechanism mismatch: this "
                rf"endpoint requires PLAIN|a client on {endpoint} broke off the PLAIN handshake)",
            )
            self.assertRegex(line, r"\(peer (tcp://127\.0\.0\.1:\d+|unknown: .*)\)$")
        self.assertEqual(monitor.log.refused + monitor.log.broken_off, len(lines))

    async def test_credentialsOnNull(self) -> None:
        """A PLAIN client on a NULL ROUTER is logged as offering what the endpoint does not take."""
        monitor, endpoint = self.router("null")
        self.dealer(endpoint, ("bob", "builder"))
        await settle(0.3)
        lines = seen(self.events)
        self.assertGreaterEqual(len(lines), 1)
        if monitor.log.refused:
            self.assertIn("this endpoint takes no security (NULL)", refusals(self.events)[0])

    async def test_stopTwice(self) -> None:
        """Stopping twice is harmless (a service stopped again)."""
        monitor, _ = self.router("plain")
        monitor.stop()
        monitor.stop()
