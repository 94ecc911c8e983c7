"""
Tests for L{malamute_pack.client.dedupe}: the bounded memories of what a
version 2 client handed to the application.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.dedupe import SeenIds, SeenSequences


class SeenSequencesTests(SynchronousTestCase):
    def test_addOnce(self) -> None:
        """A sequence number is new once per stream; streams count apart."""
        seen = SeenSequences()
        self.assertTrue(seen.add("a", 3))
        self.assertFalse(seen.add("a", 3))
        self.assertTrue(seen.add("b", 3))
        self.assertTrue(seen.add("a", 1))  # below the highest, but never handed over

    def test_last(self) -> None:
        """last() is the highest number handed over, None for a stream never read."""
        seen = SeenSequences()
        self.assertIsNone(seen.last("a"))
        for sequence in (5, 2, 9, 7):
            seen.add("a", sequence)
        self.assertEqual(seen.last("a"), 9)

    def test_forget(self) -> None:
        """After forget() a stream starts afresh."""
        seen = SeenSequences()
        seen.add("a", 1)
        seen.forget("a")
        self.assertIsNone(seen.last("a"))
        self.assertTrue(seen.add("a", 1))

    def test_discard(self) -> None:
        """A number discarded is new again; the others of its stream stay seen."""
        seen = SeenSequences()
        seen.add("a", 1)
        seen.add("a", 2)
        seen.discard("a", 2)
        seen.discard("b", 2)  # a stream never read: nothing to do
        self.assertTrue(seen.add("a", 2))
        self.assertFalse(seen.add("a", 1))

    def test_windowBounded(self) -> None:
        """
        Numbers more than the window below the highest are forgotten (so a
        resend of one is delivered again); the recent ones are kept.
        """
        seen = SeenSequences(window=10)
        for sequence in range(1, 26):
            seen.add("a", sequence)
        self.assertTrue(seen.add("a", 5))
        self.assertFalse(seen.add("a", 20))
        self.assertEqual(seen.last("a"), 25)

    def test_largeNumbers(self) -> None:
        """Sequence numbers are 64-bit on the wire."""
        seen = SeenSequences()
        self.assertTrue(seen.add("a", 2**63))
        self.assertFalse(seen.add("a", 2**63))
        self.assertEqual(seen.last("a"), 2**63)

    def test_windowMustBePositive(self) -> None:
        """A window below 1 is refused."""
        self.assertRaises(ValueError, SeenSequences, 0)

    @settings(max_examples=100, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 200)), max_size=300))
    def test_newExactlyOnce(self, adds: list[tuple[str, int]]) -> None:
        """Within the window, add() is True exactly for the first of each (stream, number)."""
        seen = SeenSequences()
        first: set[tuple[str, int]] = set()
        for stream, sequence in adds:
            self.assertEqual(seen.add(stream, sequence), (stream, sequence) not in first)
            first.add((stream, sequence))


class SeenIdsTests(SynchronousTestCase):
    def test_remembersAnswer(self) -> None:
        """An id is remembered with its DONE status once sent."""
        ids = SeenIds()
        ids.add(5)
        self.assertIn(5, ids)
        self.assertIsNone(ids.answer(5))
        ids.add(5, (300, "failed"))
        self.assertEqual(ids.answer(5), (300, "failed"))
        self.assertNotIn(6, ids)

    def test_bounded(self) -> None:
        """Only the last C{window} ids are kept, the oldest go first."""
        ids = SeenIds(window=3)
        for record_id in range(1, 6):
            ids.add(record_id)
        self.assertEqual(len(ids), 3)
        self.assertEqual([i for i in range(1, 6) if i in ids], [3, 4, 5])
