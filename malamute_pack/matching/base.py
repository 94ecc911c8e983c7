"""
The vocabulary every pattern kind shares: the error a bad pattern raises, what a
compiled pattern is, and what a per-kind index must do.

A pattern's ``matches`` is the direct, one-pattern-at-a-time definition of its
meaning: it is the oracle the property tests compare the indexes against, the
check the regular-expression index runs for patterns added since its RE2 set
was last built, and the check run against the cached subjects when a new
pattern arrives.

Tests: ``tests/unit/test_matching_patterns.py``, ``tests/unit/test_matching_properties.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

from pyroaring import BitMap


class PatternError(ValueError):
    """
    A subscription pattern that does not compile.

    ``str(error)`` is a human-readable reason prefixed by the pattern kind, such
    as ``"topic: empty word"``; the broker sends it back in an ERROR reply.
    """


class Pattern(ABC):
    """One compiled subscription pattern of one kind."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str) -> None:
        #: The kind's name (``"regex"``, ``"topic"``...), which picks its index.
        self.kind = kind
        #: The pattern exactly as the client sent it, scheme prefix included.
        self.text = text

    @abstractmethod
    def matches(self, subject: str) -> bool:
        """Whether this pattern wants a message with this subject."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.text!r}>"


class KindIndex(ABC):
    """
    Everything one pattern kind needs to answer "which of my patterns match
    this subject?" faster than asking each pattern, where the kind allows it.

    Patterns are identified by their bit number; the caller guarantees a bit is
    added once and removed once, with the pattern it was added with.
    """

    @abstractmethod
    def add(self, bit: int, pattern: Pattern) -> None:
        """Index ``pattern`` under ``bit``."""

    @abstractmethod
    def remove(self, bit: int, pattern: Pattern) -> None:
        """Forget the pattern indexed under ``bit``."""

    @abstractmethod
    def lookup(self, subject: str) -> BitMap:
        """The bits of every indexed pattern that matches ``subject``."""

    @abstractmethod
    def __len__(self) -> int:
        """How many patterns are indexed."""


P = TypeVar("P", bound=Pattern)


def expect(pattern: Pattern, kind: type[P]) -> P:
    """Narrow ``pattern`` to the class an index handles (a wiring error otherwise)."""
    if not isinstance(pattern, kind):
        raise TypeError(f"{type(pattern).__name__} given to an index of {kind.__name__}")
    return pattern
