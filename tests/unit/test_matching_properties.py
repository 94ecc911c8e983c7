"""
Property tests of L{malamute_pack.matching.SubscriptionIndex} against a naive
oracle: a plain model of who subscribed with what, where a subject's owners
are found by asking every pattern directly (``parse_pattern(p).matches``).

Hypothesis interleaves subscribe, unsubscribe, unsubscribe_owner and match
over every pattern kind, with caches from off to tiny (evicting all the time)
to roomy, so cached results must stay true through every change.

For regular expressions, two more oracles: Python's re, which RE2 must agree
with on the syntax they share, and each pattern asked on its own, which the
regular-expression index's RE2 Set must agree with through any changes.
"""

# twisted.trial's assertion methods carry no annotations.

from __future__ import annotations

import re
import warnings

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyroaring import BitMap
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.matching import Pattern, PatternError, SubscriptionIndex, parse_pattern
from malamute_pack.matching.regex import SET_MAX_MEM, RegexIndex

OWNERS = ("ann", "bob", "cat", "dan")


def _joined(separator: str, pieces: list[str], size: int) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(pieces), min_size=1, max_size=size).map(separator.join)


_MQTT_BODY = st.one_of(
    st.tuples(_joined("/", ["a", "b", "", "+"], 3), st.sampled_from(["", "/#"])).map("".join),
    st.just("#"),
)

PATTERNS = st.one_of(
    st.sampled_from(["", "a", "^a", "b$", r"a\.b", "[ab]/", "a|c", "^$", "=1", "regex:topic:a"]),
    st.text(alphabet="ab./", max_size=3).map("prefix:".__add__),
    _joined(".", ["a", "b", "*", "#"], 4).map("topic:".__add__),
    _MQTT_BODY.filter(bool).map("mqtt:".__add__),
    st.tuples(_joined(".", ["a", "b", "*"], 3), st.sampled_from(["", ".>"]))
    .map("".join)
    .map("nats:".__add__),
    st.tuples(
        st.lists(st.sampled_from(["a=1", "a", "b=1", "b", "c=", "a=2"]), min_size=1, max_size=3),
        st.sampled_from([";", "|"]),
    ).map(lambda parts: "fields:" + parts[1].join(parts[0])),
)

_WORDS = ["a", "b", "c", ""]
# A small pool of subjects recurs, so results are cached and then must follow
# subscription changes; fresh ones keep compiling and evicting.
_POOL = ["", "a", "a.b", "a/b", "b.a.b", "a/", "c", "a=1;b", "b=1|a", "topic:a", "prefix"]
SUBJECTS = st.one_of(
    st.sampled_from(_POOL),
    st.lists(st.sampled_from(_WORDS), max_size=4).map(".".join),
    st.lists(st.sampled_from(_WORDS), max_size=4).map("/".join),
    st.lists(st.sampled_from(["a=1", "a=2", "b", "b=1", "c=", " a = 1 ", "=1"]), max_size=4).map(
        ";".join
    ),
    st.text(alphabet="ab./=;", max_size=6),
)


class IndexAgainstOracle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, set[str]] = {}
        self.index: SubscriptionIndex[str] = SubscriptionIndex()
        self.lookups = 0

    @initialize(cache_size=st.sampled_from([0, 1, 3, 10_000]))
    def make_index(self, cache_size: int) -> None:
        self.index = SubscriptionIndex(cache_size)

    @rule(owner=st.sampled_from(OWNERS), pattern=PATTERNS)
    def subscribe(self, owner: str, pattern: str) -> None:
        fresh = pattern not in self.model.get(owner, set())
        used = {self.index.pattern_bit(p) for p in self._distinct()}
        assert self.index.subscribe(owner, pattern) == fresh
        if self.index.pattern_bit(pattern) not in used:
            lowest_free = min(set(range(len(used) + 1)) - used)
            assert self.index.pattern_bit(pattern) == lowest_free
        self.model.setdefault(owner, set()).add(pattern)

    def _distinct(self) -> set[str]:
        return set().union(*self.model.values())

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def unsubscribe_held(self, data: st.DataObject) -> None:
        owner = data.draw(st.sampled_from(sorted(o for o, ps in self.model.items() if ps)))
        pattern = data.draw(st.sampled_from(sorted(self.model[owner])))
        assert self.index.unsubscribe(owner, pattern)
        self.model[owner].discard(pattern)

    @rule(owner=st.sampled_from(OWNERS), pattern=PATTERNS)
    def unsubscribe_any(self, owner: str, pattern: str) -> None:
        held = pattern in self.model.get(owner, set())
        assert self.index.unsubscribe(owner, pattern) == held
        self.model.get(owner, set()).discard(pattern)

    @rule(owner=st.sampled_from(OWNERS))
    def unsubscribe_owner(self, owner: str) -> None:
        assert self.index.unsubscribe_owner(owner) == len(self.model.pop(owner, set()))

    @rule(subject=SUBJECTS)
    def match(self, subject: str) -> None:
        wanted = {
            pattern
            for patterns in self.model.values()
            for pattern in patterns
            if parse_pattern(pattern).matches(subject)
        }
        expected = {o for o, patterns in self.model.items() if patterns & wanted}
        got = self.index.match(subject)
        assert len(got) == len(set(got)), got
        assert set(got) == expected, (subject, got, expected)
        bits = BitMap(self.index.pattern_bit(p) or 0 for p in wanted)
        assert self.index.match_bits(subject) == bits
        self.lookups += 2
        for owner in OWNERS:
            assert self.index.owner_matches(owner, subject) == (owner in expected)

    @invariant()
    def counts(self) -> None:
        distinct = self._distinct()
        assert len(self.index) == len(distinct)
        assert self.index.owner_count() == sum(1 for ps in self.model.values() if ps)
        assert None not in {self.index.pattern_bit(p) for p in distinct}

    @invariant()
    def cache_bookkeeping(self) -> None:
        stats, cached = self.index.stats, self.index.cached_subjects()
        assert cached <= self.index.cache_size
        if self.index.cache_size:
            assert stats.hits + stats.misses == self.lookups
            assert stats.compiles == stats.misses
            assert stats.evictions == stats.misses - cached
        else:
            assert (stats.hits, stats.misses, stats.evictions) == (0, 0, 0)
            assert stats.compiles == self.lookups


class IndexPropertyTests(SynchronousTestCase):
    def test_agreesWithOracle(self) -> None:
        """
        Over random interleavings of subscribe, unsubscribe, unsubscribe_owner
        and match, for every pattern kind and cache size, the index returns
        exactly the owners (each once) and bits the oracle finds, owner_matches
        agrees, a new pattern takes the lowest free bit, and the cache counters
        add up.
        """
        run_state_machine_as_test(
            IndexAgainstOracle,
            settings=settings(max_examples=300, stateful_step_count=50, deadline=None),
        )


# Regular expressions over a small alphabet, in the syntax Python's re and RE2
# share (plus \Z and {,n}, which the broker rewrites for RE2), with nested
# quantifiers and alternations: the shapes that explode on a backtracking
# engine, kept small enough for re to answer as the reference.
_QUANTIFIERS = ["*", "+", "?", "{,2}", "{1,2}", "{2}", "*?", "+?"]
_REGEX_BODY = st.recursive(
    st.sampled_from(["a", "b", ".", "[ab]", "[^a]", r"\.", "a.b", "ab"]),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda pair: f"(?:{pair[0]}|{pair[1]})"),
        inner.map("({})".format),
        st.tuples(inner, st.sampled_from(_QUANTIFIERS)).map(lambda q: f"(?:{q[0]}){q[1]}"),
    ),
    max_leaves=6,
)
REGEXES = st.tuples(
    st.sampled_from(["", "^", r"\A"]), _REGEX_BODY, st.sampled_from(["", "$", r"\Z"])
).map("".join)
REGEX_SUBJECTS = st.text(alphabet="ab.", max_size=8)

# Fragments where the two engines' readings of the same text could part:
# braces (counts past RE2's, leading zeros, text), anchors and quantifiers,
# group names, flags groups, numeric escapes. Nothing RE2 alone has (\p,
# \x{...}, \Q, (?U)), and no \B, which Python alone never finds in "".
_BORDER_FRAGMENTS = [
    *"ab{},0129()?*+|^$[]-:",
    *(r"\b", r"\A", r"\Z", r"\1", r"\0", r"\7", r"\4", r"\8", r"\{"),
    *("(?i)", "(?s)", "(?-i)", "(?)", "(?:", "(?i:", "(?-i:", "(?=a)"),
    *("(?P<x>", "(?P<y>", "(?P<1>", "(?<x>", "(?P=x)"),
    *("{1001}", "{0999}", "{999999999}", "{9999999999}", "{,1001}", "{2,1}", "{00,001}"),
    *("{1,2,3}", "{ 2}", "*?", "??"),
]
BORDER_REGEXES = st.lists(st.sampled_from(_BORDER_FRAGMENTS), min_size=1, max_size=6).map("".join)
BORDER_SUBJECTS = st.text(alphabet="abAB{},0129\x00\n\x08", max_size=6)


class RegexPropertyTests(SynchronousTestCase):
    @settings(max_examples=500, deadline=None)
    @given(REGEXES, REGEX_SUBJECTS)
    def test_re2AgreesWithPythonRe(self, expression: str, subject: str) -> None:
        """
        For the syntax both engines share (and \\Z, {,n}), a pattern matches a
        subject (without newlines) on RE2 exactly when re.search finds it: v1
        patterns keep their meaning.
        """
        self.assertEqual(
            parse_pattern(f"regex:{expression}").matches(subject),
            re.search(expression, subject) is not None,
            (expression, subject),
        )

    @settings(max_examples=2000, deadline=None)
    @given(BORDER_REGEXES, st.lists(BORDER_SUBJECTS, min_size=1, max_size=4))
    def test_noOtherReading(self, expression: str, subjects: list[str]) -> None:
        """
        A pattern Python's re refuses is refused, and one both take matches
        exactly the subjects re.search finds (but for $ before a final
        newline): the broker never runs a pattern RE2 reads otherwise than
        Python (repetition counts, braces, quantified anchors, group names,
        flags groups, octal escapes and backreferences).
        """
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # re's FutureWarning on "[[" and such
                reference: re.Pattern[str] | None = re.compile(expression)
        except (re.error, OverflowError):
            reference = None
        try:
            pattern: Pattern | None = parse_pattern(f"regex:{expression}")
        except PatternError:
            pattern = None
        if reference is None:
            self.assertIsNone(pattern, f"{expression!r}: Python refuses it, the broker took it")
        elif pattern is not None:
            for subject in subjects:
                if "$" in expression and "\n" in subject:
                    continue  # documented: RE2's $ is only at the very end
                self.assertEqual(
                    pattern.matches(subject),
                    reference.search(subject) is not None,
                    (expression, subject),
                )

    @settings(max_examples=300, deadline=None)
    @given(
        st.sampled_from([None, 0, 1, 3]),
        st.sampled_from([SET_MAX_MEM, 1 << 13]),
        st.lists(
            st.one_of(
                st.tuples(st.just("add"), REGEXES),
                st.tuples(st.just("remove"), st.integers(0, 30)),
                st.tuples(st.just("lookup"), REGEX_SUBJECTS),
            ),
            max_size=60,
        ),
    )
    def test_setLookupEqualsEachPattern(
        self, recent_limit: int | None, set_max_mem: int, steps: list[tuple[str, object]]
    ) -> None:
        """
        Through any interleaving of adds, removes (bits reused lowest first)
        and lookups, with rebuilds early or late and Sets that may not fit,
        RegexIndex.lookup finds exactly the bits whose pattern matches on its
        own.
        """
        index = RegexIndex(recent_limit=recent_limit, set_max_mem=set_max_mem)
        model: dict[int, Pattern] = {}
        for action, argument in steps:
            if action == "add":
                bit = min(set(range(len(model) + 1)) - set(model))
                model[bit] = parse_pattern(f"regex:{argument}")
                index.add(bit, model[bit])
            elif action == "remove" and model:
                bit = sorted(model)[int(str(argument)) % len(model)]
                index.remove(bit, model.pop(bit))
            elif action == "lookup" and model:
                subject = str(argument)
                wanted = BitMap(bit for bit, pattern in model.items() if pattern.matches(subject))
                self.assertEqual(index.lookup(subject), wanted, (subject, model))
            self.assertEqual(len(index), len(model))
