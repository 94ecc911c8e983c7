"""
Tests for L{malamute_pack.client.inbox}: deliveries handed over, duplicates
dropped, DONE sent once (at hand-over with auto_done, or by the
application), tracked records answered by confirm(), gaps and
confirmations passed on.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.dedupe import SeenSequences
from malamute_pack.client.events import Confirmation, Delivery, Gap
from malamute_pack.client.inbox import Inbox
from malamute_pack.protocol import mlm


class Application:
    """The inbox's recipient: keeps what was handed over."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.confirmations: list[Confirmation] = []
        self.gaps: list[Gap] = []

    def delivered(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def confirmed(self, confirmation: Confirmation) -> None:
        self.confirmations.append(confirmation)

    def gap(self, gap: Gap) -> None:
        self.gaps.append(gap)


class InboxTestCase(SynchronousTestCase):
    auto_done = True

    def setUp(self) -> None:
        self.app = Application()
        self.sequences = SeenSequences()
        self.dones: list[tuple[int, int, str]] = []
        self.arrivals = 0
        self.inbox = Inbox(
            self.app,
            self.sequences,
            lambda *done: self.dones.append(done),
            self.arrived,
            auto_done=self.auto_done,
            dedupe_window=3,
        )

    def arrived(self) -> None:
        self.arrivals += 1

    def record(self, record_id: int, tracker: str = "") -> Delivery:
        """A MAILBOX_RECORD arrives; the delivery handed over (or the last one)."""
        self.inbox.record(mlm.MailboxRecord(record_id, "bob", "me", "hi", tracker, [b"x"]))
        return self.app.deliveries[-1]


class DeliveryTests(InboxTestCase):
    def test_version1Deliveries(self) -> None:
        """STREAM_DELIVER, MAILBOX_DELIVER, SERVICE_DELIVER become deliveries, each counted."""
        self.inbox.stream_deliver(mlm.StreamDeliver("weather", "station", "temp", [b"20"]))
        self.inbox.letter(mlm.MailboxDeliver("bob", "me", "hi", "t", [b"a"]))
        self.inbox.letter(mlm.ServiceDeliver("bob", "echo", "ping", "", []))
        self.assertEqual(
            self.app.deliveries,
            [
                Delivery("STREAM_DELIVER", "station", "weather", "temp", "", (b"20",)),
                Delivery("MAILBOX_DELIVER", "bob", "me", "hi", "t", (b"a",)),
                Delivery("SERVICE_DELIVER", "bob", "echo", "ping", "", ()),
            ],
        )
        self.assertEqual(self.arrivals, 3)

    def test_streamRecordsOnce(self) -> None:
        """A stream record already handed over is a counted duplicate (it still used credit)."""
        for sequence in (1, 2, 1):
            self.inbox.stream_record(mlm.StreamRecord("s", "p", "x", sequence, 1500, []))
        self.assertEqual([d.sequence for d in self.app.deliveries], [1, 2])
        self.assertEqual(self.app.deliveries[0].timestamp, 1.5)
        self.assertEqual((self.inbox.duplicates, self.arrivals), (1, 3))

    def test_serviceRecord(self) -> None:
        """A SERVICE_RECORD is a SERVICE_DELIVER delivery with its id."""
        self.inbox.record(mlm.ServiceRecord(4, "bob", "echo", "ping", "", []))
        self.assertEqual(
            self.app.deliveries, [Delivery("SERVICE_DELIVER", "bob", "echo", "ping", "", (), id=4)]
        )

    def test_gapAndConfirmation(self) -> None:
        """STREAM_GAP and CONFIRM are passed on; gaps are counted."""
        self.inbox.gap(mlm.StreamGap("s", 3, 10))
        self.inbox.confirmation(mlm.Confirm("t", 200, "ok"))
        self.assertEqual(self.app.gaps, [Gap("s", 3, 10)])
        self.assertEqual(self.app.confirmations, [Confirmation("t", 200, "ok")])
        self.assertEqual(self.inbox.gaps, 1)

    def test_renumberedStreamForgotten(self) -> None:
        """
        A STREAM_GAP whose available is below its missed says the broker
        numbers the stream again (its journal was made afresh): the
        numbers handed over before are forgotten, so the new records that
        reuse them are handed over; it is counted, not passed on as a gap.
        """
        for sequence in (1, 2, 3):
            self.inbox.stream_record(mlm.StreamRecord("s", "p", "x", sequence, 0, []))
        self.inbox.gap(mlm.StreamGap("s", 4, 1))
        for sequence in (1, 2):
            self.inbox.stream_record(mlm.StreamRecord("s", "p", "y", sequence, 0, []))
        self.assertEqual([d.subject for d in self.app.deliveries], ["x"] * 3 + ["y"] * 2)
        self.assertEqual((self.app.gaps, self.inbox.gaps, self.inbox.renumbered), ([], 0, 1))


class AutoDoneTests(InboxTestCase):
    def test_doneAtHandOverOnce(self) -> None:
        """With auto_done, a record is answered DONE 200 at hand-over, once."""
        delivery = self.record(5)
        self.inbox.handed_over(delivery, mlm.SUCCESS, "")
        self.inbox.handed_over(delivery, mlm.SUCCESS, "")
        self.assertEqual(self.dones, [(5, mlm.SUCCESS, "")])

    def test_trackedLeftToConfirm(self) -> None:
        """
        A tracked record is not answered at hand-over; confirm() answers the
        oldest unanswered one with that tracker.
        """
        first, second = self.record(5, "order"), self.record(6, "order")
        self.inbox.handed_over(first, mlm.SUCCESS, "")
        self.assertEqual(self.dones, [])
        self.assertTrue(self.inbox.tracks("order"))
        self.inbox.confirm("order", 200, "shipped")
        self.inbox.answer(self.inbox.check_done(second, 300, "lost"), 300, "lost")
        self.assertEqual(self.dones, [(5, 200, "shipped"), (6, 300, "lost")])
        self.assertFalse(self.inbox.tracks("order"))

    def test_trackedFailureAtHandOver(self) -> None:
        """A failure status at hand-over answers even a tracked record."""
        delivery = self.record(5, "order")
        self.inbox.handed_over(delivery, mlm.FAILED, "crashed")
        self.assertEqual(self.dones, [(5, mlm.FAILED, "crashed")])

    def test_redeliveryAnsweredAgain(self) -> None:
        """A redelivered record already answered is dropped and answered the same again."""
        self.inbox.handed_over(self.record(5), mlm.SUCCESS, "")
        self.record(5)
        self.assertEqual(len(self.app.deliveries), 1)
        self.assertEqual(self.dones, [(5, mlm.SUCCESS, "")] * 2)
        self.assertEqual(self.inbox.duplicates, 1)

    def test_redeliveryBeforeAnswer(self) -> None:
        """A redelivery of a record not answered yet is dropped without a DONE."""
        self.record(5)
        self.record(5)
        self.assertEqual((len(self.app.deliveries), self.dones), (1, []))

    def test_windowBounded(self) -> None:
        """Only the last dedupe_window ids are remembered."""
        for record_id in (1, 2, 3, 4):
            self.record(record_id)
        self.record(1)
        self.assertEqual([d.id for d in self.app.deliveries], [1, 2, 3, 4, 1])

    def test_checkDone(self) -> None:
        """Only a delivery with an id can be answered; a status the wire cannot carry is refused."""
        self.inbox.stream_deliver(mlm.StreamDeliver("s", "p", "x", []))
        self.assertRaises(ValueError, self.inbox.check_done, self.app.deliveries[0], 200, "")
        delivery = self.record(5)
        self.assertRaises(mlm.MalformedMessage, self.inbox.check_done, delivery, 70000, "")
        self.assertEqual(self.inbox.check_done(delivery, 200, ""), 5)


class ManualDoneTests(InboxTestCase):
    auto_done = False

    def test_noDoneAtHandOver(self) -> None:
        """Without auto_done, hand-over answers nothing; the application's answer goes."""
        delivery = self.record(5)
        self.inbox.handed_over(delivery, mlm.SUCCESS, "")
        self.assertEqual(self.dones, [])
        self.inbox.answer(5, mlm.FAILED, "cannot")
        self.assertEqual(self.dones, [(5, mlm.FAILED, "cannot")])
