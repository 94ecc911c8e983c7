"""
Tests for L{malamute_pack.journal.replica}: positions in the order of
writes, the shipper that sees each hand-over, outcomes held until the
partner acknowledges them (or the hold ends), refused outcomes that say
where their write is and are confirmed later, the operations of a failed
batch that were shipped, and commit latencies; on a L{ReplicaHold} with an
injected clock.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.replica import ReplicaHold
from malamute_pack.journal.writer import BatchOutcome, PartnerNote, WriteOp


def outcome(operations: int) -> BatchOutcome:
    return BatchOutcome(operations, operations, 0, {}, [], None)


class HoldCase(SynchronousTestCase):
    """A ReplicaHold on a test clock, what it finished, and hand-overs."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.finished: list[BatchOutcome] = []
        self.hold = ReplicaHold(self.finished.append, self.clock.seconds)

    def hand(self, count: int) -> list[WriteOp]:
        ops: list[WriteOp] = [PartnerNote(i) for i in range(count)]
        self.hold.handed_over(ops)
        return ops


class ReplicaHoldTests(HoldCase):
    def test_positionsAndShipper(self) -> None:
        """Each hand-over takes the next positions; the shipper gets the first and the ops."""
        shipped: list[tuple[int, int]] = []
        self.hold.shipper = lambda first, ops: shipped.append((first, len(ops)))
        self.hand(3)
        self.hand(2)
        self.assertEqual((shipped, self.hold.handed), ([(1, 3), (4, 2)], 5))

    def test_unheldFinishAtOnce(self) -> None:
        """Without a hold a batch's outcome is finished as it is reported, its latency noted."""
        self.hand(2)
        self.clock.advance(0.25)
        done = outcome(2)
        self.hold.batch_done(done)
        self.assertEqual(self.finished, [done])
        self.assertEqual(list(self.hold.commit_latencies), [0.25])

    def test_heldUntilAcked(self) -> None:
        """
        Held, each outcome waits until the partner acknowledges its last
        operation; outcomes go in order.
        """
        self.hold.hold_for_replica(True)
        self.hand(2)
        self.hand(3)
        first, second = outcome(2), outcome(3)
        self.hold.batch_done(first)
        self.hold.batch_done(second)
        self.assertEqual(self.finished, [])
        self.hold.replica_acked(1)
        self.assertEqual(self.finished, [])
        self.hold.replica_acked(4)
        self.assertEqual(self.finished, [first])
        self.hold.replica_acked(3)  # an older ack changes nothing
        self.assertEqual(self.finished, [first])
        self.hold.replica_acked(5)
        self.assertEqual(self.finished, [first, second])

    def test_ackedBeforeReported(self) -> None:
        """An outcome the partner already has when it is reported is finished at once."""
        self.hold.hold_for_replica(True)
        self.hand(2)
        self.hold.replica_acked(2)
        done = outcome(2)
        self.hold.batch_done(done)
        self.assertEqual(self.finished, [done])

    def test_holdEndsLetsGo(self) -> None:
        """Ending the hold (the partner is gone) finishes whatever waits."""
        self.hold.hold_for_replica(True)
        self.hand(1)
        done = outcome(1)
        self.hold.batch_done(done)
        self.hold.hold_for_replica(False)
        self.assertEqual(self.finished, [done])

    def test_reset(self) -> None:
        """A reset (the journal opened again) counts positions from the start."""
        self.hand(4)
        self.hold.reset()
        self.assertEqual((self.hold.handed, list(self.hold.commit_latencies)), (0, []))


class RefusalTests(HoldCase):
    """What waits for the partner is refused, never acknowledged, when it cannot come."""

    def held(self) -> tuple[BatchOutcome, BatchOutcome]:
        """Two batches reported and held for the partner."""
        self.hold.hold_for_replica(True)
        self.hand(2)
        self.hand(3)
        first, second = outcome(2), outcome(3)
        self.hold.batch_done(first)
        self.hold.batch_done(second)
        return first, second

    def test_refuseHeld(self) -> None:
        """
        refuse_held fails what waits now with the error, in order; what is
        reported later waits for the partner as before.
        """
        self.held()
        error = JournalError("unreachable")
        self.hold.refuse_held(error)
        self.assertEqual([str(f.error) for f in self.finished], ["unreachable"] * 2)
        # Each says where its write is (on this disk all the same).
        self.assertEqual([f.error and f.error.unconfirmed for f in self.finished], [2, 5])
        self.hand(1)
        later = outcome(1)
        self.hold.batch_done(later)
        self.assertEqual(len(self.finished), 2)
        self.hold.replica_acked(6)
        self.assertIs(self.finished[-1], later)

    def test_withheld(self) -> None:
        """
        withhold fails what waits, and everything reported later while the
        hold lasts; a hold ended (alone) finishes as usual.
        """
        self.held()
        error = JournalError("yielded")
        self.hold.withhold(error)
        self.hand(1)
        self.hold.batch_done(outcome(1))
        self.assertEqual([str(f.error) for f in self.finished], ["yielded"] * 3)
        self.assertEqual([f.error and f.error.unconfirmed for f in self.finished], [2, 5, 6])
        self.hold.hold_for_replica(False)
        self.hand(1)
        self.hold.batch_done(outcome(1))
        self.assertIsNone(self.finished[-1].error)

    def test_failureKept(self) -> None:
        """A batch that failed on its own keeps its own error when withheld."""
        self.hold.hold_for_replica(True)
        self.hand(1)
        own = JournalError("disk full")
        self.hold.batch_done(BatchOutcome(1, 1, 0, {}, [], own))
        self.hold.withhold(JournalError("yielded"))
        self.assertIs(self.finished[0].error, own)


class ConfirmTests(HoldCase):
    """A refused write, on this disk all the same, is confirmed once the partner has it."""

    def refused(self) -> None:
        """Two batches (positions 2 and 5) held, then refused (the partner unreachable)."""
        self.hold.hold_for_replica(True)
        self.hand(2)
        self.hand(3)
        self.hold.batch_done(outcome(2))
        self.hold.batch_done(outcome(3))
        self.hold.refuse_held(JournalError("unreachable"))

    def confirm(self, position: int) -> list[JournalError | None]:
        told: list[JournalError | None] = []
        self.hold.confirm(position, lambda error: told.append(error))
        return told

    def test_confirmedOnAck(self) -> None:
        """A confirm waits until the partner acknowledges the write's position, in order."""
        self.refused()
        second, first = self.confirm(5), self.confirm(2)
        self.assertEqual((first, second), ([], []))
        self.hold.replica_acked(3)
        self.assertEqual((first, second), ([None], []))
        self.hold.replica_acked(5)
        self.assertEqual(second, [None])

    def test_refusedAgain(self) -> None:
        """Refused again while it waits, a confirm fails, naming its position again."""
        self.refused()
        told = self.confirm(2)
        self.hold.refuse_held(JournalError("still unreachable"))
        self.assertEqual([(str(e), e and e.unconfirmed) for e in told], [("still unreachable", 2)])

    def test_aloneConfirmsAtOnce(self) -> None:
        """Alone (no hold), or once the partner has the write, a confirm is answered at once."""
        self.refused()
        self.hold.replica_acked(2)
        self.assertEqual(self.confirm(2), [None])
        waiting = self.confirm(5)
        self.hold.hold_for_replica(False)
        self.assertEqual((waiting, self.confirm(5)), ([None], [None]))

    def test_withheldFails(self) -> None:
        """A broker that yields confirms nothing: a confirm fails at once, or as it waits."""
        self.refused()
        waiting = self.confirm(5)
        self.hold.withhold(JournalError("yielded"))
        self.assertEqual([(str(e), e and e.unconfirmed) for e in waiting], [("yielded", 5)])
        self.assertEqual([str(e) for e in self.confirm(2)], ["yielded"])

    def test_resetFails(self) -> None:
        """The journal opened again: a waiting confirm fails, and is no longer unconfirmed."""
        self.refused()
        waiting = self.confirm(5)
        self.hold.reset()
        self.assertEqual([e and e.unconfirmed for e in waiting], [None])
        self.assertIsNotNone(waiting[0])


class UnwrittenTests(HoldCase):
    """The operations shipped in a batch the writer failed go to on_unwritten."""

    def test_failedBatchOps(self) -> None:
        """
        With a shipper and on_unwritten set, a failed batch's operations (and
        only those) are told, once it is reported; the good ones are let go.
        """
        told: list[list[WriteOp]] = []
        self.hold.shipper = lambda first, ops: None
        self.hold.on_unwritten = told.append
        good, bad, later = self.hand(2), self.hand(3), self.hand(1)
        self.hold.batch_done(outcome(2))
        self.hold.batch_done(BatchOutcome(3, 3, 0, {}, [], JournalError("disk full")))
        self.assertEqual(told, [bad])
        self.hold.batch_done(outcome(1))
        self.assertEqual(told, [bad])
        self.assertNotIn(good, told)
        self.assertNotIn(later, told)
