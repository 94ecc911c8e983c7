"""
Tests for L{malamute_pack.journal.replica}: positions in the order of
writes, the shipper that sees each hand-over, outcomes held until the
partner acknowledges them (or the hold ends), and commit latencies; on a
L{ReplicaHold} with an injected clock.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.replica import ReplicaHold
from malamute_pack.journal.writer import BatchOutcome, PartnerNote, WriteOp


def outcome(operations: int) -> BatchOutcome:
    return BatchOutcome(operations, operations, 0, {}, [], None)


class ReplicaHoldTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.finished: list[BatchOutcome] = []
        self.hold = ReplicaHold(self.finished.append, self.clock.seconds)

    def hand(self, count: int) -> list[WriteOp]:
        ops: list[WriteOp] = [PartnerNote(i) for i in range(count)]
        self.hold.handed_over(ops)
        return ops

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
