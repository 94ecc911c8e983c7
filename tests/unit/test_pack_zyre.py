"""
Tests for L{malamute_pack.pack.zyre}: L{Zyre} services on real tcp sockets
on loopback, in the real reactor, without beacons: they are told of each
other (C{node.discovered}) or find each other through gossip, then enter,
join, whisper, shout, leave and exit on stop; garbage on an inbox is
counted; a restarted node (same uuid) is seen to exit and enter again.
And the probe's (L{malamute_pack.pack.probe}) events and commands on a node.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable, Sequence

import zmq
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.pack.node import NodeEvents
from malamute_pack.pack.probe import (
    REFUSED_INTERVAL,
    ProbeCommands,
    ProbeEvents,
    ProbeRefusals,
    parse,
)
from malamute_pack.pack.zyre import Zyre, gossip_key
from malamute_pack.protocol import zre
from malamute_pack.transport.curve import KeyPair, LinkCurve
from malamute_pack.transport.zap import PACK_DOMAIN, KeyAllowList, ZapHandler
from tests.unit.test_pack_node import Recorder

ANY_TCP = "tcp://127.0.0.1:*"

Event = tuple[object, ...]


async def settle(seconds: float) -> None:
    """Let the reactor run for C{seconds}."""
    await deferLater(reactor, seconds)


async def until(condition: Callable[[], bool], timeout: float = 3.0) -> None:
    """Run the reactor until C{condition} holds (failing after C{timeout} seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await settle(0.01)


class ConfigTests(SynchronousTestCase):
    def test_needsEndpointOrInterface(self) -> None:
        """A node with neither an inbox endpoint nor a beacon interface is refused."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        self.assertRaises(ValueError, Zyre, reactor, context, Recorder())

    def test_defaultName(self) -> None:
        """The default name is the first six hex digits of the uuid, as zyre's."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        node = Zyre(reactor, context, Recorder(), uuid=bytes(range(16)), endpoint=ANY_TCP)
        self.assertEqual(node.node.name, "000102")

    def test_wildcardNeedsAddress(self) -> None:
        """An inbox bound on every address, with no interface to name one, is refused."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        node = Zyre(reactor, context, Recorder(), endpoint="tcp://0.0.0.0:*")
        with self.assertRaises(ValueError) as caught:
            node.startService()
        self.assertIn("binds every address", str(caught.exception))
        self.assertFalse(node.running)

    def test_gossipKey(self) -> None:
        """A node's gossip key is its uuid as 32 uppercase hex characters."""
        self.assertEqual(gossip_key(bytes(range(16))), "000102030405060708090A0B0C0D0E0F")


class ZyreSocketTests(TestCase):
    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def zyre(
        self, name: str, events: NodeEvents | None = None, **kwargs: object
    ) -> tuple[Zyre, Recorder]:
        recorder = Recorder()
        kwargs.setdefault("endpoint", ANY_TCP)
        node = Zyre(
            reactor,
            self.context,
            recorder if events is None else events,
            name=name,
            **kwargs,  # type: ignore[arg-type]
        )
        node.startService()

        def stop() -> None:
            if node.running:
                node.stopService()

        self.addCleanup(stop)
        return node, recorder

    async def test_conversation(self) -> None:
        """
        Two nodes told of each other enter each other, see joins (from the
        HELLO and later), whisper and shout both ways, see a leave, and one
        stopping makes the other see it exit.
        """
        a, a_events = self.zyre("a", groups=["early"])
        b, b_events = self.zyre("b")
        self.assertRegex(a.endpoint, r"^tcp://127\.0\.0\.1:[0-9]+$")
        a.node.discovered(b.uuid, b.endpoint)
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        self.assertEqual(b_events.events, [("enter", "a"), ("join", "a", "early")])
        self.assertEqual(a_events.events, [("enter", "b")])
        self.assertEqual(a.node.peers[b.uuid].endpoint, b.endpoint)
        del a_events.events[:], b_events.events[:]

        b.join("g")
        await until(lambda: "g" in a.node.peers[b.uuid].groups)
        self.assertTrue(a.whisper(b.uuid, [b"to b", b"two frames"]))
        self.assertTrue(b.whisper(a.uuid, [b"to a"]))
        self.assertEqual(a.shout("g", [b"shout to g"]), 1)
        self.assertEqual(b.shout("early", [b"shout to early"]), 1)
        await until(lambda: len(a_events.events) == 3 and len(b_events.events) == 2)
        self.assertEqual(
            a_events.events,
            [
                ("join", "b", "g"),
                ("whisper", "b", [b"to a"]),
                ("shout", "b", "early", [b"shout to early"]),
            ],
        )
        self.assertEqual(
            b_events.events,
            [("whisper", "a", [b"to b", b"two frames"]), ("shout", "a", "g", [b"shout to g"])],
        )
        del a_events.events[:], b_events.events[:]

        b.leave("g")
        await until(lambda: a_events.events == [("leave", "b", "g")])
        b.stopService()
        await until(lambda: a_events.events[1:] == [("exit", "b")])
        self.assertEqual(a.node.peers, {})

    async def test_gossip(self) -> None:
        """Two nodes find each other through gossip: one serves, the other is its client."""
        a, _ = self.zyre("a", gossip_bind=[ANY_TCP])
        assert a.gossip is not None
        b, _ = self.zyre("b", gossip_connect=a.gossip.bound)
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        assert b.gossip is not None
        self.assertEqual(b.gossip.table.get(gossip_key(a.uuid)), a.endpoint)

    async def test_gossipMeetsAgain(self) -> None:
        """
        With gossip only, two nodes that lost each other (a peer dropped, as
        after an expiry in a partition) link again, though gossip tells
        nothing new.
        """
        a, _ = self.zyre("a", gossip_bind=[ANY_TCP], regossip_interval=0.1)
        assert a.gossip is not None
        b, _ = self.zyre("b", gossip_connect=a.gossip.bound, regossip_interval=0.1)
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        a.node.departed(b.uuid)
        b.node.departed(a.uuid)
        self.assertEqual((a.node.peers, b.node.peers), ({}, {}))
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)

    async def test_pausedReading(self) -> None:
        """
        A node whose reading is paused gets nothing from its peers until it
        resumes, then everything, in order.
        """
        a, a_events = self.zyre("a")
        b, _ = self.zyre("b")
        a.node.discovered(b.uuid, b.endpoint)
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        a_events.take()
        a.pauseReading()
        self.assertTrue(b.whisper(a.uuid, [b"1"]))
        self.assertTrue(b.whisper(a.uuid, [b"2"]))
        await settle(0.2)
        self.assertEqual(a_events.take(), [])
        a.resumeReading()
        await until(lambda: len(a_events.events) == 2)
        self.assertEqual(a_events.take(), [("whisper", "b", [b"1"]), ("whisper", "b", [b"2"])])

    async def test_garbage(self) -> None:
        """Garbage on an inbox, from any routing id, is counted and changes nothing."""
        a, a_events = self.zyre("a")
        sock = self.context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        self.addCleanup(sock.close, 0)
        sock.setsockopt(zmq.IDENTITY, b"\x01" + bytes(16))
        sock.connect(a.endpoint)
        sock.send_multipart([b"garbage"])
        sock.send_multipart(zre.encode(zre.Whisper(1, (b"x",))))  # no HELLO first
        await until(lambda: a.node.counters.malformed == 1 and a.node.counters.not_ready == 1)
        self.assertEqual(a_events.events, [])

    def raw(self, kind: int) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        self.addCleanup(sock.close, 0)
        return sock

    async def test_restart(self) -> None:
        """
        A node killed without a GOODBYE and started again with the same
        uuid says HELLO on a new connection: it is seen to exit and enter
        again, at its new endpoint.
        """
        a, a_events = self.zyre("a")
        uuid = bytes(range(16))
        # The first incarnation: raw sockets speaking for a node "old".
        old_inbox = self.raw(zmq.ROUTER)
        old_inbox.bind(ANY_TCP)
        old_link = self.raw(zmq.DEALER)
        old_link.setsockopt(zmq.IDENTITY, b"\x01" + uuid)
        old_link.connect(a.endpoint)
        old_endpoint = old_inbox.getsockopt_string(zmq.LAST_ENDPOINT)
        old_link.send_multipart(zre.encode(zre.Hello(1, old_endpoint, (), 0, "old", ())))
        await until(lambda: a_events.events == [("enter", "old")])
        old_link.close(0)  # killed: its connections close, nothing said
        old_inbox.close(0)
        b, _ = self.zyre("new", uuid=uuid)
        b.node.discovered(a.uuid, a.endpoint)
        await until(lambda: a_events.events[1:] == [("exit", "old"), ("enter", "new")])
        await until(lambda: a.uuid in b.node.peers)
        self.assertEqual(a.node.peers[uuid].endpoint, b.endpoint)
        self.assertTrue(a.whisper(uuid, [b"hello again"]))
        self.assertEqual(a.node.counters.restarts, 1)

    async def test_stopClosesEverything(self) -> None:
        """After stopService the node has no peers and its inbox refuses nothing new."""
        a, _ = self.zyre("a")
        b, _ = self.zyre("b")
        a.node.discovered(b.uuid, b.endpoint)
        await until(lambda: b.uuid in a.node.peers)
        a.stopService()
        self.assertEqual(a.node.peers, {})
        self.assertFalse(a.node.running)


class CurveZyreTests(TestCase):
    """
    CURVE nodes on real sockets, each in a context of its own with its own
    ZAP handler (as each broker process has), admitting its listed keys.
    """

    def setUp(self) -> None:
        self.pairs: dict[str, KeyPair] = {}

    def key_pair(self, name: str) -> KeyPair:
        if name not in self.pairs:
            public, secret = zmq.curve_keypair()
            self.pairs[name] = KeyPair(public, secret)
        return self.pairs[name]

    def zyre(
        self, name: str, listed: Sequence[str] | None, zap: bool = True, **kwargs: object
    ) -> tuple[Zyre, Recorder, ZapHandler | None]:
        """
        A started node C{name} in its own context: CURVE admitting the keys
        of the nodes named C{listed}, or open for None; a ZAP handler unless
        C{zap} is false.
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        handler: ZapHandler | None = None
        curve: LinkCurve | None = None
        if listed is not None:
            allowed = KeyAllowList(
                "pack peer", {self.key_pair(n).public: n for n in listed}, "--pack-keys"
            )
            curve = LinkCurve(self.key_pair(name), allowed)
            if zap:
                handler = ZapHandler(reactor, context, {})
                handler.serve(PACK_DOMAIN, allowed)
                handler.startService()
        recorder = Recorder()
        kwargs.setdefault("endpoint", ANY_TCP)
        node = Zyre(
            reactor,
            context,
            recorder,
            name=name,
            curve=curve,
            **kwargs,  # type: ignore[arg-type]
        )
        node.startService()

        def stop() -> None:
            if node.running:
                node.stopService()
            if handler is not None:
                handler.stopService()
            context.term()

        self.addCleanup(stop)
        return node, recorder, handler

    def key(self, name: str) -> bytes:
        return self.key_pair(name).public

    async def test_listedNodesTalk(self) -> None:
        """
        Two CURVE nodes that list each other enter each other (each HELLO
        naming its key) and whisper both ways.
        """
        a, a_events, _ = self.zyre("a", ["b"])
        b, b_events, _ = self.zyre("b", ["a"])
        a.node.discovered(b.uuid, b.endpoint, self.key("b"))
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        self.assertEqual(b.node.peers[a.uuid].headers["X-PUBLICKEY"], self.key("a").decode())
        self.assertEqual(a.node.peers[b.uuid].key, self.key("b"))
        self.assertTrue(a.whisper(b.uuid, [b"to b"]))
        self.assertTrue(b.whisper(a.uuid, [b"to a"]))
        await until(lambda: len(a_events.events) == 2 and len(b_events.events) == 2)
        self.assertEqual(a_events.events[-1], ("whisper", "b", [b"to a"]))
        self.assertEqual(b_events.events[-1], ("whisper", "a", [b"to b"]))

    async def test_curveGossip(self) -> None:
        """
        CURVE gossip: a client given the server's ENDPOINT|KEY learns the
        other node's ENDPOINT|KEY tuple, and the two nodes meet.
        """
        a, _, _ = self.zyre("a", ["b"], gossip_bind=[ANY_TCP])
        assert a.gossip is not None
        server = f"{a.gossip.bound[0]}|{self.key('a').decode()}"
        b, _, _ = self.zyre("b", ["a"], gossip_connect=[server])
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        assert b.gossip is not None
        self.assertEqual(
            b.gossip.table.get(gossip_key(a.uuid)), f"{a.endpoint}|{self.key('a').decode()}"
        )

    async def test_strangerGetsNothing(self) -> None:
        """
        A stranger (its own key, not listed) that lists our key and links to
        us is refused by our ZAP handler, never enters, and is never linked
        to; its gossip is refused too.
        """
        a, a_events, zap = self.zyre("a", ["b"], gossip_bind=[ANY_TCP])
        assert zap is not None and a.gossip is not None
        server = f"{a.gossip.bound[0]}|{self.key('a').decode()}"
        s, s_events, _ = self.zyre("s", ["a"], gossip_connect=[server])
        s.node.discovered(a.uuid, a.endpoint, self.key("a"))
        a.node.discovered(s.uuid, s.endpoint, self.key("s"))
        await until(lambda: zap.counters["pack peer"].refused >= 2)
        await settle(0.3)
        self.assertEqual((a.node.peers, s.node.peers), ({}, {}))
        self.assertEqual((a_events.events, s_events.events), ([], []))
        self.assertEqual(a.node.counters.not_listed, 1)
        self.assertIsNone(a.gossip.table.get(gossip_key(s.uuid)))

    async def test_openNodeAndCurveNodeNeverMeet(self) -> None:
        """An open node and a CURVE node told of each other never enter each other."""
        a, _, _ = self.zyre("a", ["b"])
        o, _, _ = self.zyre("o", None)
        a.node.discovered(o.uuid, o.endpoint, None)
        o.node.discovered(a.uuid, a.endpoint, None)
        await settle(0.3)
        self.assertEqual((a.node.peers, o.node.peers), ({}, {}))
        self.assertEqual(a.node.counters.no_key, 1)

    async def test_removedKeyDropped(self) -> None:
        """
        A key removed from the list (a SIGHUP reload replaces it) loses its
        peer at once; what the peer still sends on its connection is
        dropped, and it does not come back.
        """
        a, a_events, _ = self.zyre("a", ["b"])
        b, _, _ = self.zyre("b", ["a"])
        a.node.discovered(b.uuid, b.endpoint, self.key("b"))
        await until(lambda: b.uuid in a.node.peers and a.uuid in b.node.peers)
        a_events.take()
        assert a.curve is not None
        a.curve.allowed.replace({})
        self.assertEqual((a.node.peers, a_events.take()), ({}, [("exit", "b")]))
        b.whisper(a.uuid, [b"still here"])
        b.node.discovered(a.uuid, a.endpoint, self.key("a"))
        a.node.discovered(b.uuid, b.endpoint, self.key("b"))
        await settle(0.3)
        self.assertEqual((a.node.peers, a_events.take()), ({}, []))

    async def test_noZapHandlerAdmitsNobody(self) -> None:
        """
        A CURVE inbox whose context has no ZAP handler admits nobody (ZAP's
        domain is enforced): a missing handler fails closed.
        """
        a, _, zap = self.zyre("a", ["b"], zap=False)
        self.assertIsNone(zap)
        b, _, _ = self.zyre("b", ["a"])
        b.node.discovered(a.uuid, a.endpoint, self.key("a"))
        await settle(0.5)
        self.assertEqual((a.node.peers, b.node.peers), ({}, {}))


class ProbeTests(TestCase):
    """The probe's events and commands, on a real node (without its stdio)."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def start(self, zyre: Zyre) -> Zyre:
        zyre.startService()
        self.addCleanup(zyre.stopService)
        return zyre

    async def test_eventsAndCommands(self) -> None:
        """
        Events come out as dicts naming the peer; shout, whisper, join,
        leave and peers act on the node; a bad command is an ERROR; quit
        calls quit.
        """
        said: list[dict[str, object]] = []
        quits: list[bool] = []
        probe = self.start(
            Zyre(reactor, self.context, ProbeEvents(said.append), name="probe", endpoint=ANY_TCP)
        )
        other_events = Recorder()
        other = self.start(
            Zyre(
                reactor, self.context, other_events, name="other", endpoint=ANY_TCP,
                groups=["G"], headers={"K": "V"},
            )
        )  # fmt: skip
        commands = ProbeCommands(probe, said.append, lambda: quits.append(True))
        probe.node.discovered(other.uuid, other.endpoint)
        await until(lambda: len(said) == 2)
        uuid = other.uuid.hex()
        self.assertEqual(
            said,
            [
                {"event": "ENTER", "uuid": uuid, "name": "other",
                 "endpoint": other.endpoint, "headers": {"K": "V"}},
                {"event": "JOIN", "uuid": uuid, "name": "other", "group": "G"},
            ],
        )  # fmt: skip
        del said[:]
        commands.run("shout G hello there")
        commands.run(f"whisper {uuid} by uuid")
        commands.run("whisper other by name")
        commands.run("join H")
        commands.run("peers")
        commands.run("whisper nobody x")
        commands.run("dance")
        commands.run("")
        await until(lambda: len(other_events.events) == 5)
        self.assertEqual(
            other_events.events[1:],
            [
                ("shout", "probe", "G", [b"hello there"]),
                ("whisper", "probe", [b"by uuid"]),
                ("whisper", "probe", [b"by name"]),
                ("join", "probe", "H"),
            ],
        )
        self.assertEqual(
            said,
            [
                {"event": "SHOUTED", "group": "G", "peers": 1},
                {"event": "PEER", "uuid": uuid, "name": "other",
                 "endpoint": other.endpoint, "groups": ["G"]},
                {"event": "ERROR", "message": "no peer 'nobody'"},
                {"event": "ERROR", "message": "unknown command 'dance'"},
            ],
        )  # fmt: skip
        other.whisper(probe.uuid, [b"\xffnot utf-8"])
        await until(lambda: len(said) == 5)
        self.assertEqual(said[-1]["content"], ["\\xffnot utf-8"])
        commands.run("quit")
        self.assertEqual(quits, [True])

    def test_refusals(self) -> None:
        """
        A CURVE probe reports each node it does not let in as REFUSED, with
        the reason, uuid, endpoint and key, once a minute at most per node.
        """
        events: list[dict[str, object]] = []
        clock = Clock()
        refusals = ProbeRefusals(events.append, clock)
        for _ in range(3):
            refusals("not listed", b"\x01" * 16, "tcp://10.0.0.9:1", b"K" * 40)
        refusals("no key", b"\x02" * 16, "tcp://10.0.0.8:2", None)
        clock.advance(REFUSED_INTERVAL)
        refusals("not listed", b"\x01" * 16, "tcp://10.0.0.9:1", b"K" * 40)
        self.assertEqual(
            [(e["event"], e["why"], e["key"]) for e in events],
            [
                ("REFUSED", "not listed", "K" * 40),
                ("REFUSED", "no key", None),
                ("REFUSED", "not listed", "K" * 40),
            ],
        )
        self.assertEqual(events[1]["endpoint"], "tcp://10.0.0.8:2")

    def test_parse(self) -> None:
        """The probe needs a beacon interface or an endpoint; headers are KEY=VALUE."""
        options = parse(["--beacon", "eth0", "--group", "A", "--group", "B", "--header", "K=V"])
        self.assertEqual(
            (options.beacon, options.group, options.header), ("eth0", ["A", "B"], ["K=V"])
        )
        with contextlib.redirect_stderr(io.StringIO()) as usage:
            self.assertRaises(SystemExit, parse, [])
            self.assertRaises(SystemExit, parse, ["--beacon", "eth0", "--header", "novalue"])
        self.assertIn("give --beacon IFACE", usage.getvalue())
