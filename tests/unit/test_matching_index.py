"""
Tests for L{malamute_pack.matching.SubscriptionIndex}: subscriptions and their
bits, the subject cache (counters, bound, LRU, kept true as subscriptions
change), the whitepaper's worked examples (Appendix A) as literal tests, and
the regular-expression index's RE2 Set (built lazily, rebuilt when changes
make it pay, a fallback when it does not fit).
"""

# twisted.trial's assertion methods carry no annotations.

from __future__ import annotations

import math
from typing import ClassVar

from pyroaring import BitMap
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.matching import CacheStats, PatternError, SubscriptionIndex, parse_pattern
from malamute_pack.matching.fields import FieldIndex
from malamute_pack.matching.regex import BUILD_COST, MIN_RECENT, RegexIndex, RegexStats


class SubscriptionTests(SynchronousTestCase):
    def test_subscribeTwice(self) -> None:
        """Subscribing an owner to a pattern it has already is refused with False."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        self.assertTrue(index.subscribe("ann", "topic:a.*"))
        self.assertFalse(index.subscribe("ann", "topic:a.*"))
        self.assertEqual((len(index), index.owner_count()), (1, 1))

    def test_owners(self) -> None:
        """owners() lists every owner with a pattern, once, in the order they came."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("b", "x.*")
        index.subscribe("a", "y")
        index.subscribe("b", "z")
        self.assertEqual(index.owners(), ("b", "a"))
        index.unsubscribe_owner("b")
        self.assertEqual(index.owners(), ("a",))

    def test_identicalPatternsShareABit(self) -> None:
        """Owners with the same pattern text hang off one bit."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "topic:a.*")
        index.subscribe("bob", "topic:a.*")
        index.subscribe("bob", "topic:b.*")
        self.assertEqual((len(index), index.owner_count()), (2, 2))
        self.assertEqual(index.pattern_bit("topic:a.*"), 0)
        self.assertEqual(index.pattern_bit("topic:b.*"), 1)
        self.assertEqual(index.match("a.x"), ("ann", "bob"))

    def test_bitsNumberedFromZeroAndReused(self) -> None:
        """Bits count up from 0; a freed bit is reused, lowest first."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        for pattern in ("p0", "p1", "p2", "p3"):
            index.subscribe("ann", pattern)
        index.unsubscribe("ann", "p2")
        index.unsubscribe("ann", "p1")
        index.subscribe("bob", "q")
        index.subscribe("bob", "r")
        index.subscribe("bob", "s")
        bits = [index.pattern_bit(p) for p in ("p0", "q", "r", "p3", "s")]
        self.assertEqual(bits, [0, 1, 2, 3, 4])
        self.assertIsNone(index.pattern_bit("p1"))

    def test_bitOutlivesAnOwner(self) -> None:
        """A bit is freed only when its last owner leaves it."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        index.subscribe("bob", "a")
        index.unsubscribe("ann", "a")
        self.assertEqual(index.pattern_bit("a"), 0)
        self.assertEqual(index.match("a"), ("bob",))
        index.unsubscribe("bob", "a")
        self.assertEqual((len(index), index.owner_count()), (0, 0))

    def test_unsubscribe(self) -> None:
        """Unsubscribing reports whether the owner had the pattern."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        self.assertFalse(index.unsubscribe("ann", "b"))
        self.assertFalse(index.unsubscribe("bob", "a"))
        self.assertTrue(index.unsubscribe("ann", "a"))
        self.assertFalse(index.unsubscribe("ann", "a"))
        self.assertEqual(index.match("a"), ())

    def test_unsubscribeOwner(self) -> None:
        """unsubscribe_owner drops every pattern of the owner and says how many."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        for pattern in ("a", "prefix:b", "fields:c"):
            index.subscribe("ann", pattern)
        index.subscribe("bob", "a")
        self.assertEqual(index.unsubscribe_owner("ann"), 3)
        self.assertEqual(index.unsubscribe_owner("ann"), 0)
        self.assertEqual((len(index), index.owner_count()), (1, 1))
        self.assertEqual(index.match("abc;c"), ("bob",))

    def test_badPatternChangesNothing(self) -> None:
        """A pattern that does not compile raises PatternError and leaves no trace."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.match("a")
        error = self.assertRaises(PatternError, index.subscribe, "ann", "mqtt:a/#/b")
        self.assertEqual(str(error), "mqtt: '#' must be the last level")
        self.assertEqual((len(index), index.owner_count()), (0, 0))
        self.assertEqual(index.match("a"), ())

    def test_ownerOnceWhateverItsPatterns(self) -> None:
        """An owner with several matching patterns appears once in a match."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        for pattern in ("a", "prefix:a", "topic:#", "mqtt:#"):
            index.subscribe("ann", pattern)
        index.subscribe("bob", "topic:#")
        self.assertEqual(index.match("a.b"), ("ann", "bob"))

    def test_everyKindInOneIndex(self) -> None:
        """Patterns of every kind live side by side in one index."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("regex", "usd")
        index.subscribe("prefix", "prefix:gold.")
        index.subscribe("topic", "topic:*.lon.#")
        index.subscribe("mqtt", "mqtt:gold/#")
        index.subscribe("nats", "nats:gold.>")
        index.subscribe("fields", "fields:currency=USD")
        self.assertEqual(set(index.match("gold.lon.usd")), {"regex", "prefix", "topic", "nats"})
        self.assertEqual(set(index.match("gold/ny")), {"mqtt"})
        self.assertEqual(set(index.match("currency=USD")), {"fields"})

    def test_ownersAreAnyHashable(self) -> None:
        """Owners are arbitrary hashable objects, compared as the objects they are."""

        class Client:
            pass

        first, second = Client(), Client()
        index: SubscriptionIndex[Client] = SubscriptionIndex()
        index.subscribe(first, "a")
        index.subscribe(second, "a")
        self.assertEqual(index.match("a"), (first, second))

    def test_ownerMatches(self) -> None:
        """owner_matches says whether one owner wants a subject, cached or not."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "topic:a.*")
        index.subscribe("ann", "prefix:z")
        for _ in range(2):  # first not cached, then cached
            self.assertTrue(index.owner_matches("ann", "a.b"))
            self.assertTrue(index.owner_matches("ann", "zz"))
            self.assertFalse(index.owner_matches("ann", "b.a"))
            self.assertFalse(index.owner_matches("bob", "a.b"))
            for subject in ("a.b", "zz", "b.a"):
                index.match(subject)

    def test_negativeCacheSize(self) -> None:
        """A negative cache size is a ValueError."""
        self.assertRaises(ValueError, SubscriptionIndex, -1)


class CacheTests(SynchronousTestCase):
    def test_hitReturnsTheBuiltTuple(self) -> None:
        """A second match of a subject is a hit returning the very same tuple."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        first = index.match("a")
        self.assertIs(index.match("a"), first)
        self.assertEqual(index.stats, CacheStats(hits=1, misses=1, compiles=1, evictions=0))

    def test_noMatchIsCachedToo(self) -> None:
        """A subject nobody wants is cached like any other."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        self.assertEqual(index.match("b"), ())
        self.assertEqual(index.match("b"), ())
        self.assertEqual(index.stats, CacheStats(hits=1, misses=1, compiles=1, evictions=0))

    def test_leastRecentlyUsedEvicted(self) -> None:
        """Past its size the cache drops the subject used longest ago."""
        index: SubscriptionIndex[str] = SubscriptionIndex(cache_size=2)
        index.subscribe("ann", "")
        for subject in ("s1", "s2", "s1", "s3"):  # s2 is the oldest when s3 comes
            index.match(subject)
        self.assertEqual(index.stats, CacheStats(hits=1, misses=3, compiles=3, evictions=1))
        index.match("s1")
        index.match("s3")
        self.assertEqual(index.stats.hits, 3)
        index.match("s2")
        self.assertEqual(index.stats, CacheStats(hits=3, misses=4, compiles=4, evictions=2))
        self.assertEqual(index.cached_subjects(), 2)

    def test_cacheOff(self) -> None:
        """With cache_size=0 every match computes its result and nothing is kept."""
        index: SubscriptionIndex[str] = SubscriptionIndex(cache_size=0)
        index.subscribe("ann", "a")
        self.assertEqual(index.match("a"), ("ann",))
        self.assertEqual(index.match("a"), ("ann",))
        self.assertEqual(index.stats, CacheStats(hits=0, misses=0, compiles=2, evictions=0))
        self.assertEqual((index.cache_size, index.cached_subjects()), (0, 0))

    def test_newPatternUpdatesCachedSubjects(self) -> None:
        """A new pattern joins the cached results it matches, without recompiling."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "topic:a.*")
        self.assertEqual(index.match("a.b"), ("ann",))
        self.assertEqual(index.match("c.d"), ())
        index.subscribe("bob", "topic:*.b")
        self.assertEqual(index.match("a.b"), ("ann", "bob"))
        self.assertEqual(index.match("c.d"), ())
        self.assertEqual(index.match_bits("a.b"), BitMap([0, 1]))
        self.assertEqual(index.stats.compiles, 2)

    def test_newOwnerOfKnownPatternUpdatesCachedSubjects(self) -> None:
        """An owner joining an existing bit joins the cached results holding that bit."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        index.match("a")
        index.subscribe("bob", "a")
        index.subscribe("ann", "prefix:a")  # ann already there: not twice
        self.assertEqual(index.match("a"), ("ann", "bob"))
        self.assertEqual(index.stats.compiles, 1)

    def test_removalUpdatesCachedSubjects(self) -> None:
        """
        Unsubscribing takes an owner out of the cached results unless another
        of its patterns still matches; a retired pattern's bit leaves them too.
        """
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        index.subscribe("ann", "prefix:a")
        index.subscribe("bob", "a")
        index.subscribe("cat", "nats:>")
        self.assertEqual(index.match("a"), ("ann", "bob", "cat"))
        index.unsubscribe("ann", "a")
        self.assertEqual(index.match("a"), ("ann", "bob", "cat"))
        index.unsubscribe("ann", "prefix:a")
        self.assertEqual(index.match("a"), ("bob", "cat"))
        self.assertEqual(index.match_bits("a"), BitMap([0, 2]))
        index.unsubscribe_owner("bob")
        self.assertEqual(index.match("a"), ("cat",))
        self.assertEqual(index.match_bits("a"), BitMap([2]))
        self.assertEqual(index.stats.compiles, 1)

    def test_reusedBitDoesNotInheritCachedSubjects(self) -> None:
        """A freed bit given to a new pattern carries none of the old pattern's subjects."""
        index: SubscriptionIndex[str] = SubscriptionIndex()
        index.subscribe("ann", "a")
        index.match("a")
        index.unsubscribe("ann", "a")
        index.subscribe("bob", "b")
        self.assertEqual(index.pattern_bit("b"), 0)
        self.assertEqual(index.match("a"), ())
        self.assertEqual(index.match("b"), ("bob",))


class WhitepaperTopicExampleTests(SynchronousTestCase):
    """
    Appendix A, "Topic Matching Example". The whitepaper defines ``*`` as one
    topic name part, yet lists ``forex.*`` as matching ``forex``; its ``#``
    list also omits ``forex.eur``, which its bitmap table includes. The table
    is reproduced exactly by ``forex.#`` (AMQP: zero or more words) as
    subscription 0; ``forex.*`` gives the same table save that one cell.
    """

    TOPICS = ("forex", "forex.gbp", "forex.eur", "forex.usd", "trade", "trade.usd", "trade.jpy")
    # The whitepaper's bitmap table: topic -> bits of subscriptions 0..3.
    TABLE: ClassVar[dict[str, list[int]]] = {
        "forex": [0, 3],
        "forex.gbp": [0, 3],
        "forex.eur": [0, 2, 3],
        "forex.usd": [0, 1, 3],
        "trade": [3],
        "trade.usd": [1, 3],
        "trade.jpy": [3],
    }

    def _index(self, first: str) -> SubscriptionIndex[int]:
        index: SubscriptionIndex[int] = SubscriptionIndex()
        for number, pattern in enumerate((first, "topic:*.usd", "topic:*.eur", "topic:#")):
            index.subscribe(number, pattern)
            self.assertEqual(index.pattern_bit(pattern), number)
        return index

    def test_bitmapTable(self) -> None:
        """Each topic's result bitmap is the whitepaper's table row."""
        index = self._index("topic:forex.#")
        for topic in self.TOPICS:
            self.assertEqual(index.match_bits(topic), BitMap(self.TABLE[topic]), topic)

    def test_messages(self) -> None:
        """Messages A, B and C reach the requests the whitepaper lists."""
        index = self._index("topic:forex.#")
        self.assertEqual(index.match("forex.eur"), (0, 2, 3))
        self.assertEqual(index.match("forex"), (0, 3))
        self.assertEqual(index.match("trade.jpy"), (3,))

    def test_starIsOneWord(self) -> None:
        """With ``forex.*`` the table holds except that ``forex`` is not matched."""
        index = self._index("topic:forex.*")
        for topic in self.TOPICS:
            expected = [b for b in self.TABLE[topic] if (topic, b) != ("forex", 0)]
            self.assertEqual(index.match_bits(topic), BitMap(expected), topic)


class WhitepaperFieldExampleTests(SynchronousTestCase):
    """Appendix A, "Field Matching Example", with ``;`` between fields."""

    SUBSCRIPTIONS = ("currency=USD;urgent", "currency=EUR", "market=forex;currency=EUR", "urgent")
    MESSAGES: ClassVar[dict[str, str]] = {
        "A": "currency=JPY;market=forex;slow",
        "B": "currency=JPY;urgent",
        "C": "market=forex;currency=EUR",
    }

    def test_criteriaTable(self) -> None:
        """The inverted criterion index holds the whitepaper's bitmap per criterion."""
        fields = FieldIndex()
        for bit, criteria in enumerate(self.SUBSCRIPTIONS):
            fields.add(bit, parse_pattern("fields:" + criteria))
        table = {
            ("currency", None): [],
            ("currency", "USD"): [0],
            ("currency", "EUR"): [1, 2],
            ("market", None): [],
            ("market", "forex"): [2],
            ("urgent", None): [0, 3],
        }
        for criterion, bits in table.items():
            self.assertEqual(fields.wanted_by(criterion), BitMap(bits), criterion)

    def test_allOfIsHitsEqualToCriteria(self) -> None:
        """
        With AND (hits equal to the criteria count) message A reaches nobody,
        B reaches 3 and C reaches 1 and 2.
        """
        index: SubscriptionIndex[int] = SubscriptionIndex()
        for number, criteria in enumerate(self.SUBSCRIPTIONS):
            index.subscribe(number, "fields:" + criteria)
        self.assertEqual(index.match(self.MESSAGES["A"]), ())
        self.assertEqual(index.match(self.MESSAGES["B"]), (3,))
        self.assertEqual(index.match(self.MESSAGES["C"]), (1, 2))

    def test_anyOfIsOneHit(self) -> None:
        """
        With OR (one hit or more) the Hits rows read: A reaches 2, B reaches 0
        and 3, C reaches 1 and 2.
        """
        index: SubscriptionIndex[int] = SubscriptionIndex()
        for number, criteria in enumerate(self.SUBSCRIPTIONS):
            index.subscribe(number, "fields:" + criteria.replace(";", "|"))
        self.assertEqual(index.match(self.MESSAGES["A"]), (2,))
        self.assertEqual(index.match(self.MESSAGES["B"]), (0, 3))
        self.assertEqual(index.match(self.MESSAGES["C"]), (1, 2))


class RegexIndexTests(SynchronousTestCase):
    """The regular-expression index: one RE2 Set, kept up to date lazily."""

    def add(self, index: RegexIndex, bit: int, expression: str) -> None:
        index.add(bit, parse_pattern(f"regex:{expression}"))

    def remove(self, index: RegexIndex, bit: int, expression: str) -> None:
        index.remove(bit, parse_pattern(f"regex:{expression}"))

    def test_burstIsOneBuild(self) -> None:
        """
        Adding many patterns builds nothing; the next lookup compiles them
        into one Set, and lookups after that use it without rebuilding.
        """
        index = RegexIndex()
        for bit in range(200):
            self.add(index, bit, rf"^sensor\.{bit}\..*temp$")
        self.assertEqual(index.stats.builds, 0)
        self.assertEqual(index.lookup("sensor.7.room.temp"), BitMap([7]))
        self.assertEqual(index.lookup("sensor.17temp"), BitMap())
        self.assertEqual(index.lookup("sensor.199.x.temp"), BitMap([199]))
        self.assertEqual(index.stats, RegexStats(builds=1, fallbacks=0))
        self.assertEqual(len(index), 200)

    def test_fewChangesDoNotRebuild(self) -> None:
        """
        After a build, a removed pattern stops matching and an added one
        matches (asked on its own) without another build, even when the
        removed pattern's bit is reused.
        """
        index = RegexIndex(recent_limit=2)
        for bit in range(10):
            self.add(index, bit, f"^p{bit}$")
        index.lookup("x")
        self.remove(index, 5, "^p5$")
        self.assertEqual(index.lookup("p5"), BitMap())
        self.add(index, 5, "^q$")
        self.assertEqual(index.lookup("q"), BitMap([5]))
        self.assertEqual(index.lookup("p5"), BitMap())
        self.add(index, 10, "p")
        self.assertEqual(index.lookup("p6"), BitMap([6, 10]))
        self.remove(index, 5, "^q$")
        self.assertEqual(index.lookup("q"), BitMap())
        self.assertEqual(index.stats.builds, 1)

    def test_manyAddsRebuild(self) -> None:
        """More added patterns than the index asks one by one make the next lookup rebuild."""
        index = RegexIndex(recent_limit=2)
        for bit in range(3):
            self.add(index, bit, f"a{bit}")
        index.lookup("a")
        self.assertEqual(index.stats.builds, 1)
        for bit in range(3, 5):
            self.add(index, bit, f"b{bit}")
        self.assertEqual(index.lookup("a0b3"), BitMap([0, 3]))
        self.assertEqual(index.stats.builds, 1)
        self.add(index, 5, "c")
        self.assertEqual(index.lookup("a0b3c"), BitMap([0, 3, 5]))
        self.assertEqual(index.stats.builds, 2)

    def test_defaultLimitGrowsWithTheIndex(self) -> None:
        """
        By default the index asks up to MIN_RECENT new patterns one by one,
        more (the square root of BUILD_COST per pattern) in a large index.
        """
        small = RegexIndex()
        for bit in range(MIN_RECENT):
            self.add(small, bit, f"p{bit}")
        self.assertEqual(small.lookup("p3"), BitMap([3]))
        self.assertEqual(small.stats.builds, 0)
        self.add(small, MIN_RECENT, "q")
        small.lookup("q")
        self.assertEqual(small.stats.builds, 1)
        large = RegexIndex()
        for bit in range(10_000):
            self.add(large, bit, f"^p{bit}$")
        large.lookup("p")
        limit = math.isqrt(BUILD_COST * 10_100)
        for bit in range(10_000, 10_000 + limit):
            self.add(large, bit, f"^q{bit}$")
        self.assertEqual(large.lookup(f"q{10_000 + limit - 1}"), BitMap([10_000 + limit - 1]))
        self.assertEqual(large.stats.builds, 1)

    def test_lookupsPayForARebuild(self) -> None:
        """
        Patterns asked one by one at every lookup are folded into the Set
        once those checks would have paid for a build (BUILD_COST per pattern).
        """
        index = RegexIndex(recent_limit=5)
        for bit in range(10):
            self.add(index, bit, f"p{bit}")
        index.lookup("p1")
        self.add(index, 10, "q")
        for _ in range(BUILD_COST * 11):
            self.assertEqual(index.lookup("q"), BitMap([10]))
        self.assertEqual(index.stats.builds, 1)
        self.assertEqual(index.lookup("q"), BitMap([10]))
        self.assertEqual(index.stats.builds, 2)

    def test_mostlyRemovedRebuilds(self) -> None:
        """When removed patterns outnumber the live ones in the Set, it is rebuilt without them."""
        index = RegexIndex(recent_limit=0)
        for bit in range(10):
            self.add(index, bit, f"p{bit}")
        index.lookup("p")
        for bit in range(5):
            self.remove(index, bit, f"p{bit}")
        self.assertEqual(index.lookup("p1 p7"), BitMap([7]))
        self.assertEqual(index.stats.builds, 1)
        self.remove(index, 5, "p5")
        self.assertEqual(index.lookup("p1 p7"), BitMap([7]))
        self.assertEqual(index.stats.builds, 2)

    def test_emptyIndexForgetsItsSet(self) -> None:
        """Removing every pattern drops the Set; patterns added later are found."""
        index = RegexIndex(recent_limit=0)
        self.add(index, 0, "a")
        index.lookup("a")
        self.remove(index, 0, "a")
        self.assertEqual(len(index), 0)
        self.add(index, 0, "b")
        self.assertEqual(index.lookup("ab"), BitMap([0]))
        self.assertEqual(index.stats.builds, 2)

    def test_setTooLargeFallsBack(self) -> None:
        """
        A Set that does not compile within its memory bound is counted, and
        each pattern is asked in turn instead (still on RE2); no build is
        tried again until the patterns shrink, then it is.
        """
        index = RegexIndex(recent_limit=0, set_max_mem=1 << 14)
        for bit in range(50):
            self.add(index, bit, rf"^sensor\.{bit}\..*(temp|humidity)$")
        self.assertEqual(index.lookup("sensor.3.x.temp"), BitMap([3]))
        self.assertEqual(index.stats, RegexStats(builds=0, fallbacks=1))
        self.add(index, 50, "temp")
        self.assertEqual(index.lookup("sensor.3.x.temp"), BitMap([3, 50]))
        self.assertEqual(index.stats, RegexStats(builds=0, fallbacks=1))
        for bit in range(1, 51):
            self.remove(index, bit, "unused")
        self.assertEqual(index.lookup("sensor.0.temp"), BitMap([0]))
        self.assertEqual(index.stats, RegexStats(builds=1, fallbacks=1))

    def test_explosivePatternsInTheSet(self) -> None:
        """Explosive patterns in the Set answer a subject that sets them off at once."""
        index = RegexIndex(recent_limit=0)
        for bit, expression in enumerate(("(a+)+$", "(a|aa)+$", "(a*)*b")):
            self.add(index, bit, expression)
        self.assertEqual(index.lookup("a" * 10_000 + "c"), BitMap())
        self.assertEqual(index.lookup("a" * 30 + "b"), BitMap([2]))
        self.assertEqual(index.lookup("a" * 30), BitMap([0, 1]))
        self.assertEqual(index.stats.builds, 1)
