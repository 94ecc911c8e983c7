"""Tests for L{malamute_pack.text}."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.text import plural


class PluralTests(SynchronousTestCase):
    """Counts with their nouns."""

    def test_one(self) -> None:
        """One takes the singular."""
        self.assertEqual(plural(1, "stream"), "1 stream")

    def test_otherCounts(self) -> None:
        """Zero and more take the plural: an s, or the given plural."""
        self.assertEqual(plural(0, "stream"), "0 streams")
        self.assertEqual(plural(2, "address", "addresses"), "2 addresses")
