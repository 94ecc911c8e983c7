"""
The matching engine: which subscribers want a message with this subject, in
O(1) per message (inverted bitmaps with pyroaring, cached per subject).

Pattern kinds are picked with a scheme prefix (``prefix:``, ``topic:``,
``mqtt:``, ``nats:``, ``fields:``, ``regex:``); anything else is a regular
expression, as v1 clients send. ``docs/protocol.md`` documents the syntax.

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
