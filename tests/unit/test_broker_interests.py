"""
Tests for L{malamute_pack.broker.interests}: the reference counts of local
readers, addresses and offers and what their listener hears, alone and
driven through the real broker model (MLM clients count; connections of the
pack, made with C{attach_remote}, never do).
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.interests import InterestListener, Interests
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness
from tests.memory_session import InMemorySession

Event = tuple[object, ...]


class RecordingListener:
    """An L{InterestListener} that keeps every call, in order, as a tuple."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def take(self) -> list[Event]:
        """What was heard since the last take."""
        events, self.events = self.events, []
        return events

    def reading_started(self, stream: str, pattern: str) -> None:
        self.events.append(("reading_started", stream, pattern))

    def reading_stopped(self, stream: str, pattern: str) -> None:
        self.events.append(("reading_stopped", stream, pattern))

    def history_wanted(self, stream: str, pattern: str, whence: int, position: int) -> None:
        self.events.append(("history_wanted", stream, pattern, whence, position))

    def address_opened(self, address: str) -> None:
        self.events.append(("address_opened", address))

    def address_closed(self, address: str) -> None:
        self.events.append(("address_closed", address))

    def offers_changed(self, service: str, pattern: str, workers: int) -> None:
        self.events.append(("offers_changed", service, pattern, workers))


class InterestsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.recorder = RecordingListener()
        self.interests = Interests()
        # Typed as the protocol: mypy checks the recorder implements it.
        listener: InterestListener = self.recorder
        self.interests.listener = listener

    def test_noListenerByDefault(self) -> None:
        """A new Interests has no listener and nothing counted."""
        interests = Interests()
        self.assertIsNone(interests.listener)
        self.assertEqual(interests.readings(), [])
        self.assertEqual(interests.addresses(), [])
        self.assertEqual(interests.offers(), [])

    def test_firstAndLastReader(self) -> None:
        """
        The first reader of a (stream, pattern) starts the reading and the
        last one stops it, once each; the readers between are silent.
        """
        for _ in range(3):
            self.interests.read("weather", "temp.*")
        self.assertEqual(self.recorder.take(), [("reading_started", "weather", "temp.*")])
        self.interests.unread("weather", "temp.*")
        self.interests.unread("weather", "temp.*")
        self.assertEqual(self.recorder.take(), [])
        self.assertEqual(self.interests.readings(), [("weather", "temp.*")])
        self.interests.unread("weather", "temp.*")
        self.assertEqual(self.recorder.take(), [("reading_stopped", "weather", "temp.*")])
        self.assertEqual(self.interests.readings(), [])

    def test_readingsByPair(self) -> None:
        """Each (stream, pattern) pair is counted apart: same pattern, other stream, too."""
        self.interests.read("weather", "temp.*")
        self.interests.read("weather", "rain.*")
        self.interests.read("news", "temp.*")
        self.interests.unread("weather", "rain.*")
        self.assertEqual(
            self.recorder.take(),
            [
                ("reading_started", "weather", "temp.*"),
                ("reading_started", "weather", "rain.*"),
                ("reading_started", "news", "temp.*"),
                ("reading_stopped", "weather", "rain.*"),
            ],
        )
        self.assertEqual(self.interests.readings(), [("news", "temp.*"), ("weather", "temp.*")])

    def test_readAgainAfterStop(self) -> None:
        """A pair read again after its last reader left starts again."""
        self.interests.read("s", "p")
        self.interests.unread("s", "p")
        self.interests.read("s", "p")
        self.assertEqual(
            self.recorder.take(),
            [
                ("reading_started", "s", "p"),
                ("reading_stopped", "s", "p"),
                ("reading_started", "s", "p"),
            ],
        )

    def test_history(self) -> None:
        """A history request passes through to the listener and counts no reader."""
        self.interests.history("weather", "temp.*", 2, 42)
        self.assertEqual(self.recorder.take(), [("history_wanted", "weather", "temp.*", 2, 42)])
        self.assertEqual(self.interests.readings(), [])

    def test_addresses(self) -> None:
        """Addresses opened and closed are heard and kept, sorted."""
        self.interests.opened("carol")
        self.interests.opened("alice")
        self.interests.opened("bob")
        self.assertEqual(self.interests.addresses(), ["alice", "bob", "carol"])
        self.interests.closed("alice")
        self.assertEqual(self.interests.addresses(), ["bob", "carol"])
        self.assertEqual(
            self.recorder.take(),
            [
                ("address_opened", "carol"),
                ("address_opened", "alice"),
                ("address_opened", "bob"),
                ("address_closed", "alice"),
            ],
        )

    def test_offersCounted(self) -> None:
        """
        Every change of an offer's workers is heard with the new count; at
        0 the offer is gone from offers().
        """
        self.interests.offered("echo", "ping.*", 1)
        self.interests.offered("echo", "ping.*", 1)
        self.assertEqual(self.interests.offers(), [("echo", "ping.*", 2)])
        self.interests.offered("echo", "ping.*", -1)
        self.interests.offered("echo", "ping.*", -1)
        self.assertEqual(
            self.recorder.take(),
            [
                ("offers_changed", "echo", "ping.*", 1),
                ("offers_changed", "echo", "ping.*", 2),
                ("offers_changed", "echo", "ping.*", 1),
                ("offers_changed", "echo", "ping.*", 0),
            ],
        )
        self.assertEqual(self.interests.offers(), [])

    def test_offersByPair(self) -> None:
        """Offers are counted per (service, pattern) and listed sorted."""
        self.interests.offered("time", "", 1)
        self.interests.offered("echo", "pong", 1)
        self.interests.offered("echo", "ping", 3)
        self.assertEqual(
            self.interests.offers(), [("echo", "ping", 3), ("echo", "pong", 1), ("time", "", 1)]
        )

    def test_snapshotsSorted(self) -> None:
        """readings(), addresses() and offers() are sorted, whatever the order of changes."""
        for stream, pattern in [("b", "2"), ("a", "9"), ("b", "1"), ("a", "")]:
            self.interests.read(stream, pattern)
        self.assertEqual(self.interests.readings(), [("a", ""), ("a", "9"), ("b", "1"), ("b", "2")])

    def test_snapshotsAreCopies(self) -> None:
        """Changing a returned snapshot changes nothing in the Interests."""
        self.interests.read("s", "p")
        self.interests.opened("alice")
        self.interests.offered("echo", "", 1)
        self.interests.readings().clear()
        self.interests.addresses().clear()
        self.interests.offers().clear()
        self.assertEqual(self.interests.readings(), [("s", "p")])
        self.assertEqual(self.interests.addresses(), ["alice"])
        self.assertEqual(self.interests.offers(), [("echo", "", 1)])

    def test_withoutListener(self) -> None:
        """With no listener every change is counted and nothing fails."""
        interests = Interests()
        interests.read("s", "p")
        interests.read("s", "p")
        interests.unread("s", "p")
        interests.history("s", "p", 1, 0)
        interests.opened("alice")
        interests.offered("echo", "", 1)
        self.assertEqual(interests.readings(), [("s", "p")])
        self.assertEqual(interests.addresses(), ["alice"])
        self.assertEqual(interests.offers(), [("echo", "", 1)])
        interests.unread("s", "p")
        interests.closed("alice")
        interests.offered("echo", "", -1)
        self.assertEqual(interests.readings(), [])
        self.assertEqual(interests.addresses(), [])
        self.assertEqual(interests.offers(), [])


class BrokerInterestsTests(SynchronousTestCase):
    """What the real broker model tells its Interests, driven by MLM clients."""

    def setUp(self) -> None:
        self.harness = BrokerHarness(BrokerConfig())
        self.addCleanup(self.harness.close)
        self.broker = self.harness.broker
        self.recorder = RecordingListener()
        self.broker.interests.listener = self.recorder

    def test_streamReaders(self) -> None:
        """
        Two clients reading the same pattern, one cancelling and the other
        disconnecting, give exactly one reading_started and one
        reading_stopped.
        """
        h = self.harness
        h.open(b"a")
        h.open(b"b")
        self.assertEqual(h.command(b"a", mlm.StreamRead("weather", "temp.*")), [mlm.Ok()])
        self.assertEqual(self.recorder.take(), [("reading_started", "weather", "temp.*")])
        self.assertEqual(h.command(b"b", mlm.StreamRead("weather", "temp.*")), [mlm.Ok()])
        h.send(b"a", mlm.StreamCancel("weather"))
        self.assertEqual(self.recorder.take(), [])
        self.assertEqual(self.broker.interests.readings(), [("weather", "temp.*")])
        h.send(b"b", mlm.ConnectionClose())
        self.assertFalse(h.connected(b"b"))
        self.assertEqual(self.recorder.take(), [("reading_stopped", "weather", "temp.*")])
        self.assertEqual(self.broker.interests.readings(), [])

    def test_serviceOffer(self) -> None:
        """A worker's SERVICE_OFFER is heard as one worker, its close as none."""
        h = self.harness
        h.open(b"w", "worker-1")
        self.recorder.take()
        self.assertEqual(h.command(b"w", mlm.ServiceOffer("echo", "ping.*")), [mlm.Ok()])
        self.assertEqual(self.recorder.take(), [("offers_changed", "echo", "ping.*", 1)])
        self.assertEqual(self.broker.interests.offers(), [("echo", "ping.*", 1)])
        h.send(b"w", mlm.ConnectionClose())
        self.assertIn(("offers_changed", "echo", "ping.*", 0), self.recorder.take())
        self.assertEqual(self.broker.interests.offers(), [])

    def test_address(self) -> None:
        """A CONNECTION_OPEN with an address is heard as opened, its close as closed."""
        h = self.harness
        h.open(b"c", "alice")
        self.assertEqual(self.recorder.take(), [("address_opened", "alice")])
        self.assertEqual(self.broker.interests.addresses(), ["alice"])
        h.send(b"c", mlm.ConnectionClose())
        self.assertEqual(self.recorder.take(), [("address_closed", "alice")])
        self.assertEqual(self.broker.interests.addresses(), [])

    def test_anonymousHoldsNoAddress(self) -> None:
        """An anonymous client opens and closes no address."""
        h = self.harness
        h.open(b"c")
        h.send(b"c", mlm.ConnectionClose())
        self.assertEqual(self.recorder.take(), [])

    def test_remoteNeverHeard(self) -> None:
        """
        A connection of the pack (attach_remote) with an address, reading a
        stream and offering a service, then detached, never reaches the
        listener nor the counts.
        """
        peer = InMemorySession("peer")
        connection = self.broker.attach_remote(peer, "bob")
        self.assertIsNotNone(connection)
        self.broker.receive(peer, mlm.StreamRead("weather", "temp.*"))
        self.broker.receive(peer, mlm.ServiceOffer("echo", "ping.*"))
        self.assertEqual([s.what for s in peer.take()], ["ok", "ok"])
        self.assertEqual(self.broker.interests.readings(), [])
        self.assertEqual(self.broker.interests.addresses(), [])
        self.assertEqual(self.broker.interests.offers(), [])
        self.broker.receive(peer, mlm.StreamCancel("weather"))
        self.broker.detach_remote(peer)
        self.assertIsNone(self.broker.registry.get(peer))
        self.assertEqual(self.recorder.events, [])

    def test_remoteBesideLocal(self) -> None:
        """
        A remote reader of the same pattern as a local one changes nothing:
        the local reader's leaving still stops the reading.
        """
        h = self.harness
        h.open(b"a")
        h.command(b"a", mlm.StreamRead("weather", "temp.*"))
        peer = InMemorySession("peer")
        self.broker.attach_remote(peer)
        self.broker.receive(peer, mlm.StreamRead("weather", "temp.*"))
        h.send(b"a", mlm.ConnectionClose())
        self.assertEqual(
            self.recorder.take(),
            [
                ("reading_started", "weather", "temp.*"),
                ("reading_stopped", "weather", "temp.*"),
            ],
        )
        self.broker.detach_remote(peer)
        self.assertEqual(self.recorder.take(), [])
