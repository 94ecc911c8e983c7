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
        self.assertRefused("a{1001}", "regex: repetition count 1001 is more than 1000: {1001}")

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

    def test_repetitionCounts(self) -> None:
        """
        Every repetition Python reads in braces means the same on RE2: a
        count above RE2's 1000 (which RE2 refuses, or with ten digits or
        more reads as text, where Python repeats or refuses) and a minimum
        above the maximum are refused, naming the count; leading zeros
        (text to RE2) are read as Python reads them.
        """
        refused = {
            "a{99999999999999}": "repetition count 99999999999999 is more than 1000: "
            "{99999999999999}",
            "a{1001}": "repetition count 1001 is more than 1000: {1001}",
            "a{1,1001}": "repetition count 1001 is more than 1000: {1,1001}",
            "a{1001,}": "repetition count 1001 is more than 1000: {1001,}",
            "a{,1001}": "repetition count 1001 is more than 1000: {,1001}",
            "a{0001001}": "repetition count 1001 is more than 1000: {0001001}",
            "a{4294967296}": "repetition count 4294967296 is more than 1000: {4294967296}",
            "a{2,1}": "repetition minimum 2 is more than its maximum 1: {2,1}",
            "a{02,01}": "repetition minimum 2 is more than its maximum 1: {02,01}",
            "(a{100}){100}": "nested repetition counts multiply to more than 1000: {100}",
        }
        for pattern, reason in refused.items():
            self.assertRefused(pattern, f"regex: {reason}")
        self.assertMatches("^a{02}$", ["aa"], ["a{02}", "a"])
        self.assertMatches("^a{00,003}$", ["", "aaa"], ["aaaa", "a{00,003}"])
        self.assertMatches("^a{1000}$", ["a" * 1000], ["a" * 999])

    def test_ordinaryRepetitions(self) -> None:
        """
        The repetitions everyone writes keep working, and braces Python reads
        as text (``{}``, ``{a}``, ``{ 2}``, ``{1,2,3}``, in a class or
        escaped) are text on RE2 too.
        """
        self.assertMatches("^a{3}$", ["aaa"], ["aa", "aaaa"])
        self.assertMatches("^a{2,5}$", ["aa", "aaaaa"], ["a", "aaaaaa"])
        self.assertMatches("^a{,3}$", ["", "aaa"], ["aaaa"])
        self.assertMatches("^a{2,}?$", ["aa", "aaaaaaa"], ["a"])
        for text in ("a{}", "a{a}", "a{ 2}", "a{1,2,3}", "a{-1}"):
            self.assertMatches(f"^{text}$", [text], ["a", "aa"])
        self.assertMatches(r"^\{99999}$", ["{99999}"], [])
        self.assertMatches("^[{99999}]$", ["{", "9"], ["{99999}"])
        self.assertMatches(r"^\Q{99999}\E$", ["{99999}"], [])
        self.assertMatches(r"^\x{0041}$", ["A"], ["x{0041}"])

    def test_quantifiedAnchorRefused(self) -> None:
        """
        A quantifier on an anchor (``^*``, ``\\b+``), which Python refuses and
        RE2 reads as an empty match, is refused; a quantified group holding
        one is not (as in Python).
        """
        for anchor in ("^", "$", r"\A", r"\Z", r"\b", r"\B"):
            for quantifier in ("*", "+", "?", "{2}", "{,2}"):
                self.assertRefused(
                    f"x{anchor}{quantifier}",
                    f"regex: nothing to repeat: {anchor}{quantifier} "
                    "(an anchor takes no quantifier)",
                )
        self.assertMatches("^(^)*a", ["a"], ["b"])
        self.assertMatches("^{a}", ["{a}"], ["a"])

    def test_groupNames(self) -> None:
        """
        A group name used twice, one that is not a Python identifier (both of
        which RE2 takes) and RE2's ``(?<name>...)`` spelling are refused,
        naming the fault; ordinary names work.
        """
        self.assertRefused("(?P<x>a)(?P<x>b)", "regex: group name 'x' used twice")
        self.assertRefused("(?P<x>a)|((?P<x>b))", "regex: group name 'x' used twice")
        self.assertRefused(
            "(?P<1x>a)",
            "regex: bad group name '1x': a name is a letter or _ then letters, digits or _",
        )
        self.assertRefused(
            "(?P<>a)", "regex: bad group name '': a name is a letter or _ then letters, digits or _"
        )
        self.assertRefused(
            "(?<x>a)", "regex: a named group is written (?P<name>...), as in Python, not (?<x>"
        )
        self.assertMatches("^(?P<n>x)$", ["x"], ["y"])
        self.assertMatches("^(?P<n>x)(?P<_m2>y)(?P<\u00e9>z)$", ["xyz"], ["xy"])

    def test_flagsGroups(self) -> None:
        """
        A flags group that is not at the very start (which RE2 applies from
        there on, Python refuses, and Python before 3.11 applied to the whole
        pattern), one that turns flags off, and an empty one are refused.
        """
        self.assertRefused(
            "a(?i)b",
            "regex: flags must come at the very start, as in Python: write (?i:...) for part of "
            "the pattern, not (?i)",
        )
        self.assertRefused(
            "(?i)a|(?s)b",
            "regex: flags must come at the very start, as in Python: write (?s:...) for part of "
            "the pattern, not (?s)",
        )
        self.assertRefused(
            "(?-i)a",
            "regex: flags are turned off only for a group, as in Python: write (?-i:...), "
            "not (?-i)",
        )
        self.assertRefused("(?)a", "regex: empty flags group: (?)")
        self.assertMatches("(?i)(?s)^a.b$", ["A\nB"], ["a\nc"])
        self.assertMatches("^a(?i:b)(?-i:c)$", ["aBc"], ["Abc", "abC"])

    def test_numericEscapes(self) -> None:
        """
        ``\\12``, a backreference to Python and a character to RE2, is refused
        as a backreference; an octal escape past ``\\377`` (refused by
        Python, a character past one byte to RE2) is refused; octal escapes
        both read alike still work.
        """
        self.assertRefused(
            r"(a)\12",
            "regex: backreferences are not supported (patterns run on RE2, which matches in "
            r"linear time): \12 (a backreference in Python; the character is \x0a)",
        )
        self.assertRefused(r"\400", r"regex: octal escape \400 is more than \377")
        self.assertRefused(r"[\777]", r"regex: octal escape \777 is more than \377")
        self.assertMatches(r"^\123\0\012[\12]$", ["S\x00\n\n"], ["S"])

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
