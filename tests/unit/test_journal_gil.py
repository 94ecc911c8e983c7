"""Tests for L{malamute_pack.journal.gil}: the switch interval follows the batch sizes."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.gil import (
    BUSY_INTERVAL_S,
    BUSY_RECORDS,
    LIGHT_INTERVAL_S,
    LIGHT_RECORDS,
    SwitchIntervalChoice,
)


class SwitchIntervalChoiceTests(SynchronousTestCase):
    def test_startsLight(self) -> None:
        """Before any batch, and while batches are small, the interval is the short one."""
        choice = SwitchIntervalChoice()
        self.assertEqual(choice.interval, LIGHT_INTERVAL_S)
        self.assertIsNone(choice.observe(BUSY_RECORDS - 1))
        self.assertEqual(choice.interval, LIGHT_INTERVAL_S)

    def test_busyThenLight(self) -> None:
        """A big batch makes it long; only a batch under the light mark makes it short again."""
        choice = SwitchIntervalChoice()
        self.assertEqual(choice.observe(BUSY_RECORDS), BUSY_INTERVAL_S)
        self.assertIsNone(choice.observe(BUSY_RECORDS * 5))
        self.assertIsNone(choice.observe(LIGHT_RECORDS))  # between the marks: it stays
        self.assertEqual(choice.interval, BUSY_INTERVAL_S)
        self.assertEqual(choice.observe(LIGHT_RECORDS - 1), LIGHT_INTERVAL_S)
        self.assertIsNone(choice.observe(0))
