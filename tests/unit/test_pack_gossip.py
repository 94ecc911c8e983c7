"""
Tests for L{malamute_pack.pack.gossip}: the bounded table; the protocol
core without sockets (a L{Clock} for time, lists for what it sends); and
L{Gossip} nodes on real tcp sockets on loopback in the real reactor:
servers and clients exchanging tuples, a node bridging two servers, INVALID
and the re-HELLO it causes, garbage on the wire, and timers gone on stop.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import zmq
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.pack.gossip import Gossip, GossipCore, GossipTable
from malamute_pack.protocol.zgossip import (
    GossipMessage,
    Hello,
    Invalid,
    Ping,
    Pong,
    Publish,
    decode,
    encode,
)

ANY_TCP = "tcp://127.0.0.1:*"


class TableTests(SynchronousTestCase):
    def test_storeNewChangedDuplicate(self) -> None:
        """store is True for a new key or a changed value, False for a duplicate."""
        table = GossipTable()
        self.assertTrue(table.store("k", "v1"))
        self.assertFalse(table.store("k", "v1"))
        self.assertTrue(table.store("k", "v2"))
        self.assertEqual(table.get("k"), "v2")
        self.assertIsNone(table.get("other"))
        self.assertEqual(table.refused, 0)

    def test_itemsInOrder(self) -> None:
        """items() lists every tuple, oldest key first, as a copy."""
        table = GossipTable()
        table.store("a", "1")
        table.store("b", "2")
        table.store("a", "3")
        items = table.items()
        table.store("c", "4")
        self.assertEqual(items, [("a", "3"), ("b", "2")])
        self.assertEqual(len(table), 3)

    def test_maxTuples(self) -> None:
        """
        Beyond max_tuples a new key is refused and counted; an existing
        key can still change its value.
        """
        table = GossipTable(max_tuples=2)
        table.store("a", "1")
        table.store("b", "1")
        self.assertFalse(table.store("c", "1"))
        self.assertEqual(table.refused, 1)
        self.assertIsNone(table.get("c"))
        self.assertTrue(table.store("a", "2"))
        self.assertIn("table full", table.refusal("c", "1") or "")

    def test_sizeBoundsInUtf8Bytes(self) -> None:
        """Key and value bounds count UTF-8 bytes; what exceeds them is refused."""
        table = GossipTable(max_key_bytes=4, max_value_bytes=4)
        self.assertTrue(table.store("\u00e9\u00e9", "\u00e9\u00e9"))  # 4 bytes each
        self.assertFalse(table.store("\u00e9\u00e9x", "v"))
        self.assertFalse(table.store("k", "\u20ac\u20ac"))
        self.assertEqual(table.refused, 2)
        self.assertIn("key of 5 bytes", table.refusal("\u00e9\u00e9x", "v") or "")
        self.assertIn("value of 6 bytes", table.refusal("k", "\u20ac\u20ac") or "")

    def test_defaultBounds(self) -> None:
        """By default: 10,000 tuples, keys of 255 bytes, values of 1024 bytes."""
        table = GossipTable()
        bounds = (table.max_tuples, table.max_key_bytes, table.max_value_bytes)
        self.assertEqual(bounds, (10_000, 255, 1024))
        self.assertTrue(table.store("k" * 255, "v" * 1024))
        self.assertFalse(table.store("k" * 256, "v"))
        self.assertFalse(table.store("k", "v" * 1025))

    def test_notUtf8Refused(self) -> None:
        """A string that cannot be encoded as UTF-8 (a lone surrogate) is refused."""
        table = GossipTable()
        self.assertFalse(table.store("\udcff", "v"))
        self.assertEqual(table.refused, 1)

    def test_keyBoundAtMost255(self) -> None:
        """A key bound beyond what the protocol carries is a configuration error."""
        self.assertRaises(ValueError, GossipTable, max_key_bytes=256)


class Recorder:
    """What a core sends, decoded: to clients by routing id, to remotes by name."""

    def __init__(self) -> None:
        self.to_clients: list[tuple[bytes, GossipMessage]] = []
        self.to_remotes: list[tuple[str, GossipMessage]] = []
        self.refuse = False  # every send fails, as with a full queue
        self.tuples: list[tuple[str, str]] = []

    def send_to_client(self, route: bytes, frame: bytes) -> bool:
        if self.refuse:
            return False
        self.to_clients.append((route, decode(frame)))
        return True

    def remote(self, name: str) -> Callable[[bytes], bool]:
        def send(frame: bytes) -> bool:
            if self.refuse:
                return False
            self.to_remotes.append((name, decode(frame)))
            return True

        return send

    def on_tuple(self, key: str, value: str) -> None:
        self.tuples.append((key, value))

    def take_clients(self) -> list[tuple[bytes, GossipMessage]]:
        sent, self.to_clients = self.to_clients, []
        return sent

    def take_remotes(self) -> list[tuple[str, GossipMessage]]:
        sent, self.to_remotes = self.to_remotes, []
        return sent


class CoreCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent = Recorder()
        self.core = GossipCore(
            self.clock, self.sent.on_tuple, self.sent.send_to_client, client_timeout=1.0
        )

    def client(self, route: bytes, message: GossipMessage) -> None:
        self.core.from_client([route, encode(message)])

    def remote(self, name: str, message: GossipMessage) -> None:
        self.core.from_remote(name, [encode(message)])


class ServerCoreTests(CoreCase):
    def test_helloGetsAllTuples(self) -> None:
        """A client's HELLO is answered with every tuple of the table."""
        self.core.publish("a", "1")
        self.core.publish("b", "2")
        self.client(b"c1", Hello())
        self.assertEqual(
            self.sent.take_clients(), [(b"c1", Publish("a", "1")), (b"c1", Publish("b", "2"))]
        )
        self.assertEqual(self.core.clients, [b"c1"])

    def test_clientsBounded(self) -> None:
        """
        Past C{max_clients}, a new client's HELLO is refused and counted (it
        gets nothing); one already known is still served, and a place freed
        by expiry is taken again.
        """
        self.core.max_clients = 2
        self.client(b"c1", Hello())
        self.client(b"c2", Hello())
        self.sent.take_clients()
        self.client(b"c3", Hello())
        self.assertEqual(self.sent.take_clients(), [])
        self.assertEqual(self.core.counters.clients_refused, 1)
        self.assertEqual(sorted(self.core.clients), [b"c1", b"c2"])
        self.client(b"c1", Ping())
        self.assertEqual(self.sent.take_clients(), [(b"c1", Pong())])
        self.clock.advance(0.6)
        self.client(b"c1", Ping())
        self.clock.advance(0.6)
        self.core.expire()
        self.client(b"c3", Hello())
        self.assertEqual(sorted(self.core.clients), [b"c1", b"c3"])

    def test_publishWithoutHello(self) -> None:
        """A PUBLISH from a client that never said HELLO gets INVALID and is not stored."""
        self.client(b"c1", Publish("k", "v"))
        self.assertEqual(self.sent.take_clients(), [(b"c1", Invalid())])
        self.assertIsNone(self.core.table.get("k"))
        self.assertEqual(self.sent.tuples, [])
        self.assertEqual(self.core.counters.invalid_sent, 1)

    def test_pingWithoutHello(self) -> None:
        """A PING from an unknown client gets INVALID; after HELLO, PONG."""
        self.client(b"c1", Ping())
        self.client(b"c1", Hello())
        self.client(b"c1", Ping())
        self.assertEqual(self.sent.take_clients(), [(b"c1", Invalid()), (b"c1", Pong())])

    def test_publishForwardedToAllClientsWithEcho(self) -> None:
        """
        A client's new tuple is stored, delivered, and forwarded to every
        client, the sender included (the server echoes), and every remote.
        """
        self.core.add_remote("up", self.sent.remote("up"))
        self.sent.take_remotes()
        self.client(b"c1", Hello())
        self.client(b"c2", Hello())
        self.client(b"c1", Publish("k", "v"))
        self.assertEqual(self.core.table.get("k"), "v")
        self.assertEqual(self.sent.tuples, [("k", "v")])
        self.assertEqual(
            self.sent.take_clients(), [(b"c1", Publish("k", "v")), (b"c2", Publish("k", "v"))]
        )
        self.assertEqual(self.sent.take_remotes(), [("up", Publish("k", "v"))])

    def test_duplicateDropped(self) -> None:
        """A tuple already held is neither delivered nor forwarded, only counted."""
        self.client(b"c1", Hello())
        self.client(b"c1", Publish("k", "v"))
        self.sent.take_clients()
        self.client(b"c1", Publish("k", "v"))
        self.assertEqual(self.sent.take_clients(), [])
        self.assertEqual(self.sent.tuples, [("k", "v")])
        self.assertEqual(self.core.counters.duplicates, 1)

    def test_changedValueForwarded(self) -> None:
        """A changed value is a new tuple: delivered and forwarded again."""
        self.client(b"c1", Hello())
        self.client(b"c1", Publish("k", "v1"))
        self.client(b"c1", Publish("k", "v2"))
        self.assertEqual(self.sent.tuples, [("k", "v1"), ("k", "v2")])
        self.assertEqual(self.core.table.get("k"), "v2")

    def test_silentClientForgotten(self) -> None:
        """A client silent for client_timeout is forgotten; its next PING gets INVALID."""
        self.client(b"c1", Hello())
        self.clock.advance(0.6)
        self.client(b"c1", Ping())  # any message keeps it known
        self.clock.advance(0.6)
        self.core.expire()
        self.assertEqual(self.core.clients, [b"c1"])
        self.clock.advance(0.5)
        self.core.expire()
        self.assertEqual(self.core.clients, [])
        self.assertEqual(self.core.counters.expired, 1)
        self.sent.take_clients()
        self.client(b"c1", Ping())
        self.assertEqual(self.sent.take_clients(), [(b"c1", Invalid())])

    def test_secondHelloResyncs(self) -> None:
        """A HELLO from a known client gets every tuple again (no INVALID)."""
        self.core.publish("a", "1")
        self.client(b"c1", Hello())
        self.client(b"c1", Hello())
        self.assertEqual(self.sent.take_clients(), [(b"c1", Publish("a", "1"))] * 2)

    def test_serverWordsFromClientIgnored(self) -> None:
        """PONG or INVALID from a client is counted and never answered (no loops)."""
        self.client(b"c1", Invalid())
        self.client(b"c1", Hello())
        self.client(b"c1", Pong())
        self.assertEqual(self.sent.take_clients(), [])
        self.assertEqual(self.core.counters.unexpected, 2)

    def test_malformedCounted(self) -> None:
        """
        Garbage, a ZRE frame, extra frames or a missing frame are dropped
        and counted; the client's session goes on.
        """
        self.client(b"c1", Hello())
        for frames in (
            [b"c1", b"garbage"],
            [b"c1", b"\xaa\xa1\x06\x02\x00\x01"],
            [b"c1", encode(Ping()), b"extra"],
            [b"c1"],
        ):
            self.core.from_client(frames)
        self.assertEqual(self.core.counters.malformed, 4)
        self.assertEqual(self.sent.take_clients(), [])
        self.client(b"c1", Ping())
        self.assertEqual(self.sent.take_clients(), [(b"c1", Pong())])

    def test_refusedCounted(self) -> None:
        """A tuple beyond the table's bounds is refused, counted, and goes nowhere."""
        core = GossipCore(
            self.clock,
            self.sent.on_tuple,
            self.sent.send_to_client,
            table=GossipTable(max_value_bytes=3),
        )
        core.from_client([b"c1", encode(Hello())])
        core.from_client([b"c1", encode(Publish("k", "long"))])
        self.assertFalse(core.publish("k2", "long"))
        self.assertEqual(core.counters.refused, 2)
        self.assertEqual(self.sent.take_clients(), [])
        self.assertEqual(self.sent.tuples, [])

    def test_failedSendForgetsClient(self) -> None:
        """
        A client the server cannot send to (queue full, gone) is forgotten,
        so its next PING gets INVALID and its HELLO a full resync.
        """
        self.client(b"c1", Hello())
        self.sent.refuse = True
        self.core.publish("k", "v")
        self.assertEqual(self.core.clients, [])
        self.assertEqual(self.core.counters.send_failed, 1)

    def test_onTupleFailureContained(self) -> None:
        """An application callback that raises does not stop the forwarding."""

        def broken(key: str, value: str) -> None:
            raise RuntimeError("application bug")

        core = GossipCore(self.clock, broken, self.sent.send_to_client)
        core.from_client([b"c1", encode(Hello())])
        core.from_client([b"c1", encode(Publish("k", "v"))])
        self.assertEqual(self.sent.take_clients(), [(b"c1", Publish("k", "v"))])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_clientOnlyIgnoresClientTraffic(self) -> None:
        """A core without a server side ignores what claims to come from a client."""
        core = GossipCore(self.clock, self.sent.on_tuple)
        core.from_client([b"c1", encode(Hello())])
        self.assertEqual(core.clients, [])
        self.assertEqual(core.counters.received, 0)


class RemoteCoreTests(CoreCase):
    def test_helloThenAllTuples(self) -> None:
        """A new remote gets HELLO, then every tuple of the table."""
        self.core.publish("a", "1")
        self.core.add_remote("up", self.sent.remote("up"))
        self.assertEqual(self.sent.take_remotes(), [("up", Hello()), ("up", Publish("a", "1"))])

    def test_publishFromRemote(self) -> None:
        """
        A remote's new tuple is delivered and forwarded to every client and
        every other remote, not back to the remote it came from.
        """
        self.core.add_remote("up", self.sent.remote("up"))
        self.core.add_remote("other", self.sent.remote("other"))
        self.client(b"c1", Hello())
        self.sent.take_remotes()
        self.remote("up", Publish("k", "v"))
        self.assertEqual(self.sent.tuples, [("k", "v")])
        self.assertEqual(self.sent.take_remotes(), [("other", Publish("k", "v"))])
        self.assertEqual(self.sent.take_clients(), [(b"c1", Publish("k", "v"))])

    def test_localPublishNotDelivered(self) -> None:
        """Our own tuple goes to every remote but not to on_tuple."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.sent.take_remotes()
        self.assertTrue(self.core.publish("k", "v"))
        self.assertFalse(self.core.publish("k", "v"))
        self.assertEqual(self.sent.take_remotes(), [("up", Publish("k", "v"))])
        self.assertEqual(self.sent.tuples, [])

    def test_invalidGetsHelloAndTuples(self) -> None:
        """On INVALID (the server forgot us) a client says HELLO and republishes all."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.core.publish("a", "1")
        self.remote("up", Publish("b", "2"))
        self.sent.take_remotes()
        self.remote("up", Invalid())
        self.assertEqual(
            self.sent.take_remotes(),
            [("up", Hello()), ("up", Publish("a", "1")), ("up", Publish("b", "2"))],
        )
        self.assertEqual(self.core.counters.invalid_received, 1)

    def test_pingAndPong(self) -> None:
        """ping() sends PING to every remote; a PONG refreshes when it was last heard."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.sent.take_remotes()
        self.assertIsNone(self.core.remote_last_heard("up"))
        self.core.ping()
        self.assertEqual(self.sent.take_remotes(), [("up", Ping())])
        self.clock.advance(2)
        self.remote("up", Pong())
        self.assertEqual(self.core.remote_last_heard("up"), 2)

    def test_failedSendResyncs(self) -> None:
        """After a failed send to a remote, the next tick sends HELLO and all tuples."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.sent.take_remotes()
        self.sent.refuse = True
        self.core.publish("k", "v")
        self.sent.refuse = False
        self.core.ping()
        self.assertEqual(self.sent.take_remotes(), [("up", Hello()), ("up", Publish("k", "v"))])
        self.core.ping()
        self.assertEqual(self.sent.take_remotes(), [("up", Ping())])

    def test_clientWordsFromServerIgnored(self) -> None:
        """HELLO or PING from a server is counted and not answered; garbage is counted."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.sent.take_remotes()
        self.remote("up", Hello())
        self.remote("up", Ping())
        self.core.from_remote("up", [b"junk"])
        self.core.from_remote("gone", [encode(Publish("k", "v"))])
        self.assertEqual(self.sent.take_remotes(), [])
        self.assertEqual(self.core.counters.unexpected, 2)
        self.assertEqual(self.core.counters.malformed, 1)
        self.assertIsNone(self.core.table.get("k"))

    def test_twoRemotesSameName(self) -> None:
        """A node is a client of one server once."""
        self.core.add_remote("up", self.sent.remote("up"))
        self.assertRaises(ValueError, self.core.add_remote, "up", self.sent.remote("up"))


class SettlingTests(SynchronousTestCase):
    def test_quickChangeSettles(self) -> None:
        """
        A client that changes a key twice in quick succession ends, with
        its server, on the last value, and the traffic stops: the echo of
        the older value is not sent back to the server it came from.
        """
        clock = Clock()
        to_server: list[bytes] = []
        to_client: list[bytes] = []

        def to(queue: list[bytes]) -> Callable[[bytes], bool]:
            def send(frame: bytes) -> bool:
                queue.append(frame)
                return True

            return send

        server = GossipCore(clock, lambda k, v: None, lambda route, frame: to(to_client)(frame))
        client = GossipCore(clock, lambda k, v: None)
        client.add_remote("s", to(to_server))
        client.publish("k", "v1")
        client.publish("k", "v2")
        for _ in range(100):
            if not to_server and not to_client:
                break
            while to_server:
                server.from_client([b"c", to_server.pop(0)])
            while to_client:
                client.from_remote("s", [to_client.pop(0)])
        else:
            self.fail("gossip did not settle")
        self.assertEqual(server.table.get("k"), "v2")
        self.assertEqual(client.table.get("k"), "v2")


# Real sockets


async def settle(seconds: float) -> None:
    """Let the reactor run for C{seconds}."""
    await deferLater(reactor, seconds)


async def until(condition: Callable[[], bool], timeout: float = 1.5) -> None:
    """Run the reactor until C{condition} holds (failing after C{timeout} seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await settle(0.01)


class Tuples(dict[str, str]):
    """An on_tuple callback that keeps what it gets: key to last value."""

    def __call__(self, key: str, value: str) -> None:
        self[key] = value


class GossipSocketTests(TestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def node(
        self,
        bind: list[str] | None = None,
        connect: list[str] | None = None,
        client_timeout: float = 30.0,
    ) -> tuple[Gossip, Tuples]:
        tuples = Tuples()
        node = Gossip(
            reactor,
            self.context,
            tuples,
            bind=bind or [],
            connect=connect or [],
            ping_interval=0.05,
            client_timeout=client_timeout,
        )
        self.addCleanup(node.stop)
        node.start()
        return node, tuples

    def raw(self, kind: int, endpoint: str, bind: bool = False) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.addCleanup(sock.close, 0)
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
        return sock

    async def receive(self, sock: zmq.Socket[bytes], timeout: float = 1.0) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                if time.monotonic() > deadline:
                    raise AssertionError("nothing received in time") from None
                await settle(0.01)

    async def test_serverAndClients(self) -> None:
        """
        One server and two clients exchange tuples both ways, and a client
        that comes late gets every tuple at once.
        """
        server, server_got = self.node(bind=[ANY_TCP])
        self.assertEqual(len(server.bound), 1)
        self.assertTrue(server.bound[0].startswith("tcp://127.0.0.1:"))
        self.assertNotIn("*", server.bound[0])
        one, one_got = self.node(connect=server.bound)
        two, two_got = self.node(connect=server.bound)
        server.publish("S", "tcp://server")
        one.publish("A", "tcp://one")
        two.publish("B", "tcp://two")
        everything = {"S": "tcp://server", "A": "tcp://one", "B": "tcp://two"}
        await until(lambda: len(one.table) == len(two.table) == len(server.table) == 3)
        self.assertEqual(dict(one.table.items()), everything)
        self.assertEqual(dict(two.table.items()), everything)
        self.assertEqual(server_got, {"A": "tcp://one", "B": "tcp://two"})
        self.assertEqual(one_got, {"S": "tcp://server", "B": "tcp://two"})
        self.assertEqual(two_got, {"S": "tcp://server", "A": "tcp://one"})
        late, late_got = self.node(connect=server.bound)
        await until(lambda: len(late.table) == 3)
        self.assertEqual(late_got, everything)
        one.publish("A", "tcp://one-moved")
        await until(lambda: late_got["A"] == "tcp://one-moved" == two_got["A"])
        self.assertEqual(server.counters.malformed, 0)
        self.assertEqual(server.counters.invalid_sent, 0)

    async def test_bridge(self) -> None:
        """A node that is a server and a client of another server bridges tuples both ways."""
        top, _ = self.node(bind=[ANY_TCP])
        bridge, bridge_got = self.node(bind=[ANY_TCP], connect=top.bound)
        below, below_got = self.node(connect=bridge.bound)
        beside, beside_got = self.node(connect=top.bound)
        below.publish("below", "1")
        beside.publish("beside", "2")
        await until(lambda: "below" in beside_got and "beside" in below_got)
        self.assertEqual(bridge_got, {"below": "1", "beside": "2"})
        self.assertEqual(dict(top.table.items()), dict(bridge.table.items()))

    async def test_publishWithoutHelloGetsInvalid(self) -> None:
        """
        A raw DEALER that PUBLISHes without HELLO gets INVALID and its tuple
        is not stored; after HELLO it gets the table and is heard.
        """
        server, server_got = self.node(bind=[ANY_TCP])
        server.publish("S", "1")
        raw = self.raw(zmq.DEALER, server.bound[0])
        raw.send(encode(Publish("rogue", "x")))
        self.assertEqual(decode((await self.receive(raw))[0]), Invalid())
        self.assertIsNone(server.table.get("rogue"))
        self.assertEqual(server.counters.invalid_sent, 1)
        raw.send(encode(Hello()))
        self.assertEqual(decode((await self.receive(raw))[0]), Publish("S", "1"))
        raw.send(encode(Publish("rogue", "x")))
        self.assertEqual(decode((await self.receive(raw))[0]), Publish("rogue", "x"))  # the echo
        self.assertEqual(server_got, {"rogue": "x"})

    async def test_serverRestart(self) -> None:
        """
        When its server restarts, a client is told INVALID at its next PING,
        says HELLO again and republishes every tuple, and gets the new
        server's tuples.
        """
        first, _ = self.node(bind=[ANY_TCP])
        endpoint = first.bound[0]
        client, client_got = self.node(connect=[endpoint])
        client.publish("C", "1")
        await until(lambda: first.table.get("C") == "1")
        first.stop()
        second = await self.rebind(endpoint)
        second.publish("S2", "2")
        await until(lambda: second.table.get("C") == "1" and "S2" in client_got)
        self.assertGreaterEqual(client.counters.invalid_received, 1)
        self.assertGreaterEqual(second.counters.invalid_sent, 1)

    async def rebind(self, endpoint: str) -> Gossip:
        """A new server on C{endpoint}, once the old one's port is free again."""
        deadline = time.monotonic() + 1.0
        while True:
            try:
                return self.node(bind=[endpoint])[0]
            except zmq.ZMQError:
                if time.monotonic() > deadline:
                    raise
                await settle(0.02)

    async def test_garbageCountedAndIgnored(self) -> None:
        """
        Garbage frames, to a server and to a client, are dropped and counted,
        and both go on working.
        """
        server, _ = self.node(bind=[ANY_TCP])
        raw = self.raw(zmq.DEALER, server.bound[0])
        raw.send(b"garbage")
        raw.send_multipart([encode(Hello()), encode(Hello())])
        raw.send(b"\xaa\xa1\x06\x02\x00\x01")  # a ZRE PING
        await until(lambda: server.counters.malformed == 3)
        client, _ = self.node(connect=server.bound)
        client.publish("C", "1")
        await until(lambda: server.table.get("C") == "1")

        fake_server = self.raw(zmq.ROUTER, ANY_TCP, bind=True)
        endpoint = fake_server.getsockopt_string(zmq.LAST_ENDPOINT)
        victim, victim_got = self.node(connect=[endpoint])
        route, hello = await self.receive(fake_server)
        self.assertEqual(decode(hello), Hello())
        fake_server.send_multipart([route, b"\xaa\xa0\x02\x01\xff"])
        fake_server.send_multipart([route, encode(Publish("k", "v")), b"extra"])
        fake_server.send_multipart([route, encode(Publish("k", "v"))])
        await until(lambda: victim_got == {"k": "v"})
        self.assertEqual(victim.counters.malformed, 2)

    async def test_silentClientForgotten(self) -> None:
        """On real sockets: a client silent past client_timeout is forgotten, then INVALID."""
        server, _ = self.node(bind=[ANY_TCP], client_timeout=0.2)
        raw = self.raw(zmq.DEALER, server.bound[0])
        raw.send(encode(Hello()))
        await until(lambda: len(server.core.clients) == 1)
        await until(lambda: server.counters.expired == 1)
        raw.send(encode(Ping()))
        self.assertEqual(decode((await self.receive(raw))[0]), Invalid())

    async def test_pingingClientKept(self) -> None:
        """A Gossip client PINGs often enough that a server with a short timeout keeps it."""
        server, _ = self.node(bind=[ANY_TCP], client_timeout=0.2)
        client, _ = self.node(connect=server.bound)
        await until(lambda: len(server.core.clients) == 1)
        await settle(0.5)
        self.assertEqual(server.counters.expired, 0)
        self.assertEqual(client.counters.invalid_received, 0)
        self.assertIsNotNone(client.core.remote_last_heard(server.bound[0]))

    def test_stopCancelsTimers(self) -> None:
        """start() sets the PING and expiry timers on the clock; stop() cancels both."""
        clock = Clock()
        server = Gossip(reactor, self.context, Tuples(), bind=[ANY_TCP], clock=clock)
        client = Gossip(reactor, self.context, Tuples(), connect=["tcp://127.0.0.1:9"], clock=clock)
        self.addCleanup(server.stop)
        self.addCleanup(client.stop)
        server.start()
        client.start()
        self.assertEqual(len(clock.getDelayedCalls()), 2)  # the server's expiry, the client's PING
        server.stop()
        client.stop()
        server.stop()  # stopping twice is harmless
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_badEndpointCleansUp(self) -> None:
        """A bind that fails raises, leaving no socket open and no timer set."""
        clock = Clock()
        node = Gossip(reactor, self.context, Tuples(), bind=["bogus://x"], clock=clock)
        self.assertRaises(zmq.ZMQError, node.start)
        self.assertEqual(clock.getDelayedCalls(), [])
        self.assertEqual(node.bound, [])
