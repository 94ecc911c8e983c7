"""
Words for people: a count with its noun in the right number ("1 stream",
"2 streams"), for log lines, errors and the command line's output.

Tests: ``tests/unit/test_text.py``.
"""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """C{count} and C{noun}, or C{nouns} (default C{noun + "s"}) unless it is 1."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
