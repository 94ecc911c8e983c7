"""
Tests for L{malamute_pack.broker.receipts}: receipts settle in any order and
leave in the order the letters were sent.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.receipts import Receipts
from malamute_pack.protocol import mlm


class ReceiptTests(SynchronousTestCase):
    def test_inOrder(self) -> None:
        """A receipt settled at the head leaves at once."""
        receipts = Receipts()
        first = receipts.expect("t1")
        self.assertEqual(receipts.settle(first, 7, mlm.SUCCESS, "stored"), [first])
        self.assertEqual((first.id, first.code, first.reason), (7, 200, "stored"))
        self.assertEqual(len(receipts), 0)

    def test_laterWaitsForEarlier(self) -> None:
        """
        A receipt settled before an older one waits; settling the older one
        releases both, oldest first.
        """
        receipts = Receipts()
        first, second, third = (receipts.expect(t) for t in ("a", "b", "c"))
        self.assertEqual(receipts.settle(second, 2, mlm.SUCCESS, ""), [])
        self.assertEqual(receipts.settle(first, 1, mlm.SUCCESS, ""), [first, second])
        self.assertEqual(len(receipts), 1)
        self.assertEqual(receipts.settle(third, 0, mlm.FAILED, "full"), [third])

    def test_settledAsMade(self) -> None:
        """
        A receipt settled as it is made leaves at once when none waits
        (no queue is kept), and behind an older unsettled one otherwise,
        released with it in send order.
        """
        receipts = Receipts()
        [now] = receipts.settled("t0", 5, mlm.SUCCESS, "stored")
        self.assertEqual((now.tracker, now.id, now.code, now.reason), ("t0", 5, 200, "stored"))
        self.assertEqual(len(receipts), 0)
        first = receipts.expect("t1")
        self.assertEqual(receipts.settled("t2", 0, mlm.FAILED, "full"), [])
        self.assertEqual(len(receipts), 2)
        ready = receipts.settle(first, 6, mlm.SUCCESS, "stored")
        self.assertEqual([(r.tracker, r.code) for r in ready], [("t1", 200), ("t2", 300)])
        self.assertEqual(len(receipts), 0)

    def test_refused(self) -> None:
        """A receipt is refused when settled with a status other than 200."""
        receipts = Receipts()
        receipt = receipts.expect("")
        self.assertFalse(receipt.refused)
        receipts.settle(receipt, 0, mlm.FAILED, "queue full")
        self.assertTrue(receipt.refused)

    def test_clear(self) -> None:
        """Clearing forgets every receipt; settling one later releases nothing."""
        receipts = Receipts()
        receipt = receipts.expect("")
        receipts.clear()
        self.assertEqual(receipts.settle(receipt, 1, mlm.SUCCESS, ""), [])
