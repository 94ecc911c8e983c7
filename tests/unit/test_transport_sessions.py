"""
Tests for L{malamute_pack.transport.sessions} and
L{malamute_pack.transport.dialects}: the MLM session table (decoding, size
limits, which sessions are kept, the dialect a CONNECTION_OPEN selects) and
what each dialect encodes and holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.receipts import Receipts
from malamute_pack.broker.session import Hold
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import StreamRecord
from malamute_pack.transport.dialects import MlmVersion1, MlmVersion2
from malamute_pack.transport.sessions import MlmSessions


def letter(kind: Kind = Kind.MAILBOX, tracker: str = "") -> Letter:
    return Letter(
        id=9, kind=kind, sender="s", address="a", subject="subj", tracker=tracker, content=[b"x"]
    )


class SessionTableTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[tuple[bytes, Sequence[bytes]]] = []
        self.broker = Broker(Clock(), BrokerConfig())
        self.broker = Broker(Clock(), BrokerConfig(limits=Limits(max_address=10)))
        self.table = MlmSessions(self.broker, self.record, Limits(max_message_bytes=64))

    def record(self, route: bytes, frames: Sequence[bytes]) -> bool:
        self.sent.append((route, frames))
        return True

    def replies(self, route: bytes) -> list[mlm.Message]:
        found = [mlm.decode(frames) for to, frames in self.sent if to == route]
        self.sent = [(to, frames) for to, frames in self.sent if to != route]
        return found

    def test_strangerNotKept(self) -> None:
        """A routing id that never opens is answered but leaves nothing behind."""
        self.table.receive(b"x", mlm.encode(mlm.ConnectionPing()))
        [reply] = self.replies(b"x")
        self.assertIsInstance(reply, mlm.Error)
        self.assertEqual(len(self.table), 0)
        self.assertEqual(self.table.received, 1)

    def test_keptWhileOpen(self) -> None:
        """A session is kept from its accepted OPEN to its CLOSE."""
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(address="a")))
        self.assertEqual(len(self.table), 1)
        self.table.receive(b"a", mlm.encode(mlm.ConnectionClose()))
        self.assertEqual(len(self.table), 0)
        self.assertEqual(self.replies(b"a"), [mlm.Ok(), mlm.Ok()])

    def test_openSelectsTheDialect(self) -> None:
        """CONNECTION_OPEN with version 2 makes the session speak version 2."""
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(version=1, address="a")))
        self.assertEqual(self.table.session(b"a").dialect.version, 1)
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(version=2, address="a")))
        self.assertEqual(self.table.session(b"a").dialect.version, 2)

    def test_refusedOpenKeepsTheDialect(self) -> None:
        """An OPEN the broker refuses leaves the session's dialect as it was."""
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(version=1, address="a")))
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(version=2, address="x" * 20)))
        self.assertEqual(self.table.session(b"a").dialect.version, 1)
        self.assertIsInstance(self.replies(b"a")[-1], mlm.Error)

    def test_malformed(self) -> None:
        """Input that does not decode gets ERROR 500 saying why, and is counted."""
        self.table.receive(b"a", [b"\xaa\xa8\xff"])
        [reply] = self.replies(b"a")
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)
        self.assertIn("unknown message id 255", reply.status_reason)
        self.assertEqual(self.table.malformed, 1)

    def test_oversized(self) -> None:
        """A message over the size limit is refused, with ERROR where it has a reply."""
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(address="a")))
        self.replies(b"a")
        self.table.receive(b"a", mlm.encode(mlm.StreamRead("s", "p" * 80)))
        [reply] = self.replies(b"a")
        assert isinstance(reply, mlm.Error)
        self.assertIn("too large", reply.status_reason)

    def test_invalidNameRefusedAtTheDoor(self) -> None:
        """
        A stream name that is not valid UTF-8 gets ERROR 300 saying so; the
        connection stays open and nothing about the name reaches the model.
        """
        self.table.receive(b"a", mlm.encode(mlm.ConnectionOpen(address="a")))
        self.replies(b"a")
        self.table.receive(b"a", [b"\xaa\xa8\x05\x04\xffbad"])  # STREAM_WRITE
        [reply] = self.replies(b"a")
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.FAILED)
        self.assertIn("invalid stream: not valid UTF-8", reply.status_reason)
        self.assertEqual(self.broker.streams.streams, {})
        self.assertEqual(self.table.invalid, 1)
        self.table.receive(b"a", mlm.encode(mlm.ConnectionPing()))
        self.assertEqual(self.replies(b"a"), [mlm.ConnectionPong()])

    def test_invalidLetterGetsItsReceipt(self) -> None:
        """
        A letter whose address is not valid UTF-8 is refused with STORED 300
        for a version 2 sender, in its place among its other sends.
        """
        self.table.receive(b"s", mlm.encode(mlm.ConnectionOpen(version=2, address="s")))
        self.replies(b"s")
        good = mlm.encode(mlm.MailboxSend("bob", "1", "t1", 0, [b"x"]))
        bad = [b"\xaa\xa8\x09\x02\xc3\x28\x01" + b"2" + b"\x02t2" + bytes(4), b"y"]
        self.table.receive(b"s", good)
        self.table.receive(b"s", bad)
        stored = self.replies(b"s")
        self.assertEqual(
            [(m.tracker, m.status_code) for m in stored if isinstance(m, mlm.Stored)],
            [("t1", 200), ("t2", 300)],
        )
        self.assertEqual(list(self.broker.post.mailboxes), ["bob"])

    def test_fanOutEncodesOnce(self) -> None:
        """Readers of one dialect are sent the very same frames for one message."""
        self.table.receive(b"w", mlm.encode(mlm.ConnectionOpen(address="w")))
        self.table.receive(b"w", mlm.encode(mlm.StreamWrite("s")))
        for route in (b"r1", b"r2"):
            self.table.receive(route, mlm.encode(mlm.ConnectionOpen(address=route.decode())))
            self.table.receive(route, mlm.encode(mlm.StreamRead("s", "")))
        self.sent.clear()
        self.table.receive(b"w", mlm.encode(mlm.StreamSend("t", [b"x"])))
        [(_, first), (_, second)] = self.sent
        self.assertIs(first, second)
        self.assertEqual(mlm.decode(first), mlm.StreamDeliver("s", "w", "t", [b"x"]))


class DialectTests(SynchronousTestCase):
    def test_version1Holds(self) -> None:
        """
        Version 1 holds a tracked service request until answered, a tracked
        mailbox letter for its CONFIRM only, and nothing else.
        """
        dialect = MlmVersion1()
        self.assertIs(dialect.hold(letter(Kind.SERVICE, "t")), Hold.UNTIL_ANSWERED)
        self.assertIs(dialect.hold(letter(Kind.MAILBOX, "t")), Hold.FOR_CONFIRM)
        self.assertIs(dialect.hold(letter(Kind.SERVICE)), Hold.NOTHING)
        self.assertIs(dialect.hold(letter(Kind.MAILBOX)), Hold.NOTHING)

    def test_version2HoldsEverything(self) -> None:
        """Version 2 holds every letter until DONE."""
        dialect = MlmVersion2()
        for kind in Kind:
            for tracker in ("", "t"):
                self.assertIs(dialect.hold(letter(kind, tracker)), Hold.UNTIL_ANSWERED)

    def test_speaks(self) -> None:
        """Only version 2 speaks STREAM_READ_FROM and DONE."""
        for command in (mlm.StreamReadFrom, mlm.Done):
            self.assertFalse(MlmVersion1().speaks(command))
            self.assertTrue(MlmVersion2().speaks(command))
        self.assertTrue(MlmVersion1().speaks(mlm.StreamRead))

    def test_streamEncodings(self) -> None:
        """
        A stream record is STREAM_DELIVER in version 1 and STREAM_RECORD with
        its sequence number and time in milliseconds in version 2; the
        header's start is encoded once per writer and reused.
        """
        record = StreamRecord("s", 5, 1.5, "w", "subj", [b"x"])
        self.assertEqual(
            mlm.decode(MlmVersion1().stream_frames(record)),
            mlm.StreamDeliver("s", "w", "subj", [b"x"]),
        )
        dialect = MlmVersion2()
        self.assertEqual(
            mlm.decode(dialect.stream_frames(record)),
            mlm.StreamRecord("s", "w", "subj", 5, 1500, [b"x"]),
        )
        other = StreamRecord("s", 6, 2.0, "w", "other", [])
        self.assertEqual(
            mlm.decode(dialect.stream_frames(other)), mlm.StreamRecord("s", "w", "other", 6, 2000)
        )

    def test_letterEncodings(self) -> None:
        """A letter is *_DELIVER in version 1 and *_RECORD with its id in version 2."""
        self.assertEqual(
            mlm.decode(MlmVersion1().letter_frames(letter(Kind.SERVICE, "t"))),
            mlm.ServiceDeliver("s", "a", "subj", "t", [b"x"]),
        )
        self.assertEqual(
            mlm.decode(MlmVersion2().letter_frames(letter())),
            mlm.MailboxRecord(9, "s", "a", "subj", "", [b"x"]),
        )

    def test_receipts(self) -> None:
        """
        Version 2 sends STORED for every receipt; version 1 only a CONFIRM
        for a refused letter with a tracker.
        """
        receipts = Receipts()
        stored, refused, untracked = (receipts.expect(t) for t in ("t1", "t2", ""))
        receipts.settle(stored, 4, mlm.SUCCESS, "stored")
        receipts.settle(refused, 0, mlm.FAILED, "full")
        receipts.settle(untracked, 0, mlm.FAILED, "full")
        v1, v2 = MlmVersion1(), MlmVersion2()
        self.assertIsNone(v1.stored_frames(stored))
        self.assertIsNone(v1.stored_frames(untracked))
        self.assertEqual(v1.stored_frames(refused), mlm.encode(mlm.Confirm("t2", 300, "full")))
        self.assertEqual(v2.stored_frames(stored), mlm.encode(mlm.Stored(4, "t1", 200, "stored")))
        self.assertEqual(v2.stored_frames(untracked), mlm.encode(mlm.Stored(0, "", 300, "full")))

    def test_gaps(self) -> None:
        """Only version 2 tells a reader of a gap."""
        self.assertIsNone(MlmVersion1().gap_frames("s", 1, 5))
        self.assertEqual(MlmVersion2().gap_frames("s", 1, 5), mlm.encode(mlm.StreamGap("s", 1, 5)))


class ReplyBacklogTests(SynchronousTestCase):
    """Answers to a peer whose queue is full wait, in order; a peer that never reads is given up."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[mlm.Message] = []
        self.full = False
        self.broker = Broker(self.clock, BrokerConfig())
        self.table = MlmSessions(
            self.broker, self.output, Limits(send_queue=5), self.clock, retry=0.05
        )
        self.table.receive(b"p", mlm.encode(mlm.ConnectionOpen(address="p")))
        self.assertEqual(self.sent, [mlm.Ok()])
        self.sent.clear()

    def output(self, route: bytes, frames: Sequence[bytes]) -> bool:
        if self.full:
            return False
        self.sent.append(mlm.decode(list(frames)))
        return True

    def test_answersWaitAndKeepTheirOrder(self) -> None:
        """
        PONGs answered while the queue is full are sent, in order and none
        lost, by the retry once there is room; a delivery does not overtake
        them.
        """
        self.full = True
        for _ in range(3):
            self.table.receive(b"p", mlm.encode(mlm.ConnectionPing()))
        self.table.receive(b"p", mlm.encode(mlm.StreamWrite("s")))
        self.clock.advance(0.05)
        self.assertEqual(self.sent, [])
        self.full = False
        session = self.table.session(b"p")
        record = StreamRecord("s", 0, 0.0, "w", "subj", [b"x"])
        self.assertTrue(session.deliver_stream(record))
        self.assertEqual(self.sent[:4], [mlm.ConnectionPong()] * 3 + [mlm.Ok()])
        self.assertIsInstance(self.sent[4], mlm.StreamDeliver)
        self.assertTrue(self.table.flush())

    def test_retriedOnTheClock(self) -> None:
        """With nothing else to send, the clock's retry sends the waiting answers."""
        self.full = True
        self.table.receive(b"p", mlm.encode(mlm.ConnectionPing()))
        self.full = False
        self.clock.advance(0.05)
        self.assertEqual(self.sent, [mlm.ConnectionPong()])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_neverReadingIsGivenUp(self) -> None:
        """
        A peer with more than send_queue answers waiting is given up: the
        broker ends its connection, counted, and holds nothing more for it.
        """
        self.full = True
        for _ in range(6):
            self.table.receive(b"p", mlm.encode(mlm.ConnectionPing()))
        self.clock.advance(0)
        self.assertEqual((self.table.given_up, len(self.table)), (1, 0))
        self.assertEqual(self.broker.counters.unresponsive_clients, 1)
        self.assertEqual(len(self.broker.registry), 0)
