"""
One stream: its name, its readers indexed by pattern, and its counters.

Tests: ``tests/unit/test_broker_model.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from malamute_pack.matching import SubscriptionIndex

if TYPE_CHECKING:
    from malamute_pack.broker.connection import Connection


class Stream:
    """
    A named stream. Readers subscribe with patterns; a message goes to each
    reader with a matching pattern at most once.
    """

    def __init__(self, name: str, cache_size: int) -> None:
        self.name = name
        self.readers: SubscriptionIndex[Connection] = SubscriptionIndex(cache_size)
        self.messages = 0
        self.delivered = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<Stream {self.name!r} readers={self.readers.owner_count()}>"
