"""
Word patterns: the three topic dialects, parsed into one token language.

- ``topic:`` (AMQP): ``.`` separated words, ``*`` one word, ``#`` zero or more;
- ``mqtt:``: ``/`` separated levels, ``+`` one level, a final ``#`` the rest,
  parent level included (``a/#`` matches ``a``);
- ``nats:``: ``.`` separated tokens, ``*`` one token, a final ``>`` one or more.

Each dialect becomes a tuple of tokens: a literal word, ``Wild.ONE`` (exactly
one word) or ``Wild.ANY`` (zero or more words). MQTT's ``a/#`` is ``a ANY``
and NATS's ``a.>`` is ``a ONE ANY``, so one trie (``tries.py``) indexes all
three. A subject is split at every separator; an empty piece is still a word,
which a wildcard matches and a literal never does, except MQTT's empty levels.

Tests: ``tests/unit/test_matching_patterns.py``, ``tests/unit/test_matching_properties.py``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

from malamute_pack.matching.base import Pattern, PatternError


class Wild(enum.Enum):
    """The two wildcards every dialect reduces to."""

    ONE = "one"  # exactly one word
    ANY = "any"  # zero or more words


Token = str | Wild


class WordPattern(Pattern):
    """
    A sequence of tokens matched against the words of a subject.

    ``tokens_match`` is the definition. A pattern with at most one ANY is also
    translated to an equivalent regular expression, ten times faster, which is
    what runs; with more ANYs a backtracking regex could take time polynomial
    in the subject to the power of their number, so the definition runs.
    """

    __slots__ = ("_fullmatch", "separator", "tokens")

    def __init__(self, kind: str, text: str, separator: str, tokens: tuple[Token, ...]) -> None:
        super().__init__(kind, text)
        self.separator = separator
        self.tokens = tokens
        # Safe on Python's re (2x faster than RE2 here): generated, words escaped, one
        # unbounded repeat at most, so backtracking is at worst quadratic in the subject.
        self._fullmatch = (
            re.compile(_as_regex(tokens, separator)).fullmatch
            if tokens.count(Wild.ANY) <= 1
            else None
        )

    def matches(self, subject: str) -> bool:
        if self._fullmatch is not None:
            return self._fullmatch(subject + self.separator) is not None
        return tokens_match(self.tokens, subject.split(self.separator))


def _as_regex(tokens: Sequence[Token], separator: str) -> str:
    """
    A regex for ``subject + separator``: that string is exactly its words,
    each followed by one separator, so every token becomes "words, each with
    its separator".
    """
    end = re.escape(separator)
    word = f"[^{end}]*{end}"
    pieces = {Wild.ONE: word, Wild.ANY: f"(?:{word})*"}
    return "".join(
        pieces[token] if isinstance(token, Wild) else re.escape(token) + end for token in tokens
    )


def tokens_match(tokens: Sequence[Token], words: Sequence[str]) -> bool:
    """
    Whether ``words`` spell ``tokens``, by stepping the set of token positions
    still alive one word at a time: linear in words x tokens, however many
    ``ANY`` the pattern holds (a backtracking matcher is exponential in them).
    """
    end = len(tokens)
    alive = _closure(tokens, {0})
    for word in words:
        following: set[int] = set()
        for position in alive:
            if position == end:
                continue
            token = tokens[position]
            if token is Wild.ANY:
                following.add(position)  # ANY swallows this word and stays
            elif token is Wild.ONE or token == word:
                following.add(position + 1)
        if not following:
            return False
        alive = _closure(tokens, following)
    return end in alive


def _closure(tokens: Sequence[Token], positions: set[int]) -> set[int]:
    """Add, for each position, the ones reached by letting ANY match zero words."""
    reached = set(positions)
    end = len(tokens)
    for position in positions:
        while position < end and tokens[position] is Wild.ANY:
            position += 1
            reached.add(position)
    return reached


def parse_topic(text: str, body: str) -> WordPattern:
    """AMQP topic: ``*`` is one word, ``#`` zero or more, anywhere."""
    tokens: list[Token] = []
    for word in body.split("."):
        if word == "*":
            tokens.append(Wild.ONE)
        elif word == "#":
            tokens.append(Wild.ANY)
        elif not word:
            raise PatternError("topic: empty word")
        elif "*" in word or "#" in word:
            raise PatternError(f"topic: '*' and '#' must be whole words, not {word!r}")
        else:
            tokens.append(word)
    return WordPattern("topic", text, ".", tuple(tokens))


def parse_mqtt(text: str, body: str) -> WordPattern:
    """MQTT filter: ``+`` is one level, a final ``#`` is the parent and everything below."""
    if not body:
        raise PatternError("mqtt: empty filter")
    levels = body.split("/")
    tokens: list[Token] = []
    for position, level in enumerate(levels):
        if level == "+":
            tokens.append(Wild.ONE)
        elif level == "#":
            if position != len(levels) - 1:
                raise PatternError("mqtt: '#' must be the last level")
            tokens.append(Wild.ANY)
        elif "+" in level or "#" in level:
            raise PatternError(f"mqtt: '+' and '#' must be whole levels, not {level!r}")
        else:
            tokens.append(level)  # MQTT allows empty levels: "a//b"
    return WordPattern("mqtt", text, "/", tuple(tokens))


def parse_nats(text: str, body: str) -> WordPattern:
    """NATS subject: ``*`` is one token, a final ``>`` one or more."""
    if not body:
        raise PatternError("nats: empty subject")
    parts = body.split(".")
    tokens: list[Token] = []
    for position, part in enumerate(parts):
        if part == "*":
            tokens.append(Wild.ONE)
        elif part == ">":
            if position != len(parts) - 1:
                raise PatternError("nats: '>' must be the last token")
            tokens.extend((Wild.ONE, Wild.ANY))
        elif not part:
            raise PatternError("nats: empty token")
        elif "*" in part or ">" in part:
            raise PatternError(f"nats: '*' and '>' must be whole tokens, not {part!r}")
        else:
            tokens.append(part)
    return WordPattern("nats", text, ".", tuple(tokens))
