"""
Tests for the pattern kinds of L{malamute_pack.matching}: what each kind
matches (its direct ``matches``, the oracle of the index), how a scheme picks
a kind, and the reason every malformed pattern is refused with.
"""

# twisted.trial's assertion methods carry no annotations.

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.matching import PatternError, parse_pattern, validate_pattern
from malamute_pack.matching.fields import FieldsPattern, subject_criteria
from malamute_pack.matching.words import WordPattern, tokens_match


class _MatchAssertions(SynchronousTestCase):
    def assertMatches(self, pattern: str, matching: list[str], other: list[str]) -> None:
        compiled = parse_pattern(pattern)
        for subject in matching:
            self.assertTrue(compiled.matches(subject), f"{pattern!r} should match {subject!r}")
        for subject in other:
            self.assertFalse(compiled.matches(subject), f"{pattern!r} should not match {subject!r}")

    def assertRefused(self, pattern: str, reason: str) -> None:
        error = self.assertRaises(PatternError, parse_pattern, pattern)
        self.assertEqual(str(error), reason)


class SchemeTests(_MatchAssertions):
    def test_schemesPickKinds(self) -> None:
        """
        Each scheme prefix picks its kind; a pattern without a known scheme is
        a regular expression, so v1 patterns keep their meaning.
        """
        kinds = {
            "prefix:a": "prefix",
            "topic:a": "topic",
            "mqtt:a": "mqtt",
            "nats:a": "nats",
            "fields:a": "fields",
            "regex:a": "regex",
            "a.*": "regex",
            "http://x": "regex",
            "Topic:a": "regex",
            "": "regex",
        }
        for text, kind in kinds.items():
            pattern = parse_pattern(text)
            self.assertEqual((pattern.kind, pattern.text), (kind, text))

    def test_regexSchemeEscapesOtherSchemes(self) -> None:
        """
        ``regex:`` makes the rest a regular expression even when it starts with
        another scheme, the way to send a regex that begins with ``topic:``.
        """
        self.assertMatches("regex:topic:a", ["topic:a", "xtopic:ab"], ["topic:b", "a"])

    def test_patternErrorIsValueError(self) -> None:
        """PatternError is a ValueError whose text is the bare reason."""
        error = self.assertRaises(ValueError, parse_pattern, "topic:")
        self.assertIsInstance(error, PatternError)
        self.assertEqual(str(error), "topic: empty word")

    def test_validatePattern(self) -> None:
        """validate_pattern returns None for a good pattern and raises for a bad one."""
        validate_pattern("topic:a.*")  # no error
        self.assertRaises(PatternError, validate_pattern, "nats:a..b")


class RegexTests(_MatchAssertions):
    def test_searchSemantics(self) -> None:
        """A regular expression matches anywhere in the subject, as re.search does."""
        self.assertMatches("b", ["b", "abc", "a.b"], ["", "a"])
        self.assertMatches("^a", ["a", "abc"], ["ba"])
        self.assertMatches(r"usd\.buy$", ["gold.usd.buy"], ["gold.usd.buy.spot"])

    def test_emptyMatchesEverything(self) -> None:
        """The empty pattern (what a v1 client sends for "all") matches every subject."""
        self.assertMatches("", ["", "a", "x.y/z"], [])

    def test_badExpression(self) -> None:
        """An expression that does not compile is refused with RE2's reason."""
        self.assertRefused("a(b", "regex: missing ): a(b")
        self.assertRefused("a{1001}", "regex: invalid repetition size: {1001}")

    def test_explosivePatternsRunInLinearTime(self) -> None:
        """
        Patterns that make a backtracking engine take time exponential in the
        subject (``(a+)+$`` on many a's and a b) simply answer False on RE2.
        """
        for pattern in ("(a+)+$", "(a|aa)+$", "(a*)*b$", "(.*a){20}$"):
            self.assertFalse(parse_pattern(pattern).matches("a" * 10_000 + "c"), pattern)
        self.assertFalse(parse_pattern("(a+)+$").matches("a" * 10_000 + "b"))
        self.assertTrue(parse_pattern("(a+)+$").matches("b" + "a" * 10_000))

    def test_backreferenceRefused(self) -> None:
        """A backreference (numbered or named) is refused with a reason that names it."""
        self.assertRefused(
            r"(a)\1",
            "regex: backreferences are not supported (patterns run on RE2, which matches "
            r"in linear time): invalid escape sequence: \1",
        )
        error = self.assertRaises(PatternError, parse_pattern, "(?P<x>a)(?P=x)")
        self.assertIn("backreferences are not supported", str(error))

    def test_unsupportedFeaturesNamed(self) -> None:
        """Each Python-only construct RE2 cannot run is refused naming the feature."""
        features = {
            "a(?=b)": "lookahead and lookbehind assertions",
            "a(?!b)": "lookahead and lookbehind assertions",
            "(?<=a)b": "lookahead and lookbehind assertions",
            "(?<!a)b": "lookahead and lookbehind assertions",
            "(?>a+)b": "atomic groups",
            "a*+b": "possessive quantifiers",
            "a{2}+": "possessive quantifiers",
            "(a)?(?(1)b|c)": "conditional groups",
            "(?#note)a": "comments",
            "(?x) a": "the a, L, u and x flags",
        }
        for pattern, feature in features.items():
            error = self.assertRaises(PatternError, parse_pattern, pattern)
            self.assertTrue(str(error).startswith(f"regex: {feature} are not supported"), error)

    def test_pythonSpellingsKept(self) -> None:
        r"""
        ``\Z`` and ``{,n}``, which RE2 refuses or reads literally, mean what
        they mean in Python; escaped or inside a class they are left alone.
        """
        self.assertMatches(r"a\Z", ["a", "ba"], ["ab", "a\n"])
        self.assertMatches("^a{,2}b$", ["b", "ab", "aab"], ["aaab", "a{,2}b"])
        self.assertMatches("^a{,}b$", ["b", "aaab"], ["a{,}b"])
        self.assertMatches(r"a\\Z", ["a\\Z"], ["a"])
        self.assertMatches("^[{,2}]$", ["{", ","], ["", "a"])
        self.assertMatches(r"^a\{,2}$", ["a{,2}"], ["a"])
        self.assertMatches("(?P<word>a)b", ["ab"], ["a"])

    def test_re2Meanings(self) -> None:
        r"""
        Where RE2 reads the same text otherwise than Python (documented in
        docs/protocol.md): ASCII ``\d``/``\w``, and ``$`` only at the very end.
        """
        self.assertMatches(r"^\d$", ["3"], ["\u0663"])
        self.assertMatches(r"^\w$", ["e"], ["\u00e9"])
        self.assertMatches(r"^\p{Nd}$", ["3", "\u0663"], ["a"])
        self.assertMatches("a$", ["a"], ["a\n"])
        self.assertMatches("(?m)a$", ["a", "a\nb"], ["ab"])

    def test_tooLarge(self) -> None:
        """A pattern whose RE2 program is past MAX_PROGRAM_SIZE is refused, saying so."""
        self.assertRefused(
            ".{1000}", "regex: pattern too large: 8004 RE2 instructions, at most 5000"
        )
        self.assertRefused(
            r"\pL{100}",
            "regex: pattern too large: more than 5000 RE2 instructions, at most 5000",
        )
        self.assertMatches(".{500}", ["a" * 500], ["a" * 499])

    def test_notUtf8(self) -> None:
        """
        Subjects and patterns holding bytes that are not UTF-8 (surrogate
        escapes, as the protocol decodes them) neither crash nor match text.
        """
        self.assertMatches("^a", ["a\udc80"], ["\udc80"])
        error = self.assertRaises(PatternError, parse_pattern, "a\udc80")
        self.assertIn("UTF-8", str(error))


class PrefixTests(_MatchAssertions):
    def test_prefix(self) -> None:
        """A prefix pattern matches the subjects that start with its text."""
        self.assertMatches("prefix:gold.", ["gold.", "gold.lon"], ["gold", "xgold.lon", ""])

    def test_emptyPrefix(self) -> None:
        """The empty prefix matches every subject."""
        self.assertMatches("prefix:", ["", "a"], [])


class TopicTests(_MatchAssertions):
    def test_star(self) -> None:
        """``*`` is exactly one word."""
        self.assertMatches("topic:a.*", ["a.b", "a."], ["a", "a.b.c", "b.a"])
        self.assertMatches("topic:*", ["a", ""], ["a.b"])

    def test_hash(self) -> None:
        """``#`` is zero or more words, anywhere in the pattern."""
        self.assertMatches("topic:a.#", ["a", "a.b", "a.b.c"], ["b", "ab"])
        self.assertMatches("topic:#", ["", "a", "a.b.c"], [])
        self.assertMatches("topic:#.c", ["c", "a.c", "a.b.c"], ["a.c.d", "ac"])
        self.assertMatches("topic:a.#.c", ["a.c", "a.b.c", "a.b.b.c"], ["a.b", "c"])
        self.assertMatches("topic:#.a.#.a.#", ["a.a", "x.a.y.a.z"], ["a", "x.a.y"])

    def test_otherCharactersAreLiteral(self) -> None:
        """MQTT and NATS wildcards mean nothing in a topic pattern."""
        self.assertMatches("topic:a.+.>", ["a.+.>"], ["a.b.c"])

    def test_refused(self) -> None:
        """Empty words and wildcards inside words are refused."""
        self.assertRefused("topic:", "topic: empty word")
        self.assertRefused("topic:a..b", "topic: empty word")
        self.assertRefused("topic:a.", "topic: empty word")
        self.assertRefused("topic:a*", "topic: '*' and '#' must be whole words, not 'a*'")
        self.assertRefused("topic:a.b#", "topic: '*' and '#' must be whole words, not 'b#'")


class MqttTests(_MatchAssertions):
    def test_hashIncludesParent(self) -> None:
        """A final ``#`` matches the parent level and everything below it."""
        self.assertMatches("mqtt:a/#", ["a", "a/", "a/b", "a/b/c"], ["ab", "b/a"])
        self.assertMatches("mqtt:#", ["", "a", "a/b"], [])
        self.assertMatches("mqtt:+/#", ["a", "a/b"], [])

    def test_plus(self) -> None:
        """``+`` is exactly one level, possibly empty."""
        self.assertMatches("mqtt:a/+", ["a/b", "a/"], ["a", "a/b/c"])
        self.assertMatches("mqtt:+/+", ["/", "a/b"], ["a"])

    def test_emptyLevelsAreLevels(self) -> None:
        """MQTT filters may have empty levels, matched literally."""
        self.assertMatches("mqtt:a//b", ["a//b"], ["a/b"])
        self.assertMatches("mqtt:/a", ["/a"], ["a"])

    def test_otherCharactersAreLiteral(self) -> None:
        """``*``, ``>`` and ``.`` are ordinary characters in an MQTT filter."""
        self.assertMatches("mqtt:a.*/>", ["a.*/>"], ["a.b/c"])

    def test_refused(self) -> None:
        """Empty filters, a ``#`` before the end and wildcards inside levels are refused."""
        self.assertRefused("mqtt:", "mqtt: empty filter")
        self.assertRefused("mqtt:a/#/b", "mqtt: '#' must be the last level")
        self.assertRefused("mqtt:a+", "mqtt: '+' and '#' must be whole levels, not 'a+'")
        self.assertRefused("mqtt:a/b#", "mqtt: '+' and '#' must be whole levels, not 'b#'")


class NatsTests(_MatchAssertions):
    def test_greaterThan(self) -> None:
        """A final ``>`` is one or more tokens."""
        self.assertMatches("nats:a.>", ["a.b", "a.b.c"], ["a", "b.a"])
        self.assertMatches("nats:>", ["a", "a.b"], [])

    def test_star(self) -> None:
        """``*`` is exactly one token."""
        self.assertMatches("nats:a.*.c", ["a.b.c"], ["a.c", "a.b.b.c"])

    def test_refused(self) -> None:
        """Empty tokens, a ``>`` before the end and wildcards inside tokens are refused."""
        self.assertRefused("nats:", "nats: empty subject")
        self.assertRefused("nats:a..b", "nats: empty token")
        self.assertRefused("nats:>.a", "nats: '>' must be the last token")
        self.assertRefused("nats:a*", "nats: '*' and '>' must be whole tokens, not 'a*'")
        self.assertRefused("nats:a.b>", "nats: '*' and '>' must be whole tokens, not 'b>'")


class FieldsTests(_MatchAssertions):
    def test_allOf(self) -> None:
        """Criteria joined by ``;`` must all hold: a value, or a field's presence."""
        self.assertMatches(
            "fields:currency=USD;urgent",
            ["currency=USD;urgent", "urgent;x=1;currency=USD", "currency=USD;urgent=yes"],
            ["currency=USD", "urgent", "currency=EUR;urgent", "currency;urgent"],
        )

    def test_anyOf(self) -> None:
        """Criteria joined by ``|`` need only one to hold."""
        self.assertMatches(
            "fields:currency=USD|urgent",
            ["currency=USD", "urgent", "urgent=no;market=forex"],
            ["currency=EUR", "market=forex", ""],
        )

    def test_presence(self) -> None:
        """A bare name wants the field with any value, or none."""
        self.assertMatches("fields:market", ["market", "market=", "market=forex"], ["markets"])

    def test_blanksAreStripped(self) -> None:
        """Blanks around names and values do not count, in patterns and subjects."""
        self.assertMatches("fields: a = 1 ; b ", ["a=1;b", " b ; a= 1"], ["a=11;b"])

    def test_repeatedField(self) -> None:
        """A subject may give a field several values; each one counts."""
        self.assertMatches("fields:tag=x;tag=y", ["tag=x;tag=y"], ["tag=x"])

    def test_subjectCriteria(self) -> None:
        """A subject's criteria are its values and its presences; empty names are ignored."""
        self.assertEqual(
            subject_criteria("a=1;b;;=2; c = 3 "),
            {("a", "1"), ("a", None), ("b", None), ("c", "3"), ("c", None)},
        )

    def test_parsed(self) -> None:
        """A pattern parses to its set of criteria and its rule."""
        pattern = parse_pattern("fields:a=1|b|a=1")
        assert isinstance(pattern, FieldsPattern)
        self.assertEqual(pattern.criteria, {("a", "1"), ("b", None)})
        self.assertFalse(pattern.match_all)

    def test_refused(self) -> None:
        """Empty patterns or criteria, nameless criteria and mixed joiners are refused."""
        self.assertRefused("fields:", "fields: empty criterion")
        self.assertRefused("fields:a;;b", "fields: empty criterion")
        self.assertRefused("fields:a|", "fields: empty criterion")
        self.assertRefused("fields:=1", "fields: criterion '=1' has no field name")
        self.assertRefused("fields:a;b|c", "fields: cannot mix ';' (all of) and '|' (any of)")


_DIALECTS = {
    "topic": (".", ["a", "b", "*", "#"]),
    "mqtt": ("/", ["a", "b", "", "+", "#"]),
    "nats": (".", ["a", "b", "*", ">"]),
}


@st.composite
def _word_pattern_and_subject(draw: st.DrawFn) -> tuple[WordPattern, str]:
    kind = draw(st.sampled_from(sorted(_DIALECTS)))
    separator, pieces = _DIALECTS[kind]
    body = separator.join(draw(st.lists(st.sampled_from(pieces), min_size=1, max_size=5)))
    try:
        pattern = parse_pattern(f"{kind}:{body}")
    except PatternError:
        pattern = parse_pattern(f"{kind}:a")
    assert isinstance(pattern, WordPattern)
    words = draw(st.lists(st.sampled_from(["a", "b", ""]), max_size=6))
    return pattern, separator.join(words)


class WordDefinitionTests(SynchronousTestCase):
    @settings(max_examples=400, deadline=None)
    @given(_word_pattern_and_subject())
    def test_regexTranslationAgrees(self, case: tuple[WordPattern, str]) -> None:
        """
        A word pattern's ``matches`` (a regex translation when it has at most one
        ANY) agrees with the token definition, ``tokens_match``, everywhere.
        """
        pattern, subject = case
        self.assertEqual(
            pattern.matches(subject),
            tokens_match(pattern.tokens, subject.split(pattern.separator)),
        )
