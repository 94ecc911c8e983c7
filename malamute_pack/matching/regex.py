"""
Regular-expression patterns: what v1 clients send, and the default kind.

Patterns come from untrusted clients, so they run on RE2 (``google-re2``),
whose matching time is linear in the subject whatever the pattern: ``(a+)+$``
against ``"a" * 30 + "b"`` takes microseconds, where Python's backtracking
``re`` spins for minutes with the reactor blocked. The price is RE2's syntax:
backreferences, lookaround, atomic groups and possessive quantifiers are
refused, saying so; ``docs/protocol.md`` ("Regular expressions") lists what
differs from Python's ``re``. Beyond the meanings listed there (ASCII
``\\d``, ``$``...), a pattern means what it means to Python or is refused:
Python spellings RE2 reads differently but can say exactly are rewritten
first (``\\Z``, ``{,n}``, ``{02}``), and text RE2 would compile only by
reading it otherwise (``a{99999999999999}``, which RE2 takes as text;
``a(?i)b``; a group name used twice; ``\\12``, octal to RE2) is refused,
saying why (``_as_re2``).

One pattern cannot eat memory: it compiles within ``PATTERN_MAX_MEM`` and its
program may hold at most ``MAX_PROGRAM_SIZE`` RE2 instructions (the wire
already limits its text to 255 bytes, but ``.{1000}`` is 6 bytes and 8000
instructions).

A regular expression can want any subject, so no index can skip one without
running it; but RE2 runs many in one pass. ``RegexIndex`` compiles its
patterns into one ``re2.Set`` (a DFA over all of them): one ``Match`` per new
subject names every pattern that matches, in under two microseconds with
15,000 patterns where asking each in turn (Python's ``re``) took two
milliseconds (``python -m malamute_pack.matching.bench --workload uncached``).
Each pattern also keeps its own one-pattern matcher, about 4 KiB, for the
index's one-at-a-time questions (``matches``).

Tests: ``tests/unit/test_matching_patterns.py``, ``tests/unit/test_matching_index.py``,
``tests/unit/test_matching_properties.py``, ``tests/system/test_system_redos.py``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import re2
from pyroaring import BitMap
from re2 import _re2

from malamute_pack.matching.base import KindIndex, Pattern, PatternError, expect

#: Memory RE2 may use to compile one pattern (and for its matcher's cache).
PATTERN_MAX_MEM = 1 << 20
#: The most RE2 instructions one pattern's program may hold; typical patterns
#: need tens, ``\pL`` alone 1200. It bounds what a pattern adds to the Set.
MAX_PROGRAM_SIZE = 5000
#: Memory a ``RegexIndex``'s Set may use: its program plus its DFA cache, which
#: grows only as subjects need states. 15,000 patterns of 20 instructions fit
#: in a fraction; past it the index falls back to asking patterns in turn.
SET_MAX_MEM = 128 << 20
#: A Set build costs about this many single-pattern matches per pattern
#: (measured: 11 us against 1.4 us), which sets when a rebuild pays (below).
BUILD_COST = 8
#: Patterns added since a build are asked one by one, up to at least this
#: many before a rebuild is forced.
MIN_RECENT = 32


# google-re2's own binding (``re2._re2``) is called directly: the Python
# wrappers in ``re2`` add a frame per call and work out match offsets, where
# the index passes UTF-8 bytes and only asks which patterns match.
_UNANCHORED = _re2.RE2.Anchor.UNANCHORED


def _options(max_mem: int) -> Any:
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # a client's bad pattern is its error, not our log's
    options.never_capture = True  # only "does it match" is asked: no groups to keep
    options.longest_match = False  # leftmost-first, as Python's re
    return options


_PATTERN_OPTIONS = _options(PATTERN_MAX_MEM)

#: What RE2 says about a Python-only construct (its error names the fragment),
#: and the feature to name in the refusal.
_UNSUPPORTED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(fragment), feature)
    for fragment, feature in (
        (r"invalid escape sequence: \\[1-9]", "backreferences"),
        (r"invalid perl operator: \(\?P$", "backreferences"),  # (?P=name)
        (r"invalid perl operator: \(\?<?[=!]", "lookahead and lookbehind assertions"),
        (r"invalid perl operator: \(\?>", "atomic groups"),
        (r"invalid perl operator: \(\?\(", "conditional groups"),
        (r"invalid perl operator: \(\?#", "comments"),
        (r"bad repetition operator: .+\+$", "possessive quantifiers"),
        (r"invalid perl operator: \(\?[-imsU]*[aLux]", "the a, L, u and x flags"),
    )
)

#: RE2's largest repetition count (Python's ``re`` takes up to 2**32 - 2).
MAX_REPEAT = 1000

# Patterns with none of these compile as they are (nearly all do): a brace, an
# extension group, an escaped digit or anchor, a quantified ^ or $.
_CHECKED = re.compile(r"\{|\(\?|\\[1-9AbBZ]|[$^][*+?]")
# What Python reads as a repetition: ASCII digits, any number, leading zeros too.
_REPEAT = re.compile(r"\{([0-9]*)(?:(,)([0-9]*))?\}")
# A flags group of the flags RE2 knows (RE2 refuses a, L, u and x itself).
_FLAGS = re.compile(r"\(\?([imsU]*)(-[imsU]+)?\)")
# A named group, in Python's spelling or RE2's (not a lookbehind).
_NAMED = re.compile(r"\(\?(P?)<(?![=!])([^>]*)>")
# An escape whose braces are its own: \x{e9}, \p{Greek} (RE2's), \N{...}.
_BRACED_ESCAPE = re.compile(r"\\[xpPN]\{[^}]*\}?")
# The digits of an octal escape, as both engines read at most three.
_OCTAL = re.compile(r"[0-7]{1,3}")
_ANCHORS = frozenset(("^", "$", "\\A", "\\b", "\\B", "\\Z"))


def _as_re2(expression: str) -> str:
    r"""
    ``expression`` as RE2 must read it to mean what it means to Python's
    ``re``; a ``PatternError`` where RE2 would compile it only by reading it
    otherwise.

    Rewritten, since RE2 can say them exactly: ``\Z`` (end of subject; RE2
    refuses it and spells it ``\z``) and every repetition Python reads in
    braces, in RE2's spelling: ``{,n}``, ``{,}`` and counts with leading
    zeros (``{02}``), which RE2 reads as literal text, become ``{0,n}``,
    ``{0,}`` and ``{2}``; a brace Python reads as text is escaped.

    Refused: a repetition count above ``MAX_REPEAT`` (RE2 refuses one of up
    to nine digits and reads a longer one as text, where Python repeats or
    refuses), a minimum above the maximum, a quantified anchor (``^*``,
    ``\b+``), a group name that is not an identifier or is used twice, RE2's
    ``(?<name>...)``, flags groups other than ``(?flags)`` at the very start
    (``a(?i)b``, ``(?-i)``, ``(?)``), ``\12`` (a backreference to Python, a
    character to RE2) and octal escapes above ``\377``.

    Escapes and character classes are stepped over, so ``\\Z`` and
    ``[{,2}]`` are left alone.
    """
    if not _CHECKED.search(expression):
        return expression  # nearly every pattern
    out: list[str] = []
    names: set[str] = set()
    position, end = 0, len(expression)
    in_class = False
    at_start = True  # nothing but flags groups so far
    anchor = ""  # the anchor just passed, which takes no quantifier
    while position < end:
        char = expression[position]
        if anchor:
            _check_unquantified(expression, position, anchor)
            anchor = ""
        if char == "\\" and position + 1 < end:
            escaped = expression[position + 1]
            if braced := _BRACED_ESCAPE.match(expression, position):
                token = braced.group()
            elif escaped == "Q" and not in_class:
                # RE2's \Q...\E: text, braces and all.
                close = expression.find("\\E", position + 2)
                token = expression[position : end if close < 0 else close + 2]
            else:
                token = char + escaped
                if escaped in "0123456789":
                    _check_octal(expression, position + 1, in_class)
                if not in_class and token in _ANCHORS:
                    anchor = token
            out.append("\\z" if token == "\\Z" and not in_class else token)
            position += len(token)
            at_start = False
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            # "]" right after "[" or "[^" is a literal member, not the end.
            start = position
            position += 1
            if expression.startswith("^", position):
                position += 1
            if expression.startswith("]", position):
                position += 1
            out.append(expression[start:position])
            in_class = True
            at_start = False
            continue
        elif char == "{":
            token, position = _repetition(expression, position)
            out.append(token)
            at_start = False
            continue
        elif expression.startswith("(?", position):
            if expression.startswith("(?#", position):
                out.append(expression[position:])  # a comment, which RE2 refuses
                break
            if flags := _FLAGS.match(expression, position):
                _check_flags(flags.group(), flags.group(1), flags.group(2), at_start)
                out.append(flags.group())
                position = flags.end()
                continue
            if named := _NAMED.match(expression, position):
                _check_name(named.group(), named.group(1) == "P", named.group(2), names)
                out.append(named.group())
                position = named.end()
                at_start = False
                continue
        elif char in "^$":
            anchor = char
        out.append(char)
        position += 1
        at_start = False
    return "".join(out)


def _repetition(expression: str, position: int) -> tuple[str, int]:
    """
    What RE2 must read for the ``{`` at ``position`` (outside a class), and
    where the text after it starts: the repetition Python reads there, in
    RE2's spelling, or an escaped brace where Python reads text.
    """
    repeat = _REPEAT.match(expression, position)
    low_digits, comma, high_digits = repeat.groups() if repeat else ("", None, "")
    if repeat is None or not (low_digits or comma):
        return "\\{", position + 1  # "{", "{}", "{a}", "{1,2,3}": text to both
    text = repeat.group()
    low = _count(low_digits, text)
    high = _count(high_digits, text) if high_digits else None
    if not comma:
        return f"{{{low}}}", repeat.end()
    if high is not None and low > high:
        raise PatternError(
            f"regex: repetition minimum {low} is more than its maximum {high}: {text}"
        )
    return f"{{{low},{'' if high is None else high}}}", repeat.end()


def _count(digits: str, text: str) -> int:
    """A repetition count's value; refused past ``MAX_REPEAT``."""
    number = digits.lstrip("0") or "0"
    if len(number) > len(str(MAX_REPEAT)) or int(number) > MAX_REPEAT:
        raise PatternError(f"regex: repetition count {number} is more than {MAX_REPEAT}: {text}")
    return int(number)


def _check_unquantified(expression: str, position: int, anchor: str) -> None:
    """Refuse a quantifier at ``position``, just after ``anchor`` (Python does)."""
    char = expression[position]
    repeat = _REPEAT.match(expression, position) if char == "{" else None
    if repeat and (repeat.group(1) or repeat.group(2)):
        quantifier = repeat.group()
    elif char in "*+?":
        quantifier = char
    else:
        return
    raise PatternError(
        f"regex: nothing to repeat: {anchor}{quantifier} (an anchor takes no quantifier)"
    )


def _check_octal(expression: str, digit: int, in_class: bool) -> None:
    """
    Refuse the escape whose first digit is at ``digit`` where RE2 reads an
    octal character and Python does not: ``\\400`` to ``\\777`` (past one
    byte: Python refuses) and, outside a class, ``\\12`` (a backreference).
    """
    octal = _OCTAL.match(expression, digit)
    if octal is None:
        return  # \8 or \9: RE2 refuses them (backreferences)
    digits = octal.group()
    if len(digits) == 3 and int(digits, 8) > 0o377:
        raise PatternError(f"regex: octal escape \\{digits} is more than \\377")
    if len(digits) == 2 and digits[0] != "0" and not in_class:
        raise _unsupported(
            "backreferences",
            f"\\{digits} (a backreference in Python; the character is \\x{int(digits, 8):02x})",
        )


def _check_flags(group: str, on: str, off: str | None, at_start: bool) -> None:
    """Refuse a flags group Python refuses and RE2 reads as flags from there on."""
    if off:
        raise PatternError(
            f"regex: flags are turned off only for a group, as in Python: write (?{on}{off}:...), "
            f"not {group}"
        )
    if not on:
        raise PatternError(f"regex: empty flags group: {group}")
    if not at_start:
        raise PatternError(
            f"regex: flags must come at the very start, as in Python: write (?{on}:...) for "
            f"part of the pattern, not {group}"
        )


def _check_name(group: str, python_spelling: bool, name: str, names: set[str]) -> None:
    """Refuse a named group Python would not read: a bad name, one used twice."""
    if not python_spelling:
        raise PatternError(
            f"regex: a named group is written (?P<name>...), as in Python, not {group}"
        )
    if not name.isidentifier():
        raise PatternError(
            f"regex: bad group name {name!r}: a name is a letter or _ then letters, digits or _"
        )
    if name in names:
        raise PatternError(f"regex: group name {name!r} used twice")
    names.add(name)


def _unsupported(feature: str, detail: str) -> PatternError:
    return PatternError(
        f"regex: {feature} are not supported (patterns run on RE2, which matches in "
        f"linear time): {detail}"
    )


def _refusal(message: bytes) -> PatternError:
    """The PatternError for RE2's compile error ``message``."""
    reason = message.decode("utf-8", "replace")
    if reason.startswith("pattern too large"):
        return _too_large(f"more than {MAX_PROGRAM_SIZE}")
    if reason.startswith("invalid repetition size: "):
        # Each count is at most MAX_REPEAT (_as_re2): their product is not.
        return PatternError(
            f"regex: nested repetition counts multiply to more than {MAX_REPEAT}: "
            f"{reason.partition(': ')[2]}"
        )
    for fragment, feature in _UNSUPPORTED:
        if fragment.search(reason):
            return _unsupported(feature, reason)
    return PatternError(f"regex: {reason}")


def _too_large(size: str) -> PatternError:
    return PatternError(
        f"regex: pattern too large: {size} RE2 instructions, at most {MAX_PROGRAM_SIZE}"
    )


def _encode(text: str) -> bytes:
    # surrogateescape: the bytes a client sent, even when not valid UTF-8.
    return text.encode("utf-8", "surrogateescape")


class RegexPattern(Pattern):
    """
    A regular expression with search semantics (it matches if it matches
    anywhere in the subject), run by RE2.
    """

    __slots__ = ("program", "program_size", "search_utf8")

    def __init__(self, text: str, expression: str) -> None:
        super().__init__("regex", text)
        #: The expression as RE2 compiles it: UTF-8, Python spellings rewritten.
        self.program = _encode(_as_re2(expression))
        # RE2 proper, for its error message and program size; matching runs
        # on a Set of one, the same forward DFA the index's Set is (a plain
        # RE2 search also finds where the match starts, which costs more).
        compiled = _re2.RE2(self.program, _PATTERN_OPTIONS)
        if not compiled.ok():
            raise _refusal(compiled.error())
        #: Instructions in its RE2 program (what it adds to an index's Set).
        self.program_size: int = compiled.ProgramSize()
        if self.program_size > MAX_PROGRAM_SIZE:
            raise _too_large(str(self.program_size))
        alone = _re2.Set(_UNANCHORED, _PATTERN_OPTIONS)
        if alone.Add(self.program) < 0 or not alone.Compile():
            # Its DFA would not fit (unseen: 5000 instructions leave room).
            raise PatternError(f"regex: pattern too large: needs more than {PATTERN_MAX_MEM} bytes")
        #: Given a subject as UTF-8 bytes, ``[0]`` if it matches, else ``[]``.
        self.search_utf8: Callable[[bytes], list[int]] = alone.Match

    def matches(self, subject: str) -> bool:
        return bool(self.search_utf8(_encode(subject)))


@dataclass
class RegexStats:
    """What a ``RegexIndex`` has done since it was made."""

    #: Sets compiled.
    builds: int = 0
    #: Sets that failed to compile (past ``SET_MAX_MEM``): the index then
    #: asks each pattern in turn (RE2 still, so linear) until it shrinks.
    fallbacks: int = 0


class RegexIndex(KindIndex):
    """
    Every regular expression in one ``re2.Set``, plus the few added since it
    was built, asked one by one.

    A build costs about 10 us a pattern (120 to 180 ms for 15,000), so it is
    not redone on every change: a removed pattern is masked (its Set index
    maps to no bit), a new one joins ``_recent``, and a lookup rebuilds only
    when ``_recent`` outgrows ``max(MIN_RECENT, sqrt(BUILD_COST * n))``
    (balancing what each lookup pays for it against what rebuilds cost),
    when the checks spent on it since the build would have paid for one
    (ski rental), or when masked patterns outnumber live ones. A burst of
    subscriptions is thus one build at the next lookup, however long the
    burst, and a client adding patterns one at a time between messages
    cannot make every message pay for a build.
    """

    def __init__(self, *, recent_limit: int | None = None, set_max_mem: int = SET_MAX_MEM) -> None:
        """
        @param recent_limit: a fixed limit on the patterns asked one by one
            (tests); by default the one above, which grows with the index.
        @param set_max_mem: the Set's memory bound.
        """
        self.stats = RegexStats()
        self._recent_limit = recent_limit
        self._set_options = _options(set_max_mem)
        self._patterns: dict[int, RegexPattern] = {}  # every pattern, by bit
        self._program_size = 0  # their total instructions
        self._set: Any = None  # the compiled re2.Set, if any
        self._bit_at: list[int] = []  # Set index -> bit, -1 once removed
        self._index_of: dict[int, int] = {}  # bit -> Set index, for the live ones
        self._masked = 0  # removed patterns still in the Set
        self._recent: dict[int, Callable[[bytes], list[int]]] = {}  # not in the Set: bit -> search
        self._debt = 0  # single-pattern checks spent on _recent since the build
        self._failed_size: int | None = None  # program size the last failed build had

    def add(self, bit: int, pattern: Pattern) -> None:
        regex = expect(pattern, RegexPattern)
        self._patterns[bit] = regex
        self._program_size += regex.program_size
        self._recent[bit] = regex.search_utf8

    def remove(self, bit: int, pattern: Pattern) -> None:
        self._program_size -= self._patterns.pop(bit).program_size
        if not self._patterns:
            self._forget_set()
            self._recent.clear()
            self._failed_size = None
        elif self._recent.pop(bit, None) is None:
            self._bit_at[self._index_of.pop(bit)] = -1
            self._masked += 1

    def lookup(self, subject: str) -> BitMap:
        if self._should_build():
            self._build()
        data = _encode(subject)
        # One pass over the subject for every pattern in the Set.
        hits = self._set.Match(data) if self._set is not None else None
        if hits:
            bit_at = self._bit_at
            found = BitMap([bit for index in hits if (bit := bit_at[index]) >= 0])
        else:
            found = BitMap()
        if self._recent:
            self._debt += len(self._recent)
            for bit, search in self._recent.items():
                if search(data):
                    found.add(bit)
        return found

    def __len__(self) -> int:
        return len(self._patterns)

    def _should_build(self) -> bool:
        recent = len(self._recent)
        if not recent and self._masked <= len(self._patterns):
            return False
        if self._failed_size is not None and self._program_size >= self._failed_size:
            return False  # no smaller than what did not fit: it would fail again
        live = len(self._patterns)
        limit = self._recent_limit
        if limit is None:
            limit = max(MIN_RECENT, math.isqrt(BUILD_COST * live))
        return recent > limit or self._debt >= BUILD_COST * live or self._masked > live

    def _build(self) -> None:
        """Compile every live pattern into a new Set, or fall back to asking each."""
        self._forget_set()
        built = _re2.Set(_UNANCHORED, self._set_options)
        bits = list(self._patterns)
        # Add numbers the patterns 0, 1, 2... in order (each compiled alone
        # already, so it does not fail); Compile fails past the memory bound.
        if not all(built.Add(self._patterns[bit].program) >= 0 for bit in bits) or not (
            built.Compile()
        ):
            # Past SET_MAX_MEM: every pattern is asked in turn until the
            # patterns shrink below this size.
            self.stats.fallbacks += 1
            self._failed_size = self._program_size
            self._recent = {bit: pattern.search_utf8 for bit, pattern in self._patterns.items()}
            return
        self.stats.builds += 1
        self._failed_size = None
        self._set = built
        self._bit_at = bits
        self._index_of = {bit: index for index, bit in enumerate(bits)}
        self._recent = {}

    def _forget_set(self) -> None:
        self._set = None
        self._bit_at = []
        self._index_of = {}
        self._masked = 0
        self._debt = 0
