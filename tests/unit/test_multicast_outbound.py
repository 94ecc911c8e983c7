"""
Tests for L{malamute_pack.multicast.publisher}, the outbound session of
L{malamute_pack.multicast.sessions} and L{malamute_pack.multicast.sockets}:
a publisher on a fake C{send}, then an outbound bridge reading a real
broker's journaled stream and publishing on a real PUB socket (no
multicast: tcp on loopback, inproc), read by a real SUB.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import zmq
from twisted.internet.task import Clock
from twisted.logger import LogLevel, formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.journal import Journal, JournalConfig
from malamute_pack.multicast import sockets
from malamute_pack.multicast.publisher import (
    NORM_PACK_BYTES,
    PACK_BYTES,
    PACK_DELAY,
    RETRY,
    STALLED,
    Publisher,
)
from malamute_pack.multicast.sessions import OutboundSession
from malamute_pack.protocol import mlm, multicast
from malamute_pack.protocol.multicast import Header
from tests.memory_session import InMemorySession
from tests.multicast_support import Wire, clock, settle
from tests.support import capture_log, wait_for


class Sent:
    """A socket's C{send} that keeps what it is given, or refuses while C{full}."""

    def __init__(self) -> None:
        self.messages: list[list[bytes]] = []
        self.full = False

    def __call__(self, frames: Sequence[bytes]) -> bool:
        if self.full:
            return False
        self.messages.append(list(frames))
        return True

    def headers(self) -> list[Header]:
        """The header of every record sent, in order, whatever pack it was in."""
        return [
            header
            for frames in self.messages
            for header, _ in multicast.decode_pack(frames).headers()
        ]


class PublisherTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent = Sent()
        self.clock = Clock()
        self.publisher = Publisher(
            self.clock, self.sent, "origin-1", "tcp://10.0.0.1:9999", "weather", "temp.*"
        )

    def test_record(self) -> None:
        """
        A record is sent as its header (the bridge's origin, endpoint,
        stream and pattern, the record's number, time in microseconds,
        sender and subject) and its content frames, as they were.
        """
        self.assertTrue(self.publisher.publish(4, 1700000000.25, "station", "temp.x", [b"a", b""]))
        self.clock.advance(0)  # the reactor's turn ends
        [(header, content)] = [multicast.decode(m) for m in self.sent.messages]
        self.assertEqual(
            header,
            Header(
                "origin-1", "weather", 4, 0, 1_700_000_000_250_000, "tcp://10.0.0.1:9999",
                "temp.*", "station", "temp.x",
            ),
        )  # fmt: skip
        self.assertEqual(content, [b"a", b""])
        counters = self.publisher.counters
        self.assertEqual((counters.published, self.publisher.prev), (1, 4))
        self.assertEqual(counters.bytes, sum(map(len, self.sent.messages[0])))

    def test_prevChain(self) -> None:
        """
        Each record names the one published before it (0 for the first), so
        the holes a pattern leaves in the numbers are no loss.
        """
        for seq in (3, 4, 9):
            self.publisher.publish(seq, 1.0, "", "temp", [])
        self.clock.advance(0)
        self.assertEqual([(h.seq, h.prev) for h in self.sent.headers()], [(3, 0), (4, 3), (9, 4)])

    def test_sentAlready(self) -> None:
        """A record numbered at or below the last published is taken and not sent again."""
        self.publisher.publish(5, 1.0, "", "temp", [])
        self.assertTrue(self.publisher.publish(5, 1.0, "", "temp", []))
        self.assertTrue(self.publisher.publish(2, 1.0, "", "temp", []))
        self.clock.advance(0)
        self.assertEqual(len(self.sent.messages), 1)
        self.assertEqual(self.publisher.counters.published, 1)

    def test_unfit(self) -> None:
        """
        A record whose subject or sender a header cannot carry is counted
        and skipped (taken, not sent); the next record names the last one
        sent as its predecessor, so receivers see the loss.
        """
        self.publisher.publish(1, 1.0, "", "temp", [])
        self.assertTrue(self.publisher.publish(2, 1.0, "", "t" * 256, []))
        self.assertTrue(self.publisher.publish(3, 1.0, "s" * 300, "temp", []))
        self.assertEqual(self.publisher.counters.unfit, 2)
        self.assertEqual(self.publisher.prev, 1)
        self.publisher.publish(4, 1.0, "", "temp", [])
        self.clock.advance(0)
        self.assertEqual([(h.seq, h.prev) for h in self.sent.headers()], [(1, 0), (4, 1)])

    def test_full(self) -> None:
        """
        When the socket cannot take a pack, the pack is kept (counted) and
        publish says so (False) for the records after it, leaving the chain
        as it was; once the socket takes the pack, the record refused is
        taken, naming the same predecessor.
        """
        self.publisher.publish(1, 1.0, "", "temp", [])
        self.clock.advance(0)
        self.sent.full = True
        self.assertTrue(self.publisher.publish(2, 1.0, "", "temp", []))
        self.clock.advance(0)
        self.assertFalse(self.publisher.publish(3, 1.0, "", "temp", []))
        self.assertEqual((self.publisher.prev, self.publisher.counters.full), (2, 2))
        self.sent.full = False
        self.assertTrue(self.publisher.publish(3, 1.0, "", "temp", []))
        self.clock.advance(0)
        self.assertEqual([(h.seq, h.prev) for h in self.sent.headers()], [(1, 0), (2, 1), (3, 2)])
        self.assertEqual(self.publisher.counters.published, 3)

    def test_fullTriedAgain(self) -> None:
        """
        A pack the socket refused is tried again every RETRY seconds, with
        no record coming to push it; it goes once the socket takes it.
        """
        self.publisher.publish(1, 1.0, "", "temp", [])
        self.sent.full = True
        self.clock.advance(0)
        self.clock.advance(RETRY)
        self.assertEqual((self.sent.messages, self.publisher.counters.full), ([], 2))
        self.sent.full = False
        self.clock.advance(RETRY)
        self.assertEqual([h.seq for h in self.sent.headers()], [1])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_beatWhenIdle(self) -> None:
        """
        A tick after which nothing was published sends a beat naming the
        last number published; a tick after records sends nothing, and so
        does one before anything was ever published.
        """
        self.publisher.tick()
        self.assertEqual(self.sent.messages, [])
        self.publisher.publish(3, 1.0, "", "temp", [b"a"])
        self.clock.advance(0)
        self.publisher.tick()
        self.assertEqual(len(self.sent.messages), 1)
        self.publisher.tick()
        [_, beat] = self.sent.messages
        header, content = multicast.decode(beat)
        self.assertEqual((header.beat, header.seq, header.prev, content), (True, 3, 0, []))
        self.assertEqual(self.publisher.counters.beats, 1)
        self.assertEqual(self.publisher.counters.published, 1)

    def test_stalledSaid(self) -> None:
        """
        A socket that refuses every pack for STALLED seconds is logged as
        an error once per period (NORM's stall in libzmq 4.3.4 is otherwise
        silent); one that takes packs again is not.
        """
        clock = Clock()
        publisher = Publisher(clock, self.sent, "o", "", "weather", ".*")
        errors = capture_log(self)
        self.sent.full = True
        publisher.publish(1, 1.0, "", "s", [])
        clock.advance(0)
        clock.advance(STALLED - 1)
        self.assertEqual([e for e in errors if e["log_level"] == LogLevel.error], [])
        clock.advance(1)
        [said] = [e for e in errors if e["log_level"] == LogLevel.error]
        self.assertIn("has taken nothing for 10s", formatEvent(said))
        self.sent.full = False
        clock.advance(RETRY)
        self.sent.full = True
        publisher.publish(2, 1.0, "", "s", [])
        clock.advance(0)
        clock.advance(STALLED - 1)
        self.assertEqual(len([e for e in errors if e["log_level"] == LogLevel.error]), 1)

    def test_packedUntilTurnEnds(self) -> None:
        """
        Records taken in one reactor turn go out together, as one message
        (a pack), when the turn ends: nothing before, nothing left after.
        """
        for seq in (1, 2, 3):
            self.assertTrue(self.publisher.publish(seq, 1.0, "w", f"temp.{seq}", [b"%d" % seq]))
        self.assertEqual(self.sent.messages, [])
        self.clock.advance(0)
        self.assertEqual(len(self.sent.messages), 1)
        [message] = self.sent.messages
        records = multicast.decode_pack(message).headers()
        self.assertEqual([(h.seq, h.subject, c) for h, c in records], [
            (1, "temp.1", [b"1"]), (2, "temp.2", [b"2"]), (3, "temp.3", [b"3"]),
        ])  # fmt: skip
        counters = self.publisher.counters
        self.assertEqual((counters.published, counters.packs), (3, 1))
        self.assertEqual(counters.bytes, len(message[0]))
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_sizeBound(self) -> None:
        """
        A pack holds at most PACK_BYTES of records: the record that would
        take it past sends it and starts the next; every record goes once,
        in order, each naming the one before it.
        """
        for seq in range(1, 41):
            self.publisher.publish(seq, 1.0, "w", "temp", [b"x" * 1000])
        self.clock.advance(0)
        self.assertGreater(len(self.sent.messages), 4)
        source = multicast.encode_source("origin-1", "tcp://10.0.0.1:9999", "weather", "temp.*")
        start = len(multicast.pack_start(source))
        for [frame] in self.sent.messages:
            self.assertLessEqual(len(frame) - start, PACK_BYTES)
        self.assertEqual(
            [(h.seq, h.prev) for h in self.sent.headers()], [(n, n - 1) for n in range(1, 41)]
        )

    def test_bigRecordAlone(self) -> None:
        """A record larger than PACK_BYTES goes alone in its pack, whole."""
        self.publisher.publish(1, 1.0, "w", "temp", [b"a"])
        self.publisher.publish(2, 1.0, "w", "temp", [b"b" * (PACK_BYTES * 3)])
        self.clock.advance(0)
        self.assertEqual(
            [len(multicast.decode_pack(m).records) for m in self.sent.messages], [1, 1]
        )
        self.assertEqual(self.sent.headers()[1].seq, 2)

    def test_timeBound(self) -> None:
        """
        A record that comes PACK_DELAY or more after the pack's first sends
        the pack, however long the reactor's turn: no record waits longer.
        """
        self.publisher.publish(1, 1.0, "w", "temp", [b"a"])
        self.clock.rightNow += PACK_DELAY / 2  # the same turn: no timer runs
        self.publisher.publish(2, 1.0, "w", "temp", [b"b"])
        self.assertEqual(self.sent.messages, [])
        self.clock.rightNow += PACK_DELAY / 2
        self.publisher.publish(3, 1.0, "w", "temp", [b"c"])
        self.assertEqual([[h.seq for h, _ in multicast.decode_pack(m).headers()]
                          for m in self.sent.messages], [[1, 2]])  # fmt: skip
        self.clock.advance(0)
        self.assertEqual([h.seq for h in self.sent.headers()], [1, 2, 3])

    def test_closeSends(self) -> None:
        """Closing sends what is packed and leaves no timer behind."""
        self.publisher.publish(1, 1.0, "w", "temp", [b"a"])
        self.publisher.close()
        self.assertEqual([h.seq for h in self.sent.headers()], [1])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_normPacksSmall(self) -> None:
        """
        A publisher on a NORM group packs at most NORM_PACK_BYTES (libzmq
        4.3.4's NORM stalled with packs of 8 KiB); on others, PACK_BYTES.
        """
        self.assertEqual(sockets.pack_bytes("norm://eth0;239.192.1.1:5555"), NORM_PACK_BYTES)
        self.assertEqual(sockets.pack_bytes("epgm://eth0;239.192.1.1:5555"), PACK_BYTES)
        self.assertEqual(sockets.pack_bytes("tcp://127.0.0.1:5555"), PACK_BYTES)
        publisher = Publisher(self.clock, self.sent, "o", "", "s", ".*", NORM_PACK_BYTES)
        for seq in range(1, 21):
            publisher.publish(seq, 1.0, "w", "temp", [b"x" * 200])
        self.clock.advance(0)
        source = multicast.encode_source("o", "", "s", ".*")
        start = len(multicast.pack_start(source))
        self.assertGreater(len(self.sent.messages), 4)
        for [frame] in self.sent.messages:
            self.assertLessEqual(len(frame) - start, NORM_PACK_BYTES)

    def test_nameTooLong(self) -> None:
        """A stream or pattern no header could carry is refused when the publisher is made."""
        with self.assertRaises(ValueError):
            Publisher(Clock(), self.sent, "o", "", "s", "p" * 256)


class BridgeTestCase(TestCase):
    """
    A broker journaling to a temporary directory, a writer on its stream
    C{s}, and a PUB and SUB made by L{sockets} (a L{Wire}).
    """

    stream = "s"

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        path = Path(self.mktemp())
        path.mkdir()
        self.journal = Journal(path / "journal.sqlite", clock, JournalConfig())
        self.journal.open()
        self.addCleanup(self.journal.close)
        self.broker = Broker(clock, BrokerConfig(stall_retry=0.01), self.journal)
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.writer = InMemorySession("writer")
        self.broker.receive(self.writer, mlm.ConnectionOpen(version=2, address="w"))
        self.broker.receive(self.writer, mlm.StreamWrite(self.stream))
        self.wire = Wire(self, self.context, self.url())

    def url(self) -> str:
        return "tcp://127.0.0.1:*"

    async def bridge(self, pattern: str = ".*") -> OutboundSession:
        """An outbound bridge on the stream, once the SUB has subscribed."""
        await self.wire.subscribed()
        publisher = Publisher(
            clock, self.wire.pub.send, "origin-a", "tcp://10.0.0.1:9999", self.stream, pattern
        )
        session = OutboundSession(publisher)
        session.attach(self.broker)
        return session

    def write(self, *subjects: str) -> None:
        for subject in subjects:
            self.broker.receive(self.writer, mlm.StreamSend(subject, [subject.encode(), b"x"]))


class OutboundTests(BridgeTestCase):
    async def test_published(self) -> None:
        """
        Records written to the stream after the bridge attached are published
        on the PUB, in order, each with its stream sequence number, the
        previous one's, the writer and subject, and its content.
        """
        self.write("before")
        session = await self.bridge()
        self.write("a", "b", "c")
        await wait_for(lambda: len(self.wire.received) == 3)
        records = self.wire.records()
        self.assertEqual([(h.seq, h.prev) for h, _ in records], [(2, 0), (3, 2), (4, 3)])
        self.assertEqual(
            [(h.subject, h.sender) for h, _ in records], [("a", "w"), ("b", "w"), ("c", "w")]
        )
        self.assertEqual([c for _, c in records], [[b"a", b"x"], [b"b", b"x"], [b"c", b"x"]])
        header = records[0][0]
        self.assertEqual(
            (header.origin, header.stream, header.endpoint, header.pattern),
            ("origin-a", "s", "tcp://10.0.0.1:9999", ".*"),
        )
        self.assertLess(abs(header.timestamp / 1e6 - time.time()), 10)
        self.assertEqual(session.publisher.counters.published, 3)
        self.assertIn("'s' (.*)", repr(session))

    async def test_pattern(self) -> None:
        """Only the records the bridge's pattern finds are published; prev skips the others."""
        await self.bridge("temp.*")
        self.write("temp.1", "wind.2", "wind.3", "temp.4")
        await wait_for(lambda: len(self.wire.received) == 2)
        await settle(0.05)
        records = self.wire.records()
        self.assertEqual(
            [(h.seq, h.prev, h.subject) for h, _ in records], [(1, 0, "temp.1"), (4, 1, "temp.4")]
        )

    async def test_detached(self) -> None:
        """Once the bridge's session is detached nothing more is published."""
        session = await self.bridge()
        self.write("a")
        await wait_for(lambda: len(self.wire.received) == 1)
        self.broker.detach_remote(session)
        self.write("b")
        await settle(0.05)
        self.assertEqual(len(self.wire.received), 1)
        self.assertIsNone(self.broker.registry.get(session))


class BackpressureTests(BridgeTestCase):
    """
    A PUB whose queue fills (its high-water marks made tiny; inproc, so no
    kernel buffer hides them): records wait in the journal, not in memory.
    """

    def setUp(self) -> None:
        self.patch(sockets, "HWM", 4)
        super().setUp()

    def url(self) -> str:
        return f"inproc://bridge-{id(self)}"

    def write(self, *subjects: str) -> None:
        """Records of half a pack each: the queue fills with packs of two."""
        for subject in subjects:
            content = [subject.encode(), b"x" * (PACK_BYTES // 2)]
            self.broker.receive(self.writer, mlm.StreamSend(subject, content))

    async def test_fallBehindAndCatchUp(self) -> None:
        """
        While the SUB reads nothing the PUB's queue fills, a send fails
        (no drop: XPUB_NODROP) and the bridge falls behind onto the journal;
        once the SUB drains, the broker's retry timer publishes the rest from
        the journal and then live, in order: every record once, each naming
        the one before it.
        """
        session = await self.bridge()
        self.wire.sub.pauseReading()
        self.write(*[f"r{n}" for n in range(1, 31)])
        connection = self.broker.registry.get(session)
        assert connection is not None
        await wait_for(lambda: session.publisher.counters.full > 2)
        self.assertIn(self.stream, connection.behind)
        self.assertLess(session.publisher.prev, 30)
        self.write(*[f"r{n}" for n in range(31, 41)])
        await settle(0.05)
        self.wire.sub.resumeReading()
        await wait_for(lambda: len(self.wire.received) >= 40)
        await settle(0.05)
        records = self.wire.records()
        self.assertEqual([h.seq for h, _ in records], list(range(1, 41)))
        self.assertEqual([h.prev for h, _ in records], list(range(0, 40)))
        self.assertEqual([h.subject for h, _ in records], [f"r{n}" for n in range(1, 41)])
        self.assertNotIn(self.stream, connection.behind)
        # Live again: the next record goes straight out.
        self.write("r41")
        await wait_for(lambda: len(self.wire.received) == 41)
        self.assertEqual(self.broker.streams.dropped, 0)
