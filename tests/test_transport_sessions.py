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
from malamute_pack.broker.store import StreamRecord
from malamute_pack.protocol import mlm
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

    def record(self, route: bytes, frames: Sequence[bytes]) -> None:
        self.sent.append((route, frames))

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
