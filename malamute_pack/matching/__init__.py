"""
The matching engine: which subscribers want a message with this subject, in
O(1) per message (inverted bitmaps with pyroaring, cached per subject).

Pattern kinds are picked with a scheme prefix (``prefix:``, ``topic:``,
``mqtt:``, ``nats:``, ``fields:``, ``regex:``); anything else is a regular
expression, as v1 clients send. ``docs/protocol.md`` documents the syntax.

Its modules:

- C{index}: L{SubscriptionIndex}: who wants a subject, cached per subject.
- C{patterns}: the pattern kinds by scheme (C{KINDS}) and parsing.
- C{base}: L{Pattern}, L{PatternError} and what a per-kind index must do.
- C{prefix}: C{prefix:} patterns.
- C{words}: the C{topic:}, C{mqtt:} and C{nats:} dialects, parsed into tokens.
- C{tries}: the word trie that indexes those three kinds.
- C{fields}: C{fields:} patterns: multi-field matching.
- C{regex}: regular expressions on RE2, the default kind.
- C{bench}: the engine's benchmark (C{python -m malamute_pack.matching.bench}).

Tests: ``tests/unit/test_matching_index.py``, ``tests/unit/test_matching_patterns.py``,
``tests/unit/test_matching_properties.py``, ``tests/unit/test_matching_bench.py``.
"""

from malamute_pack.matching.base import Pattern, PatternError
from malamute_pack.matching.index import CacheStats, SubscriptionIndex
from malamute_pack.matching.patterns import parse_pattern, validate_pattern

__all__ = [
    "CacheStats",
    "Pattern",
    "PatternError",
    "SubscriptionIndex",
    "parse_pattern",
    "validate_pattern",
]
