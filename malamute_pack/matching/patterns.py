"""
The pattern kinds and how a client picks one: a scheme prefix.

``prefix:``, ``topic:``, ``mqtt:``, ``nats:``, ``fields:`` and ``regex:`` pick
a kind; a pattern with no known scheme is a regular expression, which is what
every v1 client sends. The table here is the only place that knows the
schemes, and it pairs each kind with the index that serves it.

Tests: ``tests/unit/test_matching_patterns.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from malamute_pack.matching.base import KindIndex, Pattern
from malamute_pack.matching.fields import FieldIndex, parse_fields
from malamute_pack.matching.prefix import PrefixIndex, parse_prefix
from malamute_pack.matching.regex import RegexIndex, RegexPattern
from malamute_pack.matching.tries import WordTrie
from malamute_pack.matching.words import parse_mqtt, parse_nats, parse_topic

#: scheme -> (parser of ``(text, body)``, maker of the kind's index)
KINDS: dict[str, tuple[Callable[[str, str], Pattern], Callable[[], KindIndex]]] = {
    "regex": (RegexPattern, RegexIndex),
    "prefix": (parse_prefix, PrefixIndex),
    "topic": (parse_topic, lambda: WordTrie(".")),
    "mqtt": (parse_mqtt, lambda: WordTrie("/")),
    "nats": (parse_nats, lambda: WordTrie(".")),
    "fields": (parse_fields, FieldIndex),
}


def parse_pattern(text: str) -> Pattern:
    """Compile ``text``; raises ``PatternError`` with the reason if it does not."""
    scheme, colon, body = text.partition(":")
    kind = KINDS.get(scheme) if colon else None
    if kind is None:
        return RegexPattern(text, text)
    parse, _ = kind
    return parse(text, body)


def validate_pattern(text: str) -> None:
    """Raise ``PatternError`` if ``text`` does not compile; change nothing."""
    parse_pattern(text)


def new_kind_indexes() -> dict[str, KindIndex]:
    """A fresh, empty index for every kind, by kind name."""
    return {name: make() for name, (_, make) in KINDS.items()}
