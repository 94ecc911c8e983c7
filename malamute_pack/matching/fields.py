"""
Field patterns (``fields:``): the whitepaper's multi-field matching.

A subject carries fields, ``;`` separated: ``currency=USD;market=forex;urgent``
(a name with a value, or a bare name). A pattern is a set of criteria, each a
value (``currency=USD``) or a presence (``urgent``, the field with any value),
joined by ``;`` when all must hold (AND, the default) or by ``|`` when one is
enough (OR). Names and values are stripped of surrounding blanks.

The index is the whitepaper's inverted criterion index: a bitmap per criterion
of the patterns that ask for it. A subject looks up the bitmap of each of its
criteria and counts hits per pattern: an OR pattern matches with one hit, an
AND pattern when its hits equal its criteria count.

Tests: ``tests/unit/test_matching_patterns.py``, ``tests/unit/test_matching_index.py``,
``tests/unit/test_matching_properties.py``.
"""

from __future__ import annotations

from collections import Counter

from pyroaring import BitMap, FrozenBitMap

from malamute_pack.matching.base import KindIndex, Pattern, PatternError, expect

#: ``(name, value)`` for a value criterion, ``(name, None)`` for presence.
Criterion = tuple[str, str | None]


def subject_criteria(subject: str) -> frozenset[Criterion]:
    """
    Every criterion ``subject`` satisfies: each field's value and its presence.
    Pieces with an empty name are ignored.
    """
    found: set[Criterion] = set()
    for piece in subject.split(";"):
        name, equals, value = piece.partition("=")
        name = name.strip()
        if name:
            found.add((name, None))
            if equals:
                found.add((name, value.strip()))
    return frozenset(found)


class FieldsPattern(Pattern):
    """A set of criteria, all of which (``match_all``) or any of which must hold."""

    __slots__ = ("criteria", "match_all")

    def __init__(self, text: str, criteria: frozenset[Criterion], match_all: bool) -> None:
        super().__init__("fields", text)
        self.criteria = criteria
        self.match_all = match_all

    def matches(self, subject: str) -> bool:
        present = subject_criteria(subject)
        if self.match_all:
            return self.criteria <= present
        return not self.criteria.isdisjoint(present)


def parse_fields(text: str, body: str) -> FieldsPattern:
    """``a=1;b`` wants both, ``a=1|b`` either; the two joiners do not mix."""
    if ";" in body and "|" in body:
        raise PatternError("fields: cannot mix ';' (all of) and '|' (any of)")
    match_all = "|" not in body
    criteria: set[Criterion] = set()
    for piece in body.split(";" if match_all else "|"):
        if not piece.strip():
            raise PatternError("fields: empty criterion")
        name, equals, value = piece.partition("=")
        name = name.strip()
        if not name:
            raise PatternError(f"fields: criterion {piece.strip()!r} has no field name")
        criteria.add((name, value.strip() if equals else None))
    return FieldsPattern(text, frozenset(criteria), match_all)


class FieldIndex(KindIndex):
    """Criterion to bitmap of the patterns asking for it, plus each pattern's rule."""

    def __init__(self) -> None:
        self._wanted_by: dict[Criterion, BitMap] = {}
        self._any_of = BitMap()  # OR patterns: one hit is enough
        self._needed: dict[int, int] = {}  # AND pattern bit -> criteria count

    def add(self, bit: int, pattern: Pattern) -> None:
        fields = expect(pattern, FieldsPattern)
        for criterion in fields.criteria:
            self._wanted_by.setdefault(criterion, BitMap()).add(bit)
        if fields.match_all:
            self._needed[bit] = len(fields.criteria)
        else:
            self._any_of.add(bit)

    def remove(self, bit: int, pattern: Pattern) -> None:
        fields = expect(pattern, FieldsPattern)
        for criterion in fields.criteria:
            bits = self._wanted_by[criterion]
            bits.remove(bit)
            if not bits:
                del self._wanted_by[criterion]
        self._needed.pop(bit, None)
        self._any_of.discard(bit)

    def lookup(self, subject: str) -> BitMap:
        wanted_by = self._wanted_by
        hits = [wanted_by[c] for c in subject_criteria(subject) if c in wanted_by]
        found = BitMap()
        if not hits:
            return found
        found.update(*hits)
        all_of = found - self._any_of
        if all_of:
            # Count hits per AND pattern; only full counts survive.
            counts = Counter(bit for bitmap in hits for bit in bitmap & all_of)
            needed = self._needed
            found -= all_of
            found.update([bit for bit, count in counts.items() if count == needed[bit]])
        return found

    def wanted_by(self, criterion: Criterion) -> FrozenBitMap:
        """The bits of the patterns asking for ``criterion`` (the whitepaper's table)."""
        return FrozenBitMap(self._wanted_by.get(criterion, ()))

    def __len__(self) -> int:
        return len(self._needed) + len(self._any_of)
