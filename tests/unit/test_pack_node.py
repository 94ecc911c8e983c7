"""
Tests for L{malamute_pack.pack.node}: ZRE nodes wired to each other by
in-memory links (an in-memory L{Link}: messages wait in a queue until the
test delivers them into the other node's C{receive}), with time from a
L{Clock}.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.pack.node import PUBLIC_KEY_HEADER, Link, ZreNode, ZrePeer
from malamute_pack.protocol import zre

Event = tuple[object, ...]


class MemoryLink:
    """
    A L{Link} that queues messages for the network to deliver; with CURVE,
    the server's key it expects at C{endpoint}.
    """

    def __init__(
        self, network: Network, sender: bytes, endpoint: str, server_key: bytes | None = None
    ) -> None:
        self.network = network
        self.identity = b"\x01" + sender
        self.endpoint = endpoint
        self.server_key = server_key
        self.full = False
        self.closed = False
        self.sent: list[list[bytes]] = []

    def send(self, frames: Sequence[bytes]) -> bool:
        assert not self.closed, "sent on a closed link"
        if self.full:
            return False
        self.sent.append(list(frames))
        self.network.queue.append((self, list(frames)))
        return True

    def close(self) -> None:
        self.closed = True


class Network:
    """
    Nodes by endpoint, and the messages on their way to them. A CURVE
    node's inbox takes a message only from a link that expects its key and
    whose sender's key it lists (as CURVE's handshake and ZAP would), and
    hands over the sender's key with it; a node without CURVE takes no
    link that expects a key.
    """

    def __init__(self) -> None:
        self.nodes: dict[str, ZreNode] = {}
        self.queue: deque[tuple[MemoryLink, list[bytes]]] = deque()
        self.links: list[MemoryLink] = []
        self.refused: set[str] = set()  # endpoints a connect fails for
        self.keys: dict[bytes, bytes] = {}  # a CURVE node's uuid: its public key
        self.lists: dict[bytes, set[bytes]] = {}  # a CURVE node's uuid: the keys it lists
        self.handshakes_failed = 0

    def connector(self, uuid: bytes) -> MemoryConnect:
        return MemoryConnect(self, uuid)

    def flush(self) -> None:
        """Deliver every message, and those they cause, until none is left."""
        while self.queue:
            link, frames = self.queue.popleft()
            node = self.nodes.get(link.endpoint)
            if node is None:
                continue
            sender_key = self.keys.get(link.identity[1:])
            if link.server_key != node.public_key:
                self.handshakes_failed += 1  # CURVE against NULL, or the wrong server key
            elif node.curve and sender_key not in self.lists[node.uuid]:
                self.handshakes_failed += 1  # ZAP refuses the sender's key
            else:
                node.receive(link.identity, frames, sender_key)

    def link(self, sender: ZreNode, endpoint: str) -> MemoryLink:
        """The open link from C{sender} to C{endpoint}."""
        (link,) = [
            link
            for link in self.links
            if link.identity[1:] == sender.uuid and link.endpoint == endpoint and not link.closed
        ]
        return link


class MemoryConnect:
    def __init__(self, network: Network, uuid: bytes) -> None:
        self.network = network
        self.uuid = uuid

    def __call__(self, endpoint: str, server_key: bytes | None = None) -> Link:
        if endpoint in self.network.refused:
            raise ValueError(f"cannot connect to {endpoint}")
        link = MemoryLink(self.network, self.uuid, endpoint, server_key)
        self.network.links.append(link)
        return link


class Recorder:
    """Every event a node reports, as (kind, peer name, ...)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def peer_entered(self, peer: ZrePeer) -> None:
        self.events.append(("enter", peer.name))

    def peer_exited(self, peer: ZrePeer) -> None:
        self.events.append(("exit", peer.name))

    def peer_joined(self, peer: ZrePeer, group: str) -> None:
        self.events.append(("join", peer.name, group))

    def peer_left(self, peer: ZrePeer, group: str) -> None:
        self.events.append(("leave", peer.name, group))

    def whispered(self, peer: ZrePeer, content: list[bytes]) -> None:
        self.events.append(("whisper", peer.name, content))

    def shouted(self, peer: ZrePeer, group: str, content: list[bytes]) -> None:
        self.events.append(("shout", peer.name, group, content))

    def peer_evasive(self, peer: ZrePeer) -> None:
        self.events.append(("evasive", peer.name))

    def take(self) -> list[Event]:
        events, self.events = self.events, []
        return events


def _uuid(name: str) -> bytes:
    return name.encode().ljust(16, b"-")


def curve_key(name: str) -> bytes:
    """A stand-in for a node's CURVE public key (Z85 is 40 ASCII characters)."""
    return f"KEY-{name}".encode().ljust(40, b".")


class ListedKeys:
    """A L{PeerKeys}: a set of keys that the test may change."""

    def __init__(self, keys: set[bytes]) -> None:
        self.keys = keys

    def admits(self, key: bytes) -> bool:
        return key in self.keys


class NodeCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.network = Network()
        self.recorders: dict[str, Recorder] = {}
        self.strangers: list[tuple[str, bytes, str, bytes | None]] = []

    def node(
        self,
        name: str,
        uuid: bytes | None = None,
        endpoint: str | None = None,
        start: bool = True,
        listed: set[bytes] | None = None,
    ) -> ZreNode:
        """
        A node named C{name} at C{mem://name}, started, on the network; a
        CURVE node listing the keys C{listed} if given (its own key is
        C{KEY-name}, padded to 40 bytes).
        """
        uuid = _uuid(name) if uuid is None else uuid
        endpoint = f"mem://{name}" if endpoint is None else endpoint
        recorder = self.recorders[name] = Recorder()
        public_key: bytes | None = None
        peer_keys: ListedKeys | None = None
        if listed is not None:
            public_key = self.network.keys[uuid] = curve_key(name)
            self.network.lists[uuid] = listed
            peer_keys = ListedKeys(listed)
        node = ZreNode(
            self.clock,
            uuid,
            name,
            endpoint,
            self.network.connector(uuid),
            recorder,
            headers={"X-ROLE": "broker"},
            public_key=public_key,
            peer_keys=peer_keys,
            stranger=lambda *args: self.strangers.append(args),
        )
        self.network.nodes[endpoint] = node
        if start:
            node.start()
            self.addCleanup(node.stop)
        return node

    def events(self, name: str) -> list[Event]:
        return self.recorders[name].take()

    def pair(self) -> tuple[ZreNode, ZreNode]:
        """Two nodes that have entered each other, their events taken."""
        a, b = self.node("a"), self.node("b")
        a.discovered(b.uuid, b.endpoint)
        self.network.flush()
        self.events("a"), self.events("b")
        return a, b

    def next_sequence(self, sender: ZreNode, receiver: ZreNode) -> int:
        """The sequence number C{sender}'s next message to C{receiver} carries."""
        return (sender.peers[receiver.uuid].sent_sequence + 1) & 0xFFFF


class DiscoveryTests(NodeCase):
    def test_enter(self) -> None:
        """
        A node that discovers another links to it and says HELLO; the other
        links back: each enters the other once, with its name and headers.
        """
        a, b = self.node("a"), self.node("b")
        a.discovered(b.uuid, b.endpoint)
        self.assertEqual(a.peers, {})  # not before its HELLO
        self.network.flush()
        self.assertEqual(self.events("a"), [("enter", "b")])
        self.assertEqual(self.events("b"), [("enter", "a")])
        peer = a.peers[b.uuid]
        self.assertEqual(
            (peer.name, peer.endpoint, peer.headers), ("b", "mem://b", {"X-ROLE": "broker"})
        )
        self.assertEqual(list(b.peers), [a.uuid])

    def test_helloCarriesGroupsAndStatus(self) -> None:
        """
        HELLO carries our groups and status: a peer joined to groups
        before we meet it enters and then joins each of them.
        """
        a, b = self.node("a"), self.node("b")
        b.join("x")
        b.join("y")
        b.leave("y")
        b.join("z")
        a.discovered(b.uuid, b.endpoint)
        self.network.flush()
        self.assertEqual(self.events("a"), [("enter", "b"), ("join", "b", "x"), ("join", "b", "z")])
        self.assertEqual(a.peers[b.uuid].status, 4)
        b.join("w")  # status 5, as a expects
        self.network.flush()
        self.assertEqual(self.events("a"), [("join", "b", "w")])
        self.assertEqual(a.peers[b.uuid].groups, {"x", "z", "w"})

    def test_helloBytes(self) -> None:
        """The first message on a link is a HELLO numbered 1 with all we are."""
        a, b = self.node("a"), self.node("b")
        a.join("g")
        a.discovered(b.uuid, b.endpoint)
        link = self.network.link(a, b.endpoint)
        self.assertEqual(
            zre.decode(link.sent[0]),
            zre.Hello(1, "mem://a", ("g",), 1, "a", (("X-ROLE", "broker"),)),
        )

    def test_helloConnectsBack(self) -> None:
        """A HELLO from a node we never heard of makes us link to the endpoint it names."""
        a, b = self.node("a"), self.node("b")
        b.discovered(a.uuid, a.endpoint)
        self.network.flush()
        self.assertIn(b.uuid, a.peers)
        self.assertIn(a.uuid, b.peers)
        self.network.link(a, b.endpoint)

    def test_knownPeerRefreshed(self) -> None:
        """Discovering a known peer again at the same endpoint makes no new link."""
        a, b = self.pair()
        links = len(self.network.links)
        self.clock.advance(3)
        a.discovered(b.uuid, b.endpoint)
        self.network.flush()
        self.assertEqual(len(self.network.links), links)
        self.assertEqual(a.peers[b.uuid].last_heard, 3)
        self.assertEqual(self.events("a"), [])

    def test_neverOurselves(self) -> None:
        """Our own uuid, or another at our own endpoint, is not linked to."""
        a = self.node("a")
        a.discovered(a.uuid, "mem://elsewhere")
        a.discovered(_uuid("ghost"), a.endpoint)
        self.assertEqual(self.network.links, [])

    def test_threeNodes(self) -> None:
        """Three nodes meet in pairs: each enters the two others once."""
        a, b, c = self.node("a"), self.node("b"), self.node("c")
        a.discovered(b.uuid, b.endpoint)
        a.discovered(c.uuid, c.endpoint)
        b.discovered(c.uuid, c.endpoint)
        c.discovered(a.uuid, a.endpoint)  # both sides discover: still one peer each
        self.network.flush()
        for node, others in ((a, "bc"), (b, "ac"), (c, "ab")):
            self.assertEqual({p.name for p in node.peers.values()}, set(others))
            self.assertEqual(sorted(self.events(node.name)), [("enter", n) for n in others])

    def test_departed(self) -> None:
        """A port-0 beacon makes the peer exit at once."""
        a, b = self.pair()
        a.departed(b.uuid)
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(a.peers, {})

    def test_badEndpoint(self) -> None:
        """An endpoint the connect function refuses is counted, nothing else."""
        a = self.node("a")
        self.network.refused.add("mem://bad")
        a.discovered(_uuid("x"), "mem://bad")
        self.assertEqual(a.counters.bad_endpoints, 1)

    def test_pendingExpires(self) -> None:
        """A node linked to that never says HELLO is forgotten after C{expired}."""
        a = self.node("a")
        a.discovered(_uuid("x"), "mem://nowhere")
        (link,) = self.network.links
        self.clock.advance(31)
        self.assertTrue(link.closed)
        self.assertEqual(a.counters.pending_expired, 1)
        self.assertEqual(self.events("a"), [])


class GroupTests(NodeCase):
    def test_joinAndLeave(self) -> None:
        """A JOIN and a LEAVE reach every peer, with the status after each."""
        a, b = self.pair()
        a.join("g")
        a.join("g")  # already in: nothing sent
        self.network.flush()
        self.assertEqual(self.events("b"), [("join", "a", "g")])
        a.leave("g")
        a.leave("g")
        self.network.flush()
        self.assertEqual(self.events("b"), [("leave", "a", "g")])
        self.assertEqual(a.status, 2)
        self.assertEqual(b.peers[a.uuid].status, 2)

    def test_joinReachesPendingPeers(self) -> None:
        """
        A peer that has our HELLO but has not answered gets our JOIN too, so
        its count of our status stays in step.
        """
        a, b = self.node("a"), self.node("b")
        a.discovered(b.uuid, b.endpoint)
        a.join("g")  # before b's HELLO reached a
        self.network.flush()
        self.assertEqual(self.events("b"), [("enter", "a"), ("join", "a", "g")])
        self.assertIn(a.uuid, b.peers)

    def test_statusWraps(self) -> None:
        """The status byte wraps from 255 to 0 on both sides."""
        a, b = self.pair()
        for i in range(300):
            a.join(f"g{i}")
        self.network.flush()
        self.assertEqual(a.status, 300 % 256)
        self.assertEqual(b.peers[a.uuid].status, 300 % 256)
        self.assertIn(a.uuid, b.peers)

    def test_statusMismatchDrops(self) -> None:
        """A JOIN whose status is not our count for the peer plus one drops the peer."""
        a, b = self.pair()
        join = zre.Join(self.next_sequence(b, a), "g", b.status + 2)
        a.receive(b"\x01" + b.uuid, zre.encode(join))
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(a.counters.status_mismatches, 1)

    def test_longGroupRefused(self) -> None:
        """A group name over 255 bytes is refused before anything changes."""
        a = self.node("a")
        self.assertRaises(ValueError, a.join, "g" * 256)
        self.assertEqual((a.groups, a.status), (set(), 0))


class MessageTests(NodeCase):
    def test_whisper(self) -> None:
        """A whisper reaches the one peer, content frames intact, both ways."""
        a, b = self.pair()
        self.assertTrue(a.whisper(b.uuid, [b"hello", b""]))
        self.assertTrue(b.whisper(a.uuid, [b"back"]))
        self.network.flush()
        self.assertEqual(self.events("b"), [("whisper", "a", [b"hello", b""])])
        self.assertEqual(self.events("a"), [("whisper", "b", [b"back"])])

    def test_whisperUnknown(self) -> None:
        """Whispering to a peer not in C{peers} raises KeyError."""
        a = self.node("a")
        self.assertRaises(KeyError, a.whisper, _uuid("x"), [b"x"])

    def test_shout(self) -> None:
        """A shout reaches the peers in the group and no others; it says how many."""
        a, b, c = self.node("a"), self.node("b"), self.node("c")
        b.join("g")
        a.discovered(b.uuid, b.endpoint)
        a.discovered(c.uuid, c.endpoint)
        self.network.flush()
        for name in "abc":
            self.events(name)
        self.assertEqual(a.shout("g", [b"all", b"of you"]), 1)
        self.assertEqual(a.shout("none", [b"x"]), 0)
        self.network.flush()
        self.assertEqual(self.events("b"), [("shout", "a", "g", [b"all", b"of you"])])
        self.assertEqual(self.events("c"), [])

    def test_ping(self) -> None:
        """A PING is answered with a PING_OK."""
        a, b = self.pair()
        a.receive(b"\x01" + b.uuid, zre.encode(zre.Ping(self.next_sequence(b, a))))
        link = self.network.link(a, b.endpoint)
        self.assertEqual(zre.decode(link.sent[-1]), zre.PingOk(link_sequence(link)))

    def test_goodbye(self) -> None:
        """A peer that stops says GOODBYE: it exits at once; stopping reports nothing."""
        a, b = self.pair()
        b.stop()
        self.network.flush()
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(self.events("b"), [])
        self.assertEqual((a.peers, b.peers), ({}, {}))
        self.assertTrue(
            all(link.closed for link in self.network.links if link.identity[1:] == b.uuid)
        )

    def test_stoppedHearsNothing(self) -> None:
        """A stopped node ignores what arrives and what is discovered."""
        a, b = self.pair()
        a.stop()
        b.whisper(a.uuid, [b"x"])
        self.network.flush()
        a.discovered(_uuid("c"), "mem://c")
        self.assertEqual(self.events("a"), [])


def link_sequence(link: MemoryLink) -> int:
    """The sequence number of the last message sent on C{link}."""
    return zre.decode(link.sent[-1]).sequence


class SequenceTests(NodeCase):
    def test_numberedFromOne(self) -> None:
        """A link's messages are numbered 1 (HELLO), 2, 3..."""
        a, b = self.pair()
        a.whisper(b.uuid, [b"x"])
        a.join("g")
        link = self.network.link(a, b.endpoint)
        self.assertEqual([zre.decode(f).sequence for f in link.sent], [1, 2, 3])

    def test_gapDrops(self) -> None:
        """A message out of sequence drops the peer."""
        a, b = self.pair()
        a.receive(b"\x01" + b.uuid, zre.encode(zre.Whisper(self.next_sequence(b, a) + 1, ())))
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(a.counters.sequence_gaps, 1)

    def test_helloNotOneDrops(self) -> None:
        """A HELLO not numbered 1 is a gap: the peer is dropped, not entered."""
        a, b = self.pair()
        hello = zre.Hello(2, "mem://b", (), 0, "b", ())
        a.receive(b"\x01" + b.uuid, zre.encode(hello))
        self.assertEqual(self.events("a"), [("exit", "b")])
        a.receive(b"\x01" + _uuid("c"), zre.encode(hello))
        self.assertEqual((a.counters.sequence_gaps, list(a.peers)), (2, []))

    def test_wraps(self) -> None:
        """After 65535 the sequence wraps to 0; the receiver follows."""
        a, b = self.pair()
        for _ in range(65537):  # the HELLO was 1: these are 2..65535, 0, 1, 2
            self.assertTrue(a.whisper(b.uuid, [b""]))
        link = self.network.link(a, b.endpoint)
        self.assertEqual([link_sequence(link)], [2])
        self.assertEqual([zre.decode(f).sequence for f in link.sent[65534:]], [65535, 0, 1, 2])
        self.network.flush()
        self.assertEqual(len(self.events("b")), 65537)
        self.assertEqual(b.counters.sequence_gaps, 0)
        self.assertIn(a.uuid, b.peers)

    def test_pyreWrapAccepted(self) -> None:
        """pyre's wrap from 65534 to 0 is accepted and counted, not a gap."""
        a, b = self.pair()
        identity = b"\x01" + b.uuid
        a.peers[b.uuid].want_sequence = 65533
        for sequence in (65534, 0, 1):
            a.receive(identity, zre.encode(zre.Whisper(sequence, (b"p",))))
        self.assertEqual(self.events("a"), [("whisper", "b", [b"p"])] * 3)
        self.assertEqual((a.counters.sequence_quirks, a.counters.sequence_gaps), (1, 0))

    def test_restartByHello(self) -> None:
        """
        A HELLO from a peer already entered means it restarted: it exits
        and enters again, and we link to it anew.
        """
        a, b = self.pair()
        b.stop()
        self.network.queue.clear()  # its GOODBYE was lost
        b2 = self.node("b", uuid=b.uuid)
        b2.discovered(a.uuid, a.endpoint)
        self.network.flush()
        self.assertEqual(self.events("a"), [("exit", "b"), ("enter", "b")])
        self.assertEqual(self.events("b"), [("enter", "a")])
        self.assertEqual(a.counters.restarts, 1)
        a.whisper(b.uuid, [b"again"])
        self.network.flush()
        self.assertEqual(self.events("b"), [("whisper", "a", [b"again"])])

    def test_restartAtNewEndpoint(self) -> None:
        """A known peer discovered at a new endpoint restarted: exit, link, enter."""
        a, b = self.pair()
        b.stop()
        self.network.queue.clear()
        b2 = self.node("b2", uuid=b.uuid)
        a.discovered(b.uuid, b2.endpoint)
        self.network.flush()
        self.assertEqual(self.events("a"), [("exit", "b"), ("enter", "b2")])
        self.assertEqual(a.peers[b.uuid].endpoint, "mem://b2")

    def test_newUuidAtKnownEndpoint(self) -> None:
        """A new uuid at a known peer's endpoint: the old peer exits."""
        a, b = self.pair()
        b.stop()
        self.network.queue.clear()
        self.node("b", uuid=_uuid("b-again"))
        a.discovered(_uuid("b-again"), "mem://b")
        self.network.flush()
        self.assertEqual(self.events("a"), [("exit", "b"), ("enter", "b")])


class BadInputTests(NodeCase):
    def test_wrongIdentity(self) -> None:
        """Routing ids other than 0x01 + 16 bytes are dropped and counted."""
        a, b = self.pair()
        hello = zre.encode(zre.Hello(1, "mem://x", (), 0, "x", ()))
        for identity in (b"\x02" + b.uuid, b"\x01" + b.uuid[:15], b"", b"\x01" + a.uuid):
            a.receive(identity, hello)
        self.assertEqual(a.counters.unknown_identity, 4)
        self.assertEqual(self.events("a"), [])
        self.assertEqual(list(a.peers), [b.uuid])

    def test_notReady(self) -> None:
        """Messages other than HELLO from a node with no HELLO are dropped and counted."""
        a = self.node("a")
        a.receive(b"\x01" + _uuid("x"), zre.encode(zre.Whisper(1, (b"x",))))
        self.assertEqual((a.counters.not_ready, self.events("a")), (1, []))

    def test_malformed(self) -> None:
        """Frames that do not decode are dropped and counted."""
        a, b = self.pair()
        a.receive(b"\x01" + b.uuid, [b"garbage"])
        self.assertEqual(a.counters.malformed, 1)
        self.assertIn(b.uuid, a.peers)

    @settings(max_examples=200)
    @given(st.binary(min_size=17, max_size=17), st.lists(st.binary(max_size=40), max_size=3))
    def test_arbitraryNeverRaises(self, identity: bytes, frames: list[bytes]) -> None:
        """Arbitrary identities and frames never raise out of receive."""
        node = ZreNode(
            Clock(), _uuid("a"), "a", "mem://a", Network().connector(_uuid("a")), Recorder()
        )
        node.start()
        node.receive(identity, frames)
        node.receive(b"\x01" + identity[1:], frames)
        node.stop()


class TimerTests(NodeCase):
    def test_evasiveThenExpired(self) -> None:
        """
        A peer silent for 5 s is reported evasive and PINGed, once; silent
        for 30 s it exits and is counted.
        """
        a, b = self.pair()
        del self.network.nodes[b.endpoint]  # b hears nothing and says nothing
        self.clock.advance(4)
        self.assertEqual(self.events("a"), [])
        self.clock.advance(1)
        self.assertEqual(self.events("a"), [("evasive", "b")])
        link = self.network.link(a, b.endpoint)
        self.assertIsInstance(zre.decode(link.sent[-1]), zre.Ping)
        self.clock.pump([1] * 24)
        self.assertEqual(self.events("a"), [])
        self.clock.advance(1)
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(a.counters.peers_expired, 1)
        self.assertTrue(link.closed)

    def test_pingKeepsAlive(self) -> None:
        """A live peer answers the PING: it is never expired."""
        a, b = self.pair()
        for _ in range(60):
            self.clock.advance(1)
            self.network.flush()
        self.assertIn(b.uuid, a.peers)
        self.assertIn(a.uuid, b.peers)
        self.assertIn(("evasive", "b"), self.events("a"))

    def test_anyMessageRefreshes(self) -> None:
        """Any message from a peer restarts its silence."""
        a, b = self.pair()
        self.clock.advance(4)
        b.whisper(a.uuid, [b"x"])
        self.network.flush()
        self.clock.advance(4)
        self.assertEqual(self.events("a"), [("whisper", "b", [b"x"])])
        self.clock.advance(1)
        self.assertEqual(self.events("a"), [("evasive", "b")])


class FlowControlTests(NodeCase):
    def test_fullLinkWhisper(self) -> None:
        """
        A whisper a full link refuses returns False, uses no sequence number
        and keeps the peer; once there is room, the next one arrives in order.
        """
        a, b = self.pair()
        link = self.network.link(a, b.endpoint)
        link.full = True
        self.assertFalse(a.whisper(b.uuid, [b"lost"]))
        self.assertEqual(a.shout("g", [b"none"]), 0)
        self.assertIn(b.uuid, a.peers)
        link.full = False
        self.assertTrue(a.whisper(b.uuid, [b"retried"]))
        self.network.flush()
        self.assertEqual(self.events("b"), [("whisper", "a", [b"retried"])])
        self.assertEqual(b.counters.sequence_gaps, 0)
        self.assertEqual(a.counters.sends_refused, 1)

    def test_fullLinkShout(self) -> None:
        """A shout counts only the peers whose links took it."""
        a, b, c = self.node("a"), self.node("b"), self.node("c")
        b.join("g")
        c.join("g")
        a.discovered(b.uuid, b.endpoint)
        a.discovered(c.uuid, c.endpoint)
        self.network.flush()
        self.network.link(a, b.endpoint).full = True
        self.assertEqual(a.shout("g", [b"x"]), 1)
        self.assertEqual(a.counters.sends_refused, 1)
        self.assertEqual(len(a.peers), 2)

    def test_fullLinkJoinDrops(self) -> None:
        """A JOIN a full link refuses drops that peer, as zyre does."""
        a, b = self.pair()
        self.network.link(a, b.endpoint).full = True
        a.join("g")
        self.assertEqual(self.events("a"), [("exit", "b")])
        self.assertEqual(a.counters.links_lost, 1)

    def test_fullLinkPingDrops(self) -> None:
        """A PING a full link refuses drops that peer, without an evasive event."""
        a, b = self.pair()
        self.network.link(a, b.endpoint).full = True
        self.clock.advance(5)
        self.assertEqual(self.events("a"), [("exit", "b")])


class CurveTests(NodeCase):
    """CURVE nodes (RFC 43): only listed keys become peers."""

    def curve_pair(self) -> tuple[ZreNode, ZreNode]:
        """Two CURVE nodes that list each other and have entered each other."""
        a = self.node("a", listed={curve_key("b")})
        b = self.node("b", listed={curve_key("a")})
        a.discovered(b.uuid, b.endpoint, curve_key("b"))
        self.network.flush()
        self.events("a"), self.events("b")
        return a, b

    def test_listedKeysEnter(self) -> None:
        """
        Two CURVE nodes that list each other enter each other; each HELLO
        names its key, and each link expects the other's key.
        """
        a, b = self.curve_pair()
        self.assertEqual((list(a.peers), list(b.peers)), ([b.uuid], [a.uuid]))
        self.assertEqual(a.peers[b.uuid].key, curve_key("b"))
        hello = zre.decode(self.network.link(a, b.endpoint).sent[0])
        assert isinstance(hello, zre.Hello)
        self.assertIn((PUBLIC_KEY_HEADER, curve_key("a").decode()), hello.headers)
        self.assertEqual(self.network.link(b, a.endpoint).server_key, curve_key("a"))
        a.whisper(b.uuid, [b"hi"])
        self.network.flush()
        self.assertEqual(self.events("b"), [("whisper", "a", [b"hi"])])

    def test_unlistedKeyNeverLinked(self) -> None:
        """
        A beacon or gossip naming a key that is not listed, or no key (an
        open node), links to nothing: counted, and the stranger reported.
        """
        a = self.node("a", listed={curve_key("b")})
        stranger = self.node("s", listed={curve_key("a")})
        a.discovered(stranger.uuid, stranger.endpoint, curve_key("s"))
        a.discovered(_uuid("o"), "mem://o", None)
        self.assertEqual(self.network.links, [])
        self.assertEqual((a.counters.not_listed, a.counters.no_key), (1, 1))
        self.assertEqual(
            [(why, uuid) for why, uuid, _, _ in self.strangers],
            [("not listed", stranger.uuid), ("no key", _uuid("o"))],
        )

    def test_strangerLinkingInGetsNothing(self) -> None:
        """
        A stranger that lists our key and links to us (its HELLO refused by
        ZAP, here the network) never enters, and is never linked to.
        """
        a = self.node("a", listed={curve_key("b")})
        stranger = self.node("s", listed={curve_key("a")})
        stranger.discovered(a.uuid, a.endpoint, curve_key("a"))
        self.network.flush()
        self.assertEqual((a.peers, stranger.peers), ({}, {}))
        self.assertEqual([link.identity[1:] for link in self.network.links], [stranger.uuid])
        self.assertEqual(self.network.handshakes_failed, 1)

    def test_openNodeIgnoresCurveNodes(self) -> None:
        """A node without CURVE ignores a node that names a key, and a CURVE node's links fail."""
        plain = self.node("p")
        a = self.node("a", listed={curve_key("p")})
        plain.discovered(a.uuid, a.endpoint, curve_key("a"))
        self.assertEqual(self.network.links, [])
        a.discovered(plain.uuid, plain.endpoint, curve_key("p"))
        self.network.flush()
        self.assertEqual((a.peers, plain.peers), ({}, {}))

    def test_helloMustNameItsConnectionsKey(self) -> None:
        """
        A HELLO whose X-PUBLICKEY is not the key its connection proved, or
        that names none, is refused: a listed node cannot pose as another.
        """
        a = self.node("a", listed={curve_key("b"), curve_key("c")})
        hello = zre.encode(zre.Hello(1, "mem://b", (), 0, "b", ((PUBLIC_KEY_HEADER, "x"),)))
        a.receive(b"\x01" + _uuid("b"), hello, curve_key("c"))
        bare = zre.encode(zre.Hello(1, "mem://b", (), 0, "b", ()))
        a.receive(b"\x01" + _uuid("b"), bare, curve_key("b"))
        self.assertEqual((a.peers, self.network.links), ({}, []))
        self.assertEqual((a.counters.key_mismatches, a.counters.no_key), (1, 1))

    def test_messagesFromAnotherKeyDropped(self) -> None:
        """
        Once a peer entered with its key, a message under its routing id
        from another (listed) key is dropped and counted.
        """
        a, b = self.curve_pair()
        self.network.lists[a.uuid].add(curve_key("c"))
        whisper = zre.encode(zre.Whisper(self.next_sequence(b, a), (b"forged",)))
        a.receive(b"\x01" + b.uuid, whisper, curve_key("c"))
        self.assertEqual(self.events("a"), [])
        self.assertEqual(a.counters.key_mismatches, 1)
        self.assertIn(b.uuid, a.peers)

    def test_keyNoLongerListedIsDropped(self) -> None:
        """
        A key removed from the list (a reload) loses its peer at once, and
        what still comes on its connection is dropped; the peer does not
        come back while its key is not listed.
        """
        a, b = self.curve_pair()
        self.network.lists[a.uuid].discard(curve_key("b"))
        a.drop_keys({curve_key("b")})
        self.assertEqual((a.peers, self.events("a")), ({}, [("exit", "b")]))
        self.assertEqual(a.counters.keys_dropped, 1)
        whisper = zre.encode(zre.Whisper(self.next_sequence(b, a), (b"late",)))
        a.receive(b"\x01" + b.uuid, whisper, curve_key("b"))
        a.discovered(b.uuid, b.endpoint, curve_key("b"))
        self.assertEqual((a.peers, self.events("a")), ({}, []))

    def test_newKeyIsARestart(self) -> None:
        """
        A peer whose new HELLO comes on a connection proved with another
        listed key (it restarted with a new key) is dropped and linked to
        afresh with that key.
        """
        a, b = self.curve_pair()
        self.network.lists[a.uuid].add(curve_key("b2"))
        headers = ((PUBLIC_KEY_HEADER, curve_key("b2").decode()),)
        a.receive(
            b"\x01" + b.uuid,
            zre.encode(zre.Hello(1, "mem://b", (), 0, "b", headers)),
            curve_key("b2"),
        )
        self.assertEqual(a.counters.restarts, 1)
        self.assertEqual(self.network.link(a, b.endpoint).server_key, curve_key("b2"))
        self.assertEqual(a.peers[b.uuid].key, curve_key("b2"))

    def test_helloOfAnotherKeyCannotPushAPeerOut(self) -> None:
        """
        A HELLO from another listed key naming an entered peer's endpoint
        does not drop that peer; the same key under a new uuid (the broker
        restarted) does.
        """
        a, b = self.curve_pair()
        self.network.lists[a.uuid].add(curve_key("c"))
        headers = ((PUBLIC_KEY_HEADER, curve_key("c").decode()),)
        hello = zre.encode(zre.Hello(1, b.endpoint, (), 0, "c", headers))
        a.receive(b"\x01" + _uuid("c"), hello, curve_key("c"))
        self.assertIn(b.uuid, a.peers)
        headers = ((PUBLIC_KEY_HEADER, curve_key("b").decode()),)
        hello = zre.encode(zre.Hello(1, b.endpoint, (), 0, "b", headers))
        a.receive(b"\x01" + _uuid("b-new"), hello, curve_key("b"))
        self.assertNotIn(b.uuid, a.peers)
        self.assertIn(_uuid("b-new"), a.peers)

    def test_beaconsCannotMoveAPeer(self) -> None:
        """
        Beacons prove nothing: one naming an entered CURVE peer at another
        endpoint or with another key, a port-0 beacon for it, or one naming
        its endpoint under another uuid leaves the peer as it is.
        """
        a, b = self.curve_pair()
        self.network.lists[a.uuid].add(curve_key("x"))
        a.discovered(b.uuid, "mem://elsewhere", curve_key("b"))
        a.discovered(b.uuid, b.endpoint, curve_key("x"))
        a.discovered(_uuid("x"), b.endpoint, curve_key("x"))
        a.departed(b.uuid)
        self.assertEqual(list(a.peers), [b.uuid])
        self.assertEqual((a.counters.restarts, self.events("a")), (0, []))

    def test_curveNeedsBothKeys(self) -> None:
        """A node given its key without the peers' list (or the reverse) is refused."""
        with self.assertRaises(ValueError):
            ZreNode(
                self.clock, _uuid("x"), "x", "mem://x", self.network.connector(_uuid("x")),
                Recorder(), public_key=curve_key("x"),
            )  # fmt: skip
