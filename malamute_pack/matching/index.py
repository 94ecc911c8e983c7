"""
The subscription index: who wants a message with this subject?

Following the whitepaper's Appendix A, subscriptions are the indexed items and
messages are the searches. Every distinct pattern text gets a bit number (freed
numbers are reused, lowest first); the owners that subscribed with that text
hang off its bit. The first message with a new subject asks each kind's index
for its bits, giving one ``pyroaring.BitMap``; that bitmap and the tuple of
owners it stands for are cached per subject, so every later message with the
subject costs a dict lookup, whatever the number of subscriptions.

The cache is kept true as subscriptions change: a new pattern is run against
the cached subjects (they are few next to the messages), a retired pattern
clears its bit from the subjects that had it, and an owner joining or leaving
a bit is added to or taken out of the owner tuples of the cached subjects
whose bitmap holds the bit (a reverse map, bit to cached subjects, finds them).
The cache holds at most ``cache_size`` subjects, least recently used evicted
first.

Tests: ``tests/unit/test_matching_index.py``, ``tests/unit/test_matching_properties.py``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Generic, TypeVar

from pyroaring import BitMap, FrozenBitMap

from malamute_pack.matching.base import KindIndex, Pattern
from malamute_pack.matching.patterns import new_kind_indexes, parse_pattern

K = TypeVar("K", bound=Hashable)


@dataclass
class CacheStats:
    """What the subject cache has done since the index was made."""

    #: ``match`` calls answered from the cache.
    hits: int = 0
    #: ``match`` calls that found their subject missing from the cache.
    misses: int = 0
    #: Subject bitmaps computed through the kind indexes (one per miss, and
    #: one per ``match`` when the cache is off).
    compiles: int = 0
    #: Subjects dropped to keep the cache within its size.
    evictions: int = 0


class _Result(Generic[K]):
    """One subject's matching pattern bits and the owners they stand for."""

    __slots__ = ("bits", "owners")

    def __init__(self, bits: BitMap, owners: tuple[K, ...]) -> None:
        self.bits = bits
        self.owners = owners


class SubscriptionIndex(Generic[K]):
    """
    Owners subscribe with pattern strings; ``match`` returns the owners that
    want a subject. Owners are any hashable objects.

    ``cache_size`` bounds the number of subjects whose result is kept; 0
    switches the cache off, so every ``match`` computes its result.
    """

    def __init__(self, cache_size: int = 10_000) -> None:
        if cache_size < 0:
            raise ValueError(f"cache_size must be 0 or more, not {cache_size}")
        self._cache_size = cache_size
        self.stats = CacheStats()
        # Pattern bits: text -> bit, and per bit its pattern and owners
        # (an insertion-ordered dict used as a set).
        self._bit_of: dict[str, int] = {}
        self._pattern_at: list[Pattern | None] = []
        self._owners_at: list[dict[K, None]] = []
        self._free_bits: list[int] = []  # a heap, so the lowest is reused first
        self._patterns_of: dict[K, dict[str, int]] = {}
        self._kinds = new_kind_indexes()
        # Subject cache, least recently used first, and for each bit the
        # cached subjects whose bitmap holds it.
        self._cache: OrderedDict[str, _Result[K]] = OrderedDict()
        self._cached_with: dict[int, set[str]] = {}

    # Subscriptions

    def subscribe(self, owner: K, pattern: str) -> bool:
        """
        Add ``pattern`` for ``owner``; False if the owner already has it.
        Raises ``PatternError`` (changing nothing) if the pattern does not compile.
        """
        mine = self._patterns_of.get(owner)
        if mine is not None and pattern in mine:
            return False
        bit = self._bit_of.get(pattern)
        if bit is None:
            bit = self._add_bit(pattern, parse_pattern(pattern))
        self._owners_at[bit][owner] = None
        self._patterns_of.setdefault(owner, {})[pattern] = bit
        cache = self._cache
        for subject in self._cached_with.get(bit, ()):
            result = cache[subject]
            if owner not in result.owners:
                result.owners += (owner,)
        return True

    def unsubscribe(self, owner: K, pattern: str) -> bool:
        """Remove ``pattern`` from ``owner``; False if the owner did not have it."""
        mine = self._patterns_of.get(owner)
        if mine is None or pattern not in mine:
            return False
        bit = mine.pop(pattern)
        if not mine:
            del self._patterns_of[owner]
        self._drop_owner(owner, self._release(owner, bit), still=BitMap(mine.values()))
        return True

    def unsubscribe_owner(self, owner: K) -> int:
        """Remove every pattern of ``owner``; returns how many there were."""
        mine = self._patterns_of.pop(owner, None)
        if mine is None:
            return 0
        touched: set[str] = set()
        for bit in mine.values():
            touched |= self._release(owner, bit)
        self._drop_owner(owner, touched, still=BitMap())
        return len(mine)

    def owner_count(self) -> int:
        """How many distinct owners hold at least one pattern."""
        return len(self._patterns_of)

    def owners(self) -> tuple[K, ...]:
        """Every owner holding at least one pattern, in the order they came."""
        return tuple(self._patterns_of)

    def __len__(self) -> int:
        """How many distinct pattern bits are in use."""
        return len(self._bit_of)

    def pattern_bit(self, pattern: str) -> int | None:
        """The bit number of ``pattern``, or None if nobody subscribed with it."""
        return self._bit_of.get(pattern)

    # Matching

    def match(self, subject: str) -> tuple[K, ...]:
        """
        The distinct owners with at least one pattern matching ``subject``,
        each once. The order is deterministic but unspecified: bit order when
        the subject is computed, owners who subscribe later appended.
        """
        result = self._cache.get(subject)
        if result is not None:
            self._cache.move_to_end(subject)
            self.stats.hits += 1
            return result.owners
        return self._miss(subject).owners

    def match_bits(self, subject: str) -> FrozenBitMap:
        """The bits of the patterns matching ``subject`` (through the cache)."""
        result = self._cache.get(subject)
        if result is not None:
            self._cache.move_to_end(subject)
            self.stats.hits += 1
        else:
            result = self._miss(subject)
        return FrozenBitMap(result.bits)

    def owner_matches(self, owner: K, subject: str) -> bool:
        """Whether any pattern of ``owner`` matches ``subject`` (stats untouched)."""
        mine = self._patterns_of.get(owner)
        if not mine:
            return False
        result = self._cache.get(subject)
        if result is not None:
            return any(bit in result.bits for bit in mine.values())
        return any(self._pattern(bit).matches(subject) for bit in mine.values())

    @property
    def cache_size(self) -> int:
        """The most subjects the cache holds (0: no cache)."""
        return self._cache_size

    def cached_subjects(self) -> int:
        """How many subjects the cache holds now."""
        return len(self._cache)

    # Internals

    def _miss(self, subject: str) -> _Result[K]:
        bits = BitMap()
        for index in self._kinds.values():
            if index:
                bits |= index.lookup(subject)
        self.stats.compiles += 1
        result = _Result(bits, self._owners_for(bits))
        if self._cache_size:
            self.stats.misses += 1
            self._cache[subject] = result
            cached_with = self._cached_with
            for bit in bits:
                cached_with.setdefault(bit, set()).add(subject)
            if len(self._cache) > self._cache_size:
                self._evict()
        return result

    def _evict(self) -> None:
        subject, result = self._cache.popitem(last=False)
        for bit in result.bits:
            subjects = self._cached_with[bit]
            subjects.discard(subject)
            if not subjects:
                del self._cached_with[bit]
        self.stats.evictions += 1

    def _owners_for(self, bits: BitMap) -> tuple[K, ...]:
        owners_at = self._owners_at
        if len(bits) == 1:
            return tuple(owners_at[bits.min()])
        merged: dict[K, None] = {}
        for bit in bits:
            merged.update(owners_at[bit])
        return tuple(merged)

    def _drop_owner(self, owner: K, subjects: Iterable[str], still: BitMap) -> None:
        """
        Take ``owner`` out of the owner tuples of these cached subjects, except
        where one of its remaining bits, ``still``, keeps it there.
        """
        cache = self._cache
        for subject in subjects:
            result = cache[subject]
            if still and result.bits.intersect(still):
                continue
            owners = result.owners
            position = owners.index(owner)
            result.owners = owners[:position] + owners[position + 1 :]

    def _pattern(self, bit: int) -> Pattern:
        pattern = self._pattern_at[bit]
        assert pattern is not None, f"bit {bit} is free"
        return pattern

    def _add_bit(self, text: str, pattern: Pattern) -> int:
        """Give a new pattern a bit, index it, and add it to the cached subjects it wants."""
        if self._free_bits:
            bit = heapq.heappop(self._free_bits)
            self._pattern_at[bit] = pattern
        else:
            bit = len(self._pattern_at)
            self._pattern_at.append(pattern)
            self._owners_at.append({})
        self._bit_of[text] = bit
        self._kinds_of(pattern).add(bit, pattern)
        wanted = {subject for subject in self._cache if pattern.matches(subject)}
        for subject in wanted:
            self._cache[subject].bits.add(bit)
        if wanted:
            self._cached_with[bit] = wanted
        return bit

    def _release(self, owner: K, bit: int) -> AbstractSet[str]:
        """
        Detach ``owner`` from ``bit``, retiring the bit if nobody is left;
        returns the cached subjects whose bitmap held the bit.
        """
        owners = self._owners_at[bit]
        del owners[owner]
        if owners:
            return self._cached_with.get(bit, frozenset())
        pattern = self._pattern(bit)
        self._kinds_of(pattern).remove(bit, pattern)
        del self._bit_of[pattern.text]
        self._pattern_at[bit] = None
        heapq.heappush(self._free_bits, bit)
        touched = self._cached_with.pop(bit, set())
        for subject in touched:
            self._cache[subject].bits.remove(bit)
        return touched

    def _kinds_of(self, pattern: Pattern) -> KindIndex:
        return self._kinds[pattern.kind]
