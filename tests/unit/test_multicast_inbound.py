"""
Tests for L{malamute_pack.multicast.inbound} (an inbound bridge's logic,
on a real broker model, with a L{Repairs} the test plays the origin of) and
L{malamute_pack.multicast.repair} (repairs over TCP from a real broker on
loopback).
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

import zmq
from twisted.application.service import MultiService
from twisted.internet import reactor
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import Clock, deferLater
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.streams import NOTICE
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.journal import JournalConfig, RetentionPolicy
from malamute_pack.multicast import inbound
from malamute_pack.multicast import repair as repair_module
from malamute_pack.multicast.inbound import MAX_FLOWS, Flow, InboundBridge
from malamute_pack.multicast.repair import TcpRepairs
from malamute_pack.protocol import mlm, multicast
from malamute_pack.protocol.multicast import Header
from malamute_pack.protocol.records import StreamRecord
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zmqsocket import ZmqSocket
from tests.broker_support import BrokerHarness
from tests.memory_session import InMemorySession
from tests.support import capture_log, wait_for

_reactor = cast(IReactorFDSet, reactor)
_clock = cast(IReactorTime, reactor)

ORIGIN = "0A1B2C3D"
ORIGIN_STREAM = "weather"
KEY = f"{ORIGIN}/{ORIGIN_STREAM}"
LOCAL = "news"
URL = "epgm://eth0;239.192.1.1:5555"
ENDPOINT = "tcp://origin.example:9999"


def header(
    seq: int,
    prev: int,
    *,
    origin: str = ORIGIN,
    endpoint: str = ENDPOINT,
    pattern: str = "",
    sender: str = "writer",
    subject: str | None = None,
) -> Header:
    """The header of origin record C{seq} (its timestamp: C{seq + 0.5} s)."""
    return Header(
        origin,
        ORIGIN_STREAM,
        seq,
        prev,
        seq * 1_000_000 + 500_000,
        endpoint,
        pattern,
        sender,
        f"temp.{seq}" if subject is None else subject,
    )


def frames(seq: int, prev: int, content: Sequence[bytes] | None = None, **kw: str) -> list[bytes]:
    """Origin record C{seq}, published after C{prev}, as the group brings it."""
    return multicast.encode(
        header(seq, prev, **kw), [f"r{seq}".encode()] if content is None else content
    )


def open_reader(
    broker: Broker, name: str, pattern: str = "", whence: int = mlm.LATEST
) -> InMemorySession:
    """An in-memory client of C{broker} reading the local stream with C{pattern}."""
    session = InMemorySession(name)
    broker.receive(session, mlm.ConnectionOpen(version=2, address=name))
    if whence == mlm.LATEST:
        broker.receive(session, mlm.StreamRead(LOCAL, pattern))
    else:
        broker.receive(session, mlm.StreamReadFrom(LOCAL, pattern, whence, 0))
    return session


def origin_seqs(session: InMemorySession) -> list[int]:
    """The origin sequence numbers of the ordinary records C{session} got."""
    return [r.origin_seq for r in session.records if r.subject != NOTICE]


def notice(record: StreamRecord) -> tuple[str, str, int, int]:
    """(origin, stream, first, last) of a notice."""
    body = json.loads(record.content[0])
    return body["origin"], body["stream"], body["first"], body["last"]


def story(session: InMemorySession) -> list[object]:
    """What C{session} got: origin sequence numbers, and (first, last) for a notice."""
    return [list(notice(r)[2:]) if r.subject == NOTICE else r.origin_seq for r in session.records]


class MemoryRepairs:
    """
    A L{inbound.Repairs} that reads nothing: it records each repair the
    bridge starts and stops (the flow's key and mark then); the test plays
    the origin, calling the bridge's repaired/lost/failed itself.
    """

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.stopped: list[tuple[str, int]] = []

    def start(self, flow: Flow, bridge: InboundBridge) -> None:
        self.started.append((flow.key, flow.mark))

    def stop(self, flow: Flow) -> None:
        self.stopped.append((flow.key, flow.mark))


class BridgeMixin:
    """An inbound bridge into stream L{LOCAL} of C{self.broker}."""

    broker: Broker
    clock: IReactorTime
    max_held_bytes = inbound.MAX_HELD_BYTES

    def make_bridge(self, marks: inbound.Marks | None = None) -> InboundBridge:
        self.marks: inbound.Marks = {} if marks is None else marks
        self.repairs = MemoryRepairs()
        self.bridge = InboundBridge(
            self.clock, self.broker, LOCAL, URL, self.marks, self.repairs, self.max_held_bytes
        )
        return self.bridge

    def receive(self, *records: tuple[int, int]) -> None:
        """Origin records (seq, prev), as one batch from the group."""
        self.bridge.received([frames(seq, prev) for seq, prev in records])

    @property
    def flow(self) -> Flow:
        return self.bridge.flows[ORIGIN, ORIGIN_STREAM]

    def repair(self, *seqs: int) -> None:
        """The repair reads origin records C{seqs}."""
        for seq in seqs:
            self.bridge.repaired(
                self.flow, seq, seq + 0.5, "writer", f"temp.{seq}", [f"r{seq}".encode()]
            )


class InboundTests(BridgeMixin, SynchronousTestCase):
    """A bridge into a broker without a journal, and an in-memory reader."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock, BrokerConfig(timeout=5.0))
        self.make_bridge()
        self.reader = open_reader(self.broker, "reader")

    def test_inOrderRecordsWritten(self) -> None:
        """
        Records that follow one another are written at once, in order, as
        the origin wrote them, with the origin key "ORIGIN/STREAM" and their
        origin sequence number; the mark follows them.
        """
        self.receive((1, 0), (2, 1))
        self.receive((3, 2))
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        first = self.reader.records[0]
        self.assertEqual(
            (first.stream, first.seq, first.sender, first.subject, first.content),
            (LOCAL, 1, "writer", "temp.1", (b"r1",)),
        )
        self.assertEqual((first.origin, first.timestamp), (KEY, 1.5))
        self.assertEqual({r.origin for r in self.reader.records}, {KEY})
        self.assertEqual(self.flow.mark, 3)
        self.assertEqual(self.marks, {(LOCAL, KEY): 3})
        self.assertEqual((self.bridge.counters.received, self.bridge.counters.written), (3, 3))
        self.assertEqual(self.repairs.started, [])

    def pack(self, *records: tuple[int, int]) -> list[bytes]:
        """Origin records (seq, prev) in one pack, as the group brings them."""
        source = multicast.encode_source(ORIGIN, ENDPOINT, ORIGIN_STREAM, "")
        encoded = [
            multicast.encode_record(
                seq, prev, seq * 1_000_000 + 500_000, "writer", f"temp.{seq}", [f"r{seq}".encode()]
            )
            for seq, prev in records
        ]
        return multicast.encode_pack(source, encoded)

    def test_packWritten(self) -> None:
        """
        The records of a pack are taken one by one, in order, as if each
        had come alone: written with their own numbers, sender, subject,
        time and content; a record of a later pack that does not follow
        the last one written starts a repair from there.
        """
        self.bridge.received([self.pack((1, 0), (2, 1), (3, 2))])
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        self.assertEqual(
            [(r.subject, r.content, r.timestamp) for r in self.reader.records],
            [(f"temp.{n}", (f"r{n}".encode(),), n + 0.5) for n in (1, 2, 3)],
        )
        self.assertEqual((self.bridge.counters.received, self.bridge.counters.written), (3, 3))
        self.bridge.received([self.pack((5, 4), (6, 5))])
        self.assertEqual(self.repairs.started, [(KEY, 3)])
        self.assertEqual(self.bridge.counters.held, 2)
        self.repair(4)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6])
        self.assertEqual(self.repairs.stopped, [(KEY, 6)])

    def test_malformedPackDropped(self) -> None:
        """
        A pack cut short, or whose content lengths go past its end, is
        dropped whole (counted once), raising nothing; the loss shows at
        the next pack and is repaired.
        """
        self.receive((1, 0))
        [whole] = self.pack((2, 1), (3, 2))
        self.bridge.received([[whole[:-3]], [whole[:-6] + b"\0\0\0\x09" + whole[-2:]]])
        self.assertEqual(self.bridge.counters.malformed, 2)
        self.assertEqual(origin_seqs(self.reader), [1])
        self.bridge.received([self.pack((4, 3))])
        self.assertEqual(self.repairs.started, [(KEY, 1)])
        self.repair(2, 3)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4])

    def test_otherVersionDropped(self) -> None:
        """
        A message of version 1 (a record per message, before packs) is
        dropped, counted as malformed and as another version, and logged
        saying so; the bridge goes on.
        """
        events = capture_log(self)
        old = struct.pack(">2sBQQQ", b"MB", 1, 1, 0, 1_500_000)
        old += b"".join(bytes((len(s),)) + s for s in (ORIGIN.encode(), b"", b"weather", b"", b""))
        old += bytes((6,)) + b"temp.1"
        self.bridge.received([[old, b"r1"]])
        counters = self.bridge.counters
        self.assertEqual((counters.malformed, counters.other_version), (1, 1))
        self.assertEqual((counters.written, self.bridge.flows), (0, {}))
        [said] = [formatEvent(e) for e in events if "another bridge protocol" in formatEvent(e)]
        self.assertIn("version 1: this broker speaks version 2", said)
        self.receive((1, 0))
        self.assertEqual(origin_seqs(self.reader), [1])

    def beat(self, last: int, origin: str = ORIGIN) -> None:
        """A beat of the origin's bridge: C{last} is the last number it published."""
        beat = header(last, 0, origin=origin, sender="", subject="")._replace(beat=True)
        self.bridge.received([multicast.encode(beat, [])])

    def test_beatRevealsALostTail(self) -> None:
        """
        A beat naming a number above the mark means the tail of a burst was
        lost: a repair reads it, though no later record came. A beat at the
        mark, or for a flow not joined yet, changes nothing; none is written.
        """
        self.beat(5, origin="other")
        self.receive((1, 0), (2, 1))
        self.beat(2)
        self.assertEqual((self.repairs.started, self.bridge.counters.beats), ([], 2))
        self.beat(4)
        self.assertEqual(self.repairs.started, [(KEY, 2)])
        self.bridge.repaired(self.flow, 3, 1.0, "w", "s", [b""])
        self.assertEqual(self.repairs.stopped, [])
        self.bridge.repaired(self.flow, 4, 1.0, "w", "s", [b""])
        self.assertEqual(self.repairs.stopped, [(KEY, 4)])
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4])

    def test_shedWhilePausedThenRepaired(self) -> None:
        """
        While paused (the journal behind) what arrives is shed, counted and
        not written; resumed, one repair reads what was shed, from the mark.
        A flow first heard while paused is not repaired: it joins later.
        """
        self.receive((1, 0))
        self.bridge.pause()
        self.receive((2, 1), (3, 2))
        self.bridge.received([frames(7, 0, origin="other")])
        self.assertEqual((self.bridge.counters.shed, origin_seqs(self.reader)), (3, [1]))
        self.assertEqual(self.repairs.started, [])
        self.bridge.resume()
        self.assertEqual(self.repairs.started, [(KEY, 1)])
        self.bridge.repaired(self.flow, 2, 1.0, "w", "s", [b""])
        self.bridge.repaired(self.flow, 3, 1.0, "w", "s", [b""])
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        self.assertEqual(self.repairs.stopped, [(KEY, 3)])

    def test_patternHolesAreNoLoss(self) -> None:
        """
        With a pattern the origin's numbers have holes: a record whose
        C{prev} is the last one written follows it, whatever its own number.
        """
        self.receive((2, 0), (5, 2), (9, 5))
        self.assertEqual(origin_seqs(self.reader), [2, 5, 9])
        self.assertEqual(self.repairs.started, [])

    def test_duplicatesDropped(self) -> None:
        """A record at or below the mark is dropped and counted, never written again."""
        self.receive((1, 0), (2, 1), (2, 1), (1, 0))
        self.receive((3, 2), (3, 2))
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        self.assertEqual(self.bridge.counters.duplicates, 3)

    def test_firstRecordTakenWhateverItsPrev(self) -> None:
        """
        A flow's first record is taken whatever came before it (a receiver
        joins live), with no repair; the records after it follow it.
        """
        self.receive((50, 49), (51, 50))
        self.assertEqual(origin_seqs(self.reader), [50, 51])
        self.assertEqual(self.repairs.started, [])

    def test_gapHoldsAndRepairs(self) -> None:
        """
        A record whose C{prev} is past the mark is held, with those after
        it, and one repair starts from the mark (with the endpoint and
        pattern of the header); repaired and held records are then written
        in order, each once, and the repair stops as the held ones are
        written.
        """
        self.receive((1, 0))
        self.receive((4, 3), (5, 4))
        self.receive((6, 5))
        self.assertEqual(origin_seqs(self.reader), [1])
        self.assertEqual(self.repairs.started, [(KEY, 1)])
        self.assertEqual((self.flow.endpoint, self.flow.repairing), (ENDPOINT, True))
        self.assertEqual(self.bridge.counters.held, 3)
        self.repair(2)
        self.assertEqual(origin_seqs(self.reader), [1, 2])
        self.assertEqual(self.repairs.stopped, [])
        self.repair(3)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6])
        self.assertEqual(self.repairs.stopped, [(KEY, 6)])
        self.assertFalse(self.flow.repairing)
        counters = self.bridge.counters
        self.assertEqual((counters.repairs, counters.repaired, counters.written), (1, 2, 6))
        # What the repair still hands over once stopped is ignored; the next
        # live record follows.
        self.repair(4, 5, 6, 7)
        self.receive((7, 6))
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6, 7])
        self.assertEqual(self.marks, {(LOCAL, KEY): 7})

    def test_lateRecordWaitsWhileRepairing(self) -> None:
        """
        While a repair runs, even a record that follows the mark (one the
        group brings late) is held: it is written once, in order.
        """
        self.receive((1, 0), (3, 2))
        self.receive((2, 1))
        self.assertEqual(origin_seqs(self.reader), [1])
        self.repair(2)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        self.assertEqual(self.bridge.counters.written, 3)
        self.assertEqual(self.repairs.stopped, [(KEY, 3)])

    def test_restartedSenderWaitsForTheRepair(self) -> None:
        """
        A record without C{prev} (its bridge restarted) after others is
        taken at once only if it is the mark's next number; otherwise it
        waits until the repair has read up to it, and is written once.
        """
        self.receive((1, 0), (2, 0))
        self.assertEqual(origin_seqs(self.reader), [1, 2])
        self.receive((6, 0))
        self.assertEqual(self.repairs.started, [(KEY, 2)])
        self.repair(3, 4)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4])
        self.repair(5)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6])
        self.assertEqual(self.repairs.stopped, [(KEY, 6)])

    def test_restartedSenderWithPatternHoles(self) -> None:
        """
        With a pattern, the repair may bring the record without C{prev}
        itself (the numbers before it did not match): it is written once,
        from the repair, and the held copy is dropped.
        """
        self.receive((1, 0), (9, 0))
        self.repair(4, 9)
        self.assertEqual(origin_seqs(self.reader), [1, 4, 9])
        self.assertEqual(self.repairs.stopped, [(KEY, 9)])
        self.assertEqual(self.bridge.counters.written, 3)

    def test_failedWritesNoticesAndFlushes(self) -> None:
        """
        A repair that fails writes a notice for each hole before a held
        record, then the held records, in order; the repair is stopped and
        the next records are live again.
        """
        self.receive((1, 0), (4, 3), (5, 4), (8, 7))
        self.repair(2)
        self.bridge.failed(self.flow, "unreachable")
        self.assertEqual(story(self.reader), [1, 2, [3, 3], 4, 5, [6, 7], 8])
        self.assertEqual(self.repairs.stopped, [(KEY, 8)])
        counters = self.bridge.counters
        self.assertEqual((counters.notices, counters.lost), (2, 3))
        [first, _] = [r for r in self.reader.records if r.subject == NOTICE]
        self.assertEqual(notice(first), (ORIGIN, ORIGIN_STREAM, 3, 3))
        self.assertIn("not repaired: unreachable", json.loads(first.content[0])["reason"])
        self.assertEqual((first.origin, first.origin_seq), (KEY, 3))
        self.receive((9, 8))
        self.assertEqual(origin_seqs(self.reader)[-1], 9)
        self.assertEqual(self.marks, {(LOCAL, KEY): 9})

    def test_noticeReachesEveryReader(self) -> None:
        """
        A notice (lost() or failed()) reaches every live reader of the
        stream, also one whose pattern does not match its subject.
        """
        picky = open_reader(self.broker, "picky", r"^temp\.")
        self.receive((1, 0), (5, 4))
        self.bridge.lost(self.flow, 2, 4)
        self.repair(4)
        for reader in (self.reader, picky):
            self.assertEqual(story(reader), [1, [2, 3], 4, 5])
        self.assertEqual(picky.records[1].subject, NOTICE)
        self.assertIn("retention", json.loads(picky.records[1].content[0])["reason"])

    def test_emptyEndpointFailsAtOnce(self) -> None:
        """
        L{TcpRepairs} fails a repair at once when the origin names no
        endpoint: the hole is reported, the held record written.
        """
        repairs = TcpRepairs(_reactor, stall=60.0)
        bridge = InboundBridge(self.clock, self.broker, LOCAL, URL, {}, repairs)
        bridge.received([frames(1, 0, endpoint=""), frames(4, 3, endpoint="")])
        self.assertEqual(story(self.reader), [1, [2, 3], 4])
        reason = json.loads(self.reader.records[1].content[0])["reason"]
        self.assertIn("no endpoint", reason)
        self.assertEqual(repairs.started, 0)
        self.assertFalse(bridge.flows[ORIGIN, ORIGIN_STREAM].repairing)
        bridge.close()

    def test_malformedDroppedAndCounted(self) -> None:
        """
        Messages that are not bridge records are dropped and counted,
        raising nothing; the records around them are written.
        """
        good = frames(1, 0)
        bad_version = good[0][:2] + b"\x09" + good[0][3:]
        self.bridge.received(
            [
                [],
                [b"XX"],
                [b"MB" + b"\x01" * 10],
                [bad_version, b"x"],
                [good[0] + b"extra"],
                multicast.encode(header(0, 0), [b"x"]),
                multicast.encode(header(3, 3), [b"x"]),
                good,
                frames(2, 1),
            ]
        )
        self.assertEqual(self.bridge.counters.malformed, 7)
        self.assertEqual(origin_seqs(self.reader), [1, 2])
        self.assertEqual(self.bridge.counters.received, 9)

    def test_tooManyFlowsRefused(self) -> None:
        """
        Past L{MAX_FLOWS} origin streams a new one's records are refused
        (counted); the flows already heard go on.
        """
        self.bridge.received([frames(1, 0, origin=f"O{i}") for i in range(MAX_FLOWS + 1)])
        self.assertEqual(len(self.bridge.flows), MAX_FLOWS)
        self.assertEqual(self.bridge.counters.refused, 1)
        self.assertNotIn((f"O{MAX_FLOWS}", ORIGIN_STREAM), self.bridge.flows)
        self.bridge.received([frames(2, 1, origin="O0")])
        self.assertEqual(self.bridge.flows["O0", ORIGIN_STREAM].mark, 2)
        self.assertEqual(len(self.reader.records), MAX_FLOWS + 1)

    def test_closeStopsRepairs(self) -> None:
        """
        close() stops every repair under way and leaves the broker; what
        a repair hands over afterwards is ignored.
        """
        self.receive((1, 0), (3, 2))
        flow = self.flow
        connection = self.broker.registry.get(self.bridge.session)
        self.assertIsNotNone(connection)
        self.bridge.close()
        self.assertEqual(self.repairs.stopped, [(KEY, 1)])
        self.assertFalse(flow.repairing)
        self.assertIsNone(self.broker.registry.get(self.bridge.session))
        self.repair(2)
        self.bridge.lost(flow, 2, 3)
        self.bridge.failed(flow, "too late")
        self.assertEqual(origin_seqs(self.reader), [1])

    def test_marksShared(self) -> None:
        """
        The marks are written to the shared marks as records are written,
        under (local stream, flow key); a new bridge given them continues
        from them (a restart): what it had is a duplicate, a gap after it
        is repaired from the mark.
        """
        self.receive((1, 0), (2, 1), (3, 2))
        self.assertEqual(self.marks, {(LOCAL, KEY): 3})
        marks = self.marks
        self.bridge.close()
        self.make_bridge(marks)
        self.receive((2, 1), (3, 2), (4, 3))
        self.assertEqual(self.bridge.counters.duplicates, 2)
        self.receive((7, 6))
        self.assertEqual(self.repairs.started, [(KEY, 4)])
        self.repair(5, 6)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6, 7])
        self.assertEqual(marks, {(LOCAL, KEY): 7})


class HeldBytesTests(BridgeMixin, SynchronousTestCase):
    """A bridge that may hold two small records (C{r1}..C{r9}: 202 bytes each)."""

    max_held_bytes = 500

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock, BrokerConfig(timeout=5.0))
        self.make_bridge()
        self.reader = open_reader(self.broker, "reader")

    def test_overflowRepaired(self) -> None:
        """
        Past the held bytes' bound records are dropped (counted) and the
        repair brings them too: it goes on beyond the held ones, until the
        last record received is written; the group bringing those again
        brings duplicates, dropped.
        """
        self.receive((1, 0), (3, 2), (4, 3), (5, 4), (6, 5), (7, 6))
        counters = self.bridge.counters
        self.assertEqual((counters.held, counters.overflow), (2, 3))
        self.repair(2)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4])
        self.assertEqual(self.repairs.stopped, [])
        self.repair(5, 6, 7)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6, 7])
        self.assertEqual(self.repairs.stopped, [(KEY, 7)])
        # The group may bring them again: duplicates.
        self.receive((6, 5), (7, 6), (8, 7))
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5, 6, 7, 8])
        self.assertEqual(counters.duplicates, 2)

    def test_nothingHeldStillRepaired(self) -> None:
        """
        A record dropped with nothing held (it alone is past the bound) is
        still brought by the repair, which stops once it is written.
        """
        self.receive((1, 0))
        self.bridge.received([frames(3, 2, [b"x" * 400])])
        self.assertEqual((self.bridge.counters.held, self.bridge.counters.overflow), (0, 1))
        self.assertEqual(self.repairs.started, [(KEY, 1)])
        self.repair(2)
        self.assertEqual(self.repairs.stopped, [])
        self.repair(3)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3])
        self.assertEqual(self.repairs.stopped, [(KEY, 3)])

    def test_overflowReportedWhenRepairFails(self) -> None:
        """
        A repair that fails reports the records dropped past the bound as
        lost, after writing the held ones: none is silently missing.
        """
        self.receive((1, 0), (3, 2), (4, 3), (5, 4), (6, 5))
        self.bridge.failed(self.flow, "unreachable")
        self.assertEqual(story(self.reader), [1, [2, 2], 3, 4, [5, 6]])
        self.assertEqual(self.marks, {(LOCAL, KEY): 6})
        # What was held is released: the bound holds two again.
        self.receive((9, 8), (10, 9), (11, 10))
        self.assertEqual(self.bridge.counters.held, 4)


class LimitTests(BridgeMixin, SynchronousTestCase):
    """A bridge into a broker with small limits."""

    def setUp(self) -> None:
        self.clock = Clock()
        limits = Limits(max_message_bytes=100, max_frames=4, max_subject=20, max_address=10)
        self.broker = Broker(self.clock, BrokerConfig(timeout=5.0, limits=limits))
        self.make_bridge()
        self.reader = open_reader(self.broker, "reader")

    def test_overLimitsRefused(self) -> None:
        """
        A record over this broker's limits (bytes, frames, subject, sender)
        is refused and counted; the records within them are written.
        """
        self.bridge.received(
            [
                frames(1, 0),
                frames(2, 1, [b"x" * 101]),
                frames(2, 1, [b"a", b"b", b"c", b"d"]),
                frames(2, 1, subject="s" * 21),
                frames(2, 1, sender="w" * 11),
                frames(2, 1, [b"x" * 50, b"y" * 50], subject="s" * 20, sender="w" * 10),
            ]
        )
        self.assertEqual(self.bridge.counters.refused, 4)
        self.assertEqual(origin_seqs(self.reader), [1, 2])

    def test_overLimitsFromTheRepairRefused(self) -> None:
        """
        A record refused live leaves a hole the repair reads; what it
        reads is held to the same limits: refused again, and reported
        lost, never written.
        """
        self.receive((1, 0))
        self.bridge.received([frames(2, 1, [b"x" * 101]), frames(3, 2)])
        self.assertEqual(self.repairs.started, [(KEY, 1)])
        self.bridge.repaired(self.flow, 2, 2.5, "writer", "temp.2", [b"x" * 101])
        self.assertEqual(story(self.reader), [1, [2, 2], 3])
        self.assertEqual(self.bridge.counters.refused, 2)
        self.assertEqual(self.repairs.stopped, [(KEY, 3)])


class JournalTests(BridgeMixin, SynchronousTestCase):
    """A bridge into a broker with a real journal (a SQLite file)."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = BrokerHarness(BrokerConfig(timeout=60.0), self.path)
        self.addCleanup(lambda: self.h.close())
        self.clock = self.h.clock
        self.broker = self.h.broker
        self.make_bridge()

    def test_noticeToEveryReaderLiveAndReplayed(self) -> None:
        """
        Records retention removed at the origin are reported in a notice
        (origin, stream, first, last) that every reader gets, live and when
        reading from the earliest, also one whose pattern does not match
        its subject; the repair then goes on from what the origin has.
        """
        live = open_reader(self.broker, "live", r"^temp\.")
        self.receive((1, 0), (7, 6))
        self.bridge.lost(self.flow, 2, 5)
        self.repair(5, 6)
        self.assertEqual(story(live), [1, [2, 4], 5, 6, 7])
        self.assertEqual(self.repairs.stopped, [(KEY, 7)])
        self.h.settle()
        for name, pattern in [("all", ""), ("temp", r"^temp\."), ("wind", r"^wind\.")]:
            replay = open_reader(self.broker, name, pattern, mlm.EARLIEST)
            self.h.settle()
            expected = [1, [2, 4], 5, 6, 7] if pattern != r"^wind\." else [[2, 4]]
            self.assertEqual(story(replay), expected, name)
            [gap] = [r for r in replay.records if r.subject == NOTICE]
            self.assertEqual((gap.seq, gap.origin, gap.origin_seq), (2, KEY, 4))
        self.assertEqual(self.bridge.counters.lost, 3)

    def test_lostKeepsHeldRecords(self) -> None:
        """
        Held records that retention's loss reaches past are still written:
        only the numbers the bridge has no record of are reported lost.
        """
        live = open_reader(self.broker, "live")
        self.receive((1, 0), (4, 3), (5, 4), (8, 7))
        self.bridge.lost(self.flow, 2, 7)
        self.repair(7)
        self.assertEqual(story(live), [1, [2, 3], 4, 5, [6, 6], 7, 8])
        self.assertEqual(self.repairs.stopped, [(KEY, 8)])

    def test_restartContinuesFromJournalMarks(self) -> None:
        """
        After a restart, the journal's origin marks (from the records and
        notices it holds) let a new bridge continue: what it wrote before
        is a duplicate, and the next gap repairs from the mark.
        """
        self.receive((1, 0), (2, 1), (5, 4))
        self.bridge.failed(self.flow, "unreachable")
        self.assertEqual(self.marks, {(LOCAL, KEY): 5})
        self.h.settle()
        self.bridge.close()
        self.h.close()
        self.h = BrokerHarness(BrokerConfig(timeout=60.0), self.path)
        assert self.h.journal is not None
        self.clock = self.h.clock
        self.broker = self.h.broker
        marks = self.h.journal.origin_marks()
        self.assertEqual(marks, {(LOCAL, KEY): 5})
        self.make_bridge(marks)
        self.receive((4, 3), (5, 4), (6, 5), (8, 7))
        self.assertEqual(self.bridge.counters.duplicates, 2)
        self.assertEqual(self.repairs.started, [(KEY, 6)])
        self.repair(7)
        replay = open_reader(self.broker, "replay", "", mlm.EARLIEST)
        self.h.settle()
        self.assertEqual(story(replay), [1, 2, [3, 4], 5, 6, 7, 8])
        self.assertEqual([r.seq for r in replay.records], list(range(1, 8)))


# Repairs over TCP


def zmq_sockets() -> set[object]:
    """The ZeroMQ sockets the reactor reads."""
    return {r for r in _reactor.getReaders() if isinstance(r, ZmqSocket)}


class TcpRepairsTests(TestCase):
    """L{TcpRepairs} of a bridge into a model broker, in the test's reactor."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.clock = _clock
        self.broker = Broker(_clock, BrokerConfig(timeout=60.0))
        self.reader = open_reader(self.broker, "reader")
        self.options = ClientOptions(timeout=0.5, heartbeat=0.1)

    def start_origin(self, journal: JournalConfig | None = None) -> str:
        """A broker with a journal on tcp://127.0.0.1 (any port): its endpoint."""
        settings = Settings(
            endpoints=("tcp://127.0.0.1:*",),
            timeout_ms=3000,
            data_dir=Path(self.mktemp()),
            journal_config=journal or JournalConfig(),
        )
        origin: MultiService = makeBrokerService(settings, _reactor, self.context)
        origin.startService()
        self.addCleanup(origin.stopService)
        router = origin.getServiceNamed("router")
        assert isinstance(router, RouterService)
        return router.bound[0]

    def bridge(self, stall: float) -> tuple[InboundBridge, TcpRepairs]:
        repairs = TcpRepairs(_reactor, self.context, self.options, stall)
        bridge = InboundBridge(_clock, self.broker, LOCAL, URL, {}, repairs)
        # Cleanups run last first: the repairs' clients closed before the origin stops.
        self.addCleanup(repairs.closed)
        self.addCleanup(bridge.close)
        return bridge, repairs

    async def no_client_left(self, sockets: set[object]) -> None:
        """Wait until the repair's client has closed its socket (C{sockets}: those before)."""
        await wait_for(lambda: zmq_sockets() <= sockets)

    async def write(self, endpoint: str, count: int, subject: Callable[[int], str]) -> None:
        """Write C{count} records to the origin's stream: C{r1}, C{r2}..."""
        writer = await MalamuteClient.connect(
            _reactor, endpoint, "writer", context=self.context, heartbeat=0.1, timeout=2.0
        )
        await writer.set_producer(ORIGIN_STREAM)
        for seq in range(1, count + 1):
            writer.send(subject(seq), [f"r{seq}".encode(), b"more"])
        await writer.remove_consumer("barrier")  # a round trip: all written
        await writer.close()

    async def first_retained(self, endpoint: str) -> int:
        """The sequence number of the first record the origin's stream still has."""
        probe = await MalamuteClient.connect(
            _reactor, endpoint, context=self.context, heartbeat=0.1, timeout=2.0
        )
        await probe.set_consumer(ORIGIN_STREAM, "", mlm.EARLIEST)
        first = await probe.recv()
        await probe.close()
        assert first.sequence is not None
        return first.sequence

    async def test_repairWaitsForTheJournal(self) -> None:
        """
        A repair reads with credit: the origin sends at most a window of
        records ahead, and none more while the bridge sheds (this broker's
        journal is behind, its read gate closed); once it takes records
        again the repair goes on to the end, each record once, in order.
        """
        self.patch(repair_module, "WINDOW", 4)
        endpoint = self.start_origin()
        await self.write(endpoint, 30, lambda seq: f"temp.{seq}")
        bridge, _ = self.bridge(stall=5.0)
        bridge.received(
            [
                frames(1, 0, [b"r1", b"more"], endpoint=endpoint, pattern=""),
                frames(30, 29, [b"r30", b"more"], endpoint=endpoint, pattern=""),
            ]
        )
        bridge.pause()  # before the repair's client has even connected
        flow = bridge.flows[ORIGIN, ORIGIN_STREAM]
        await wait_for(lambda: flow.mark >= 5)
        await deferLater(_clock, 0.3, lambda: None)
        held_back = flow.mark
        self.assertLessEqual(held_back, 1 + 4 + 2)  # a window, and what it granted
        self.assertTrue(flow.repairing)
        bridge.resume()
        await wait_for(lambda: not flow.repairing)
        self.assertEqual(origin_seqs(self.reader), list(range(1, 31)))

    async def test_repairReadsTheMissingRecords(self) -> None:
        """
        A repair reads the origin's stream from the mark on, with the
        pattern of the header, at its endpoint: the bridge writes exactly
        the records it missed (sender, subject, content as written there),
        then the held one, and the repair's client leaves.
        """
        endpoint = self.start_origin()
        await self.write(endpoint, 10, lambda seq: f"temp.{seq}" if seq % 2 else f"wind.{seq}")
        sockets = zmq_sockets()
        bridge, repairs = self.bridge(stall=5.0)
        temp = r"^temp\."
        bridge.received(
            [
                frames(1, 0, [b"r1", b"more"], endpoint=endpoint, pattern=temp),
                frames(7, 5, [b"r7", b"more"], endpoint=endpoint, pattern=temp),
            ]
        )
        flow = bridge.flows[ORIGIN, ORIGIN_STREAM]
        self.assertTrue(flow.repairing)
        await wait_for(lambda: not flow.repairing)
        self.assertEqual(origin_seqs(self.reader), [1, 3, 5, 7])
        self.assertEqual(
            [(r.sender, r.subject, r.content) for r in self.reader.records[1:3]],
            [("writer", "temp.3", (b"r3", b"more")), ("writer", "temp.5", (b"r5", b"more"))],
        )
        self.assertLess(abs(self.reader.records[1].timestamp - time.time()), 60)
        self.assertEqual((repairs.started, bridge.counters.repaired), (1, 2))
        self.assertEqual(bridge.counters.notices, 0)
        await self.no_client_left(sockets)
        self.assertEqual(origin_seqs(self.reader), [1, 3, 5, 7])

    async def test_closedWaitsForTheClients(self) -> None:
        """
        Once a repair is done, L{TcpRepairs.closed} fires only when its
        client has closed: no socket and no timer of it is left (a broker
        stopping waits for it).
        """
        endpoint = self.start_origin()
        await self.write(endpoint, 5, lambda seq: f"temp.{seq}")
        sockets = zmq_sockets()
        bridge, repairs = self.bridge(stall=5.0)
        bridge.received([frames(1, 0, endpoint=endpoint), frames(5, 4, endpoint=endpoint)])
        flow = bridge.flows[ORIGIN, ORIGIN_STREAM]
        await wait_for(lambda: not flow.repairing)
        await repairs.closed()
        self.assertLessEqual(zmq_sockets(), sockets)
        self.assertEqual(origin_seqs(self.reader), [1, 2, 3, 4, 5])

    async def test_retentionLossReported(self) -> None:
        """
        What the origin's retention removed reaches the bridge as a gap:
        a notice says which numbers are lost, and the repair goes on with
        what the origin still has.
        """
        retention = {ORIGIN_STREAM: RetentionPolicy(max_count=3)}
        endpoint = self.start_origin(
            JournalConfig(per_stream_retention=retention, prune_interval_s=0.05)
        )
        await self.write(endpoint, 10, lambda seq: f"temp.{seq}")
        end = time.monotonic() + 5
        while await self.first_retained(endpoint) != 8:
            self.assertLess(time.monotonic(), end, "the origin never pruned")
            await deferLater(_clock, 0.05)
        sockets = zmq_sockets()
        bridge, _ = self.bridge(stall=5.0)
        bridge.received([frames(1, 0, endpoint=endpoint), frames(10, 9, endpoint=endpoint)])
        flow = bridge.flows[ORIGIN, ORIGIN_STREAM]
        await wait_for(lambda: not flow.repairing)
        self.assertEqual(story(self.reader), [1, [2, 7], 8, 9, 10])
        self.assertIn("retention", json.loads(self.reader.records[1].content[0])["reason"])
        self.assertEqual(bridge.counters.lost, 6)
        await self.no_client_left(sockets)

    async def test_stallFailsTheRepair(self) -> None:
        """
        A repair against an endpoint nobody answers fails after C{stall}
        seconds without a record: the hole is reported in a notice, the
        held record written, and the repair's client, still connecting,
        closed then (not at its own connect timeout).
        """
        sockets = zmq_sockets()
        self.options = ClientOptions(timeout=20.0, heartbeat=0.1)
        bridge, repairs = self.bridge(stall=0.2)
        nobody = "tcp://127.0.0.1:1"
        started = time.monotonic()
        bridge.received([frames(1, 0, endpoint=nobody), frames(4, 3, endpoint=nobody)])
        await wait_for(lambda: bridge.counters.notices == 1)
        # The watchdog (0.2 s), not the client's 20 s timeout, failed it; the
        # client, still connecting, left with it (no_client_left below).
        self.assertLess(time.monotonic() - started, 10.0)
        self.assertEqual(story(self.reader), [1, [2, 3], 4])
        reason = json.loads(self.reader.records[1].content[0])["reason"]
        self.assertIn("tcp://127.0.0.1:1 sent nothing for 0.2s", reason)
        self.assertFalse(bridge.flows[ORIGIN, ORIGIN_STREAM].repairing)
        self.assertEqual(repairs.started, 1)
        await self.no_client_left(sockets)
        self.assertEqual(bridge.counters.notices, 1)
