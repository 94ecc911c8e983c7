"""
Tests for L{tests.fuzz_frames}: the fuzzer is deterministic for a seed,
makes every kind of bad input it claims to (bytes the codec refuses, names
that are not UTF-8, explosive patterns) and never uses a good client's name.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from tests.fuzz_frames import EXPLOSIVE_PATTERNS, GOOD_PREFIX, FrameFuzzer

SAMPLE = 3000


def _outcome(frames: list[bytes]) -> str:
    """How the broker's door sees C{frames}: decoded, not UTF-8, or malformed."""
    try:
        mlm.decode_checked(frames)
    except mlm.InvalidText:
        return "invalid text"
    except mlm.MalformedMessage:
        return "malformed"
    return "decoded"


class FrameFuzzerTests(SynchronousTestCase):
    def test_sameSeedSameFrames(self) -> None:
        """Two fuzzers with one seed make the same messages; another seed makes others."""
        one, two, other = FrameFuzzer(7), FrameFuzzer(7), FrameFuzzer(8)
        first = [one.next() for _ in range(200)]
        self.assertEqual(first, [two.next() for _ in range(200)])
        self.assertNotEqual(first, [other.next() for _ in range(200)])

    def test_everyKindOfInput(self) -> None:
        """
        A sample holds messages that decode, messages the codec refuses and
        messages whose strings are not UTF-8, and only lists of bytes.
        """
        fuzzer = FrameFuzzer(1)
        seen: dict[str, int] = {}
        for _ in range(SAMPLE):
            frames = fuzzer.next()
            self.assertTrue(frames and all(type(f) is bytes for f in frames), frames)
            kind = _outcome(frames)
            seen[kind] = seen.get(kind, 0) + 1
        self.assertEqual(sorted(seen), ["decoded", "invalid text", "malformed"])
        self.assertGreater(min(seen.values()), SAMPLE // 50, seen)

    def test_explosivePatternsSent(self) -> None:
        """Readers and workers with the patterns that break backtracking engines are among them."""
        fuzzer = FrameFuzzer(2)
        patterns = set()
        for _ in range(SAMPLE):
            try:
                message = mlm.decode(fuzzer.next())
            except mlm.MalformedMessage:
                continue
            if isinstance(message, mlm.StreamRead | mlm.ServiceOffer):
                patterns.add(message.pattern.encode("utf-8", "surrogateescape"))
        self.assertTrue(set(EXPLOSIVE_PATTERNS) <= patterns, patterns)

    def test_neverAGoodName(self) -> None:
        """No name the fuzzer makes starts with the well-behaved clients' prefix."""
        fuzzer = FrameFuzzer(3)
        names = [fuzzer.name() for _ in range(SAMPLE)]
        self.assertFalse([n for n in names if n.startswith(GOOD_PREFIX)])
        self.assertTrue(all(len(n) <= 255 for n in names))
