"""
Tests for L{malamute_pack.client.credit}: credit granted, used up, held while
the connection is not usable, and granted again after a reconnection.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.credit import MAX_CREDIT, Credit
from malamute_pack.protocol import mlm


class CreditTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[mlm.Message] = []
        self.credit = Credit(lambda frames: self.sent.append(mlm.decode(frames)))

    def test_grantSentAtOnce(self) -> None:
        """While usable, each grant goes out as CREDIT."""
        self.credit.grant(3, usable=True)
        self.credit.grant(2, usable=True)
        self.assertEqual(self.sent, [mlm.Credit(3), mlm.Credit(2)])
        self.assertEqual(self.credit.left, 5)

    def test_grantHeldUntilFlush(self) -> None:
        """While not usable, grants add up and go out as one CREDIT on flush()."""
        self.credit.grant(3, usable=False)
        self.credit.grant(4, usable=False)
        self.assertEqual(self.sent, [])
        self.credit.flush()
        self.credit.flush()
        self.assertEqual(self.sent, [mlm.Credit(7)])

    def test_deliveriesUseCredit(self) -> None:
        """Each delivery uses one credit, never below zero; none counted before a grant."""
        self.credit.used()
        self.assertIsNone(self.credit.left)
        self.credit.grant(2, usable=True)
        for _ in range(3):
            self.credit.used()
        self.assertEqual(self.credit.left, 0)

    def test_regrant(self) -> None:
        """A new broker session gets the credit left (what was unsent included)."""
        self.credit.grant(5, usable=True)
        self.credit.used()
        self.credit.grant(2, usable=False)
        self.sent.clear()
        self.credit.regrant()
        self.credit.flush()
        self.assertEqual(self.sent, [mlm.Credit(6)])

    def test_noRegrantWithoutCredit(self) -> None:
        """An application that never granted credit sends none after a reconnection."""
        self.credit.regrant()
        self.assertEqual(self.sent, [])

    def test_regrantCapped(self) -> None:
        """More left than CREDIT can carry is granted as the most it can."""
        for _ in range(3):
            self.credit.grant(MAX_CREDIT, usable=True)
        self.sent.clear()
        self.credit.regrant()
        self.assertEqual(self.sent, [mlm.Credit(MAX_CREDIT)])

    def test_badAmounts(self) -> None:
        """Amounts below 1 or above what CREDIT carries raise ValueError."""
        for amount in (0, -1, MAX_CREDIT + 1):
            self.assertRaises(ValueError, self.credit.grant, amount, True)
