"""
Regular-expression patterns: what v1 clients send, and the default kind.

A regular expression can want any subject at all, so no index can skip one
without running it: the index is a scan. It runs once per new subject (the
result is cached), never once per message.

Tests: ``tests/test_matching_patterns.py``, ``tests/test_matching_properties.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pyroaring import BitMap

from malamute_pack.matching.base import KindIndex, Pattern, PatternError, expect


class RegexPattern(Pattern):
    """A Python regular expression with search semantics (``re.search``)."""

    __slots__ = ("_search",)

    def __init__(self, text: str, expression: str) -> None:
        super().__init__("regex", text)
        try:
            compiled = re.compile(expression)
        except (re.error, OverflowError, RecursionError) as e:
            raise PatternError(f"regex: {e}") from None
        self._search = compiled.search

    def matches(self, subject: str) -> bool:
        return self._search(subject) is not None


class RegexIndex(KindIndex):
    """Every regular expression, asked in turn."""

    def __init__(self) -> None:
        self._tests: dict[int, Callable[[str], bool]] = {}

    def add(self, bit: int, pattern: Pattern) -> None:
        self._tests[bit] = expect(pattern, RegexPattern).matches

    def remove(self, bit: int, pattern: Pattern) -> None:
        del self._tests[bit]

    def lookup(self, subject: str) -> BitMap:
        return BitMap([bit for bit, test in self._tests.items() if test(subject)])

    def __len__(self) -> int:
        return len(self._tests)
