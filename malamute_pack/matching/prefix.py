"""
Prefix patterns (``prefix:``): a subject matches when it starts with the text.

The index keeps one bit per distinct prefix and the set of prefix lengths in
use, so a subject costs one dict probe per distinct length, whatever the number
of patterns.

Tests: ``tests/unit/test_matching_patterns.py``, ``tests/unit/test_matching_properties.py``.
"""

from __future__ import annotations

from collections import Counter

from pyroaring import BitMap

from malamute_pack.matching.base import KindIndex, Pattern, expect


class PrefixPattern(Pattern):
    """Matches every subject that starts with ``prefix`` (all of them if empty)."""

    __slots__ = ("prefix",)

    def __init__(self, text: str, prefix: str) -> None:
        super().__init__("prefix", text)
        self.prefix = prefix

    def matches(self, subject: str) -> bool:
        return subject.startswith(self.prefix)


def parse_prefix(text: str, body: str) -> PrefixPattern:
    """Any text is a valid prefix."""
    return PrefixPattern(text, body)


class PrefixIndex(KindIndex):
    """Prefix text to bit, probed once per prefix length in use."""

    def __init__(self) -> None:
        self._bits: dict[str, int] = {}
        self._lengths: Counter[int] = Counter()
        # Ascending lengths, rebuilt only when the set of lengths changes.
        self._sorted_lengths: tuple[int, ...] = ()

    def add(self, bit: int, pattern: Pattern) -> None:
        prefix = expect(pattern, PrefixPattern).prefix
        self._bits[prefix] = bit
        self._lengths[len(prefix)] += 1
        if self._lengths[len(prefix)] == 1:
            self._sorted_lengths = tuple(sorted(self._lengths))

    def remove(self, bit: int, pattern: Pattern) -> None:
        prefix = expect(pattern, PrefixPattern).prefix
        del self._bits[prefix]
        self._lengths[len(prefix)] -= 1
        if not self._lengths[len(prefix)]:
            del self._lengths[len(prefix)]
            self._sorted_lengths = tuple(sorted(self._lengths))

    def lookup(self, subject: str) -> BitMap:
        found = BitMap()
        bits = self._bits
        for length in self._sorted_lengths:
            if length > len(subject):
                break
            bit = bits.get(subject[:length])
            if bit is not None:
                found.add(bit)
        return found

    def __len__(self) -> int:
        return len(self._bits)
