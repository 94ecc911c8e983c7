"""
Tests for reading a last-value stream from its last values
(L{malamute_pack.broker.streams}, whence C{mlm.LAST_VALUES}) on a real
journal: the latest record of each subject the reader's patterns match, in
sequence order, then the live records, with no gap and no duplicate (also
for records written while the snapshot is read), credit respected,
deliveries that could not go sent again in order, and the refusals (a
stream that is not compacted, a broker without a journal).
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.journal import JournalConfig
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness

W, R = b"writer", b"reader"
LV = "ticks"


def records(messages: list[mlm.Message]) -> list[tuple[int, str]]:
    """(sequence, subject) of every STREAM_RECORD in C{messages}."""
    return [(m.sequence, m.subject) for m in messages if isinstance(m, mlm.StreamRecord)]


class LastValuesTests(SynchronousTestCase):
    def setUp(self) -> None:
        path = Path(self.mktemp()) / "journal.sqlite"
        config = JournalConfig(prune_interval_s=3600, compacted=frozenset({LV}))
        self.h = BrokerHarness(BrokerConfig(timeout=60.0), path, config)
        self.addCleanup(lambda: self.h.close())
        self.h.open(W, "writer", version=2)
        self.h.command(W, mlm.StreamWrite(LV))
        self.write("a", "b", "a", "c")  # 1 a, 2 b, 3 a, 4 c
        self.h.open(R, "reader", version=2)

    def write(self, *subjects: str) -> None:
        for subject in subjects:
            self.h.send(W, mlm.StreamSend(subject, [subject.encode()]))

    def read(self, pattern: str = "", stream: str = LV) -> list[mlm.Message]:
        return self.h.command(R, mlm.StreamReadFrom(stream, pattern, mlm.LAST_VALUES, 0))

    def test_snapshotThenLive(self) -> None:
        """
        OK, then the latest record of each subject in sequence order, then
        what is written afterwards.
        """
        got = self.read()
        self.assertEqual(got[0], mlm.Ok())
        self.assertEqual(records(got), [(2, "b"), (3, "a"), (4, "c")])
        self.write("b")
        self.assertEqual(records(self.h.take(R)), [(5, "b")])

    def test_writtenWhileRead(self) -> None:
        """
        Records written while the snapshot is being read come after it, in
        order, each once: no gap, no duplicate.
        """
        self.h.send(R, mlm.StreamReadFrom(LV, "", mlm.LAST_VALUES, 0))
        self.write("a", "d")
        self.h.settle()
        self.write("b")
        self.assertEqual(
            records(self.h.take(R)),
            [(2, "b"), (3, "a"), (4, "c"), (5, "a"), (6, "d"), (7, "b")],
        )

    def test_patternFilters(self) -> None:
        """Only the subjects the reader's pattern matches, snapshot and live."""
        self.assertEqual(records(self.read("^[ab]$")), [(2, "b"), (3, "a")])
        self.write("c", "a")
        self.assertEqual(records(self.h.take(R)), [(6, "a")])

    def test_creditRespected(self) -> None:
        """
        A reader with credit for two records gets two; the rest of the
        snapshot and then the live records come as it grants more.
        """
        self.h.send(R, mlm.Credit(2))
        self.assertEqual(records(self.read()), [(2, "b"), (3, "a")])
        self.write("d")
        self.assertEqual(records(self.h.take(R)), [])
        self.h.send(R, mlm.Credit(1))
        self.assertEqual(records(self.h.take(R)), [(4, "c")])
        self.h.send(R, mlm.Credit(10))
        self.assertEqual(records(self.h.take(R)), [(5, "d")])
        self.write("e")
        self.assertEqual(records(self.h.take(R)), [(6, "e")])

    def test_undeliveredSentAgain(self) -> None:
        """
        Snapshot records the transport took but could not send after all
        (its batch went out to a full queue) are sent again, in order,
        before what follows them, none twice.
        """
        self.write("a")  # 5 a: the snapshot is 2, 4, 5 (3 is not in it)
        self.h.send(R, mlm.Credit(0))
        self.assertEqual(records(self.read()), [])
        self.h.defer_sends()
        self.h.send(R, mlm.Credit(10))
        self.h.full.add(R)
        self.h.send_deferred()
        self.h.full.discard(R)
        self.h.clock.advance(1)
        self.write("d")
        self.assertEqual(records(self.h.take(R)), [(2, "b"), (4, "c"), (5, "a"), (6, "d")])

    def test_ownRecordsSkipped(self) -> None:
        """A writer reading its own stream's last values gets none of its own records."""
        self.assertEqual(
            records(self.h.command(W, mlm.StreamReadFrom(LV, "", mlm.LAST_VALUES, 0))), []
        )

    def test_cancelledWhileRead(self) -> None:
        """A reader that cancels before its snapshot is read gets none of it."""
        self.h.send(R, mlm.StreamReadFrom(LV, "", mlm.LAST_VALUES, 0))
        self.h.send(R, mlm.StreamCancel(LV))
        self.assertEqual(records(self.h.take(R)), [])
        self.write("e")
        self.assertEqual(records(self.h.take(R)), [])

    def test_notCompactedRefused(self) -> None:
        """A stream that is not compacted answers ERROR 300 saying so."""
        [reply] = self.read(stream="plain")
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.FAILED)
        self.assertIn("not a last-value stream", reply.status_reason)


class WithoutJournalTests(SynchronousTestCase):
    def test_notImplemented(self) -> None:
        """Without a journal, reading from last values is ERROR 501, as other positions."""
        h = BrokerHarness(BrokerConfig(timeout=60.0))
        self.addCleanup(h.close)
        h.open(R, "reader", version=2)
        [reply] = h.command(R, mlm.StreamReadFrom(LV, "", mlm.LAST_VALUES, 0))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.NOT_IMPLEMENTED)
