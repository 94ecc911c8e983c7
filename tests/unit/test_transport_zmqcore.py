"""
Tests for L{malamute_pack.transport.zmqcore}: the compiled core and its
pure-Python twin receive and send whole messages the same way, raise the
same errors, and the build in use is the one asked for.
"""

from __future__ import annotations

import os
from typing import ClassVar

import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.transport import zmqcore
from malamute_pack.transport.zmqcore import (
    PURE_VARIABLE,
    RecvBatch,
    SendMessage,
    pure_recv_batch,
    pure_recv_identified_batch,
    pure_send_message,
)

try:
    from malamute_pack.transport import _zmqcore
except ImportError:  # the suite then fails in BuildTests, unless pure was asked for
    _zmqcore = None  # type: ignore[assignment]

Socket = zmq.Socket[bytes]


class PureCoreTests(SynchronousTestCase):
    """
    The pure-Python core; L{CompiledCoreTests} runs the same tests on the
    compiled one. Inproc sockets of a fresh context.
    """

    recv_batch: ClassVar[RecvBatch] = pure_recv_batch
    recv_identified_batch: ClassVar[RecvBatch] = pure_recv_identified_batch
    send_message: ClassVar[SendMessage] = pure_send_message

    def setUp(self) -> None:
        self.context: zmq.Context[Socket] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.count = 0

    def pair(self, kind: int = zmq.DEALER) -> tuple[Socket, Socket]:
        """A ROUTER bound and a socket of C{kind} connected to it (identity b"peer")."""
        self.count += 1
        endpoint = f"inproc://core-{self.count}"
        router = self.context.socket(zmq.ROUTER)
        router.bind(endpoint)
        peer = self.context.socket(kind)
        peer.setsockopt(zmq.IDENTITY, b"peer")
        peer.connect(endpoint)
        return router, peer

    def receive_all(self, sock: Socket, limit: int = 1000) -> list[list[bytes]]:
        """What C{sock} holds, received with the core under test."""
        return type(self).recv_batch(sock, limit)

    def test_nothingWaiting(self) -> None:
        """With nothing waiting, a batch is empty: no error, no wait."""
        router, _ = self.pair()
        self.assertEqual(self.receive_all(router), [])

    def test_wholeMessagesInOrder(self) -> None:
        """A ROUTER's batch holds each message whole, its routing id first, in order."""
        router, peer = self.pair()
        peer.send_multipart([b"one"])
        peer.send_multipart([b"two", b"", b"2"])
        got = self.receive_all(router)
        self.assertEqual(got, [[b"peer", b"one"], [b"peer", b"two", b"", b"2"]])

    def test_limit(self) -> None:
        """A batch stops at its limit; the rest waits for the next one."""
        router, peer = self.pair()
        for i in range(5):
            peer.send(b"%d" % i)
        first = self.receive_all(router, 3)
        rest = self.receive_all(router, 3)
        self.assertEqual([m[1] for m in first], [b"0", b"1", b"2"])
        self.assertEqual([m[1] for m in rest], [b"3", b"4"])

    def test_identifiedWithoutAuthentication(self) -> None:
        """With no authentication, an identified batch puts b"" before each message."""
        router, peer = self.pair()
        peer.send_multipart([b"a", b"b"])
        got = type(self).recv_identified_batch(router, 10)
        self.assertEqual(got, [[b"", b"peer", b"a", b"b"]])

    def test_identifiedUser(self) -> None:
        """
        A client that logged in with PLAIN (ZAP answering here, user id
        "bob") has "bob" before each of its messages, which stay whole.
        """
        zap = self.context.socket(zmq.REP)
        zap.bind("inproc://zeromq.zap.01")
        router = self.context.socket(zmq.ROUTER)
        router.setsockopt(zmq.PLAIN_SERVER, 1)
        router.bind("tcp://127.0.0.1:*")  # inproc has no security handshake
        client = self.context.socket(zmq.DEALER)
        client.setsockopt(zmq.IDENTITY, b"peer")
        client.setsockopt(zmq.PLAIN_USERNAME, b"bob")
        client.setsockopt(zmq.PLAIN_PASSWORD, b"builder")
        client.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
        client.send_multipart([b"one", b"1"])
        client.send(b"two")
        self.assertTrue(zap.poll(10_000), "no ZAP request")
        request = zap.recv_multipart()  # version, id, domain, address, identity, PLAIN, user, pass
        self.assertEqual(request[5:7], [b"PLAIN", b"bob"])
        zap.send_multipart([b"1.0", request[1], b"200", b"OK", b"bob", b""])
        got: list[list[bytes]] = []
        for _ in range(200):
            got += type(self).recv_identified_batch(router, 10)
            if len(got) == 2:
                break
            router.poll(50)
        self.assertEqual(got, [[b"bob", b"peer", b"one", b"1"], [b"bob", b"peer", b"two"]])

    def test_sendWhole(self) -> None:
        """C{first} then C{rest} go as one message; no C{rest}, one frame."""
        router, peer = self.pair()
        type(self).send_message(peer, b"hello", [])
        type(self).send_message(peer, b"a", (b"b", b"", b"c" * 70_000))
        got = self.receive_all(router)
        self.assertEqual(got, [[b"peer", b"hello"], [b"peer", b"a", b"b", b"", b"c" * 70_000]])

    def test_routedReply(self) -> None:
        """On a ROUTER, C{first} is the peer's routing id: the peer gets C{rest}."""
        router, peer = self.pair()
        peer.send(b"ping")
        self.receive_all(router)
        type(self).send_message(router, b"peer", [b"pong", b"!"])
        self.assertEqual(peer.recv_multipart(), [b"pong", b"!"])

    def test_fullQueue(self) -> None:
        """A DEALER with no peer cannot queue: EAGAIN, as pyzmq raises it."""
        dealer = self.context.socket(zmq.DEALER)
        with self.assertRaises(zmq.ZMQError) as caught:
            type(self).send_message(dealer, b"x", [b"y"])
        self.assertEqual(caught.exception.errno, zmq.EAGAIN)

    def test_unknownPeer(self) -> None:
        """A ROUTER with mandatory routing refuses an unknown peer: EHOSTUNREACH."""
        router, _ = self.pair()
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        with self.assertRaises(zmq.ZMQError) as caught:
            type(self).send_message(router, b"nobody", [b"y"])
        self.assertEqual(caught.exception.errno, zmq.EHOSTUNREACH)

    def test_closedSocket(self) -> None:
        """A closed socket is an error (ENOTSOCK) to both calls, never a crash."""
        router, peer = self.pair()
        peer.close(0)
        router.close(0)
        for call in (
            lambda: type(self).send_message(peer, b"x", []),
            lambda: self.receive_all(router),
        ):
            with self.assertRaises(zmq.ZMQError) as caught:
                call()
            self.assertEqual(caught.exception.errno, zmq.ENOTSOCK)

    def test_notBytes(self) -> None:
        """A frame that is neither bytes nor a buffer is a TypeError."""
        _, peer = self.pair()
        with self.assertRaises(TypeError):
            type(self).send_message(peer, b"a", [b"b", "c"])  # type: ignore[list-item]

    def test_buffers(self) -> None:
        """Frames may be any buffer (bytearray, memoryview), as pyzmq takes them."""
        router, peer = self.pair()
        type(self).send_message(peer, b"a", [bytearray(b"b"), memoryview(b"cd")[1:]])  # type: ignore[list-item]
        self.assertEqual(self.receive_all(router), [[b"peer", b"a", b"b", b"d"]])

    # Run by both classes of this module, each with its own core: the
    # examples do not depend on which class draws them.
    @settings(max_examples=50, suppress_health_check=[HealthCheck.differing_executors])
    @given(st.lists(st.lists(st.binary(max_size=300), min_size=1, max_size=6), max_size=20))
    def test_sameAsPyzmq(self, messages: list[list[bytes]]) -> None:
        """Any messages sent with the core arrive as pyzmq sent them, and the reverse."""
        router, peer = self.pair()
        for frames in messages:
            type(self).send_message(peer, frames[0], frames[1:])
        got = [router.recv_multipart() for _ in messages]
        self.assertEqual(got, [[b"peer", *frames] for frames in messages])
        for frames in messages:
            peer.send_multipart(frames)
        self.assertEqual(self.receive_all(router), [[b"peer", *f] for f in messages])
        router.close(0)
        peer.close(0)


class CompiledCoreTests(PureCoreTests):
    """The compiled core (C{_zmqcore}); BuildTests fails if it is not built."""

    if _zmqcore is not None:
        recv_batch = _zmqcore.recv_batch
        recv_identified_batch = _zmqcore.recv_identified_batch
        send_message = _zmqcore.send_message
    else:
        skip = "the compiled core is not built"

    def test_notBytesSendsNothing(self) -> None:
        """
        The compiled core checks every frame before the first goes, so a
        bad frame sends nothing of its message (pyzmq's frame-by-frame
        sends, the pure core's, may leave part of it queued).
        """
        router, peer = self.pair()
        with self.assertRaises(TypeError):
            type(self).send_message(peer, b"a", [b"b", "c"])  # type: ignore[list-item]
        type(self).send_message(peer, b"after", [])
        self.assertEqual(self.receive_all(router), [[b"peer", b"after"]])


class BuildTests(SynchronousTestCase):
    """Which core runs."""

    def test_pureAsked(self) -> None:
        """C{MALAMUTE_PURE} asks for the pure core with any value but empty or 0."""
        self.assertTrue(zmqcore._wanted_pure({PURE_VARIABLE: "1"}))
        self.assertTrue(zmqcore._wanted_pure({PURE_VARIABLE: "yes"}))
        self.assertFalse(zmqcore._wanted_pure({PURE_VARIABLE: "0"}))
        self.assertFalse(zmqcore._wanted_pure({PURE_VARIABLE: ""}))
        self.assertFalse(zmqcore._wanted_pure({}))

    def test_sharesPyzmqSockets(self) -> None:
        """
        The compiled core built here works on pyzmq's sockets (both use
        Debian's libzmq), and so does the pure one, trivially.
        """
        self.assertTrue(zmqcore.shares_pyzmq_sockets(pure_recv_batch))
        self.assertIsNotNone(_zmqcore, "the compiled core is not built: see scripts/bootstrap")
        self.assertTrue(zmqcore.shares_pyzmq_sockets(_zmqcore.recv_batch))

    def test_inUse(self) -> None:
        """
        The core in use is the one asked for: pure with C{MALAMUTE_PURE},
        else the compiled one, which the test command's bootstrap builds
        (so a build that silently failed fails here, not in a benchmark).
        """
        if zmqcore._wanted_pure(os.environ):
            self.assertIs(zmqcore.recv_batch, pure_recv_batch)
            self.assertEqual(zmqcore.BUILD, f"pure Python ({PURE_VARIABLE} is set)")
            self.assertFalse(zmqcore.COMPILED)
        else:
            self.assertIsNotNone(_zmqcore, "the compiled core is not built: see scripts/bootstrap")
            self.assertIs(zmqcore.recv_batch, _zmqcore.recv_batch)
            self.assertEqual(zmqcore.BUILD, "compiled")
            self.assertTrue(zmqcore.COMPILED)
