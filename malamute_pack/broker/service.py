"""
One service: its queue of requests and the workers offering it, indexed by
pattern, with fair choice among the workers that can take a request.

Tests: ``tests/unit/test_broker_model.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from malamute_pack.broker.letters import LetterQueue
from malamute_pack.matching import SubscriptionIndex

if TYPE_CHECKING:
    from malamute_pack.broker.connection import Connection


class Service:
    """A named service with a bounded request queue."""

    def __init__(self, name: str, max_messages: int, max_bytes: int, cache_size: int) -> None:
        self.name = name
        self.queue = LetterQueue(f"service {name!r}", max_messages, max_bytes)
        self.offers: SubscriptionIndex[Connection] = SubscriptionIndex(cache_size)

    def pick_worker(self, subject: str, local_only: bool = False) -> Connection | None:
        """
        The worker to get a request with C{subject}: of those whose offer
        matches and that have credit, a local one before a peer broker's
        (a remote connection), and among those the one served least
        recently (first come, first served, then in turn).

        @param local_only: never a peer broker's (for a request a peer
            already forwarded here: one hop).
        """
        best: Connection | None = None
        for worker in self.offers.match(subject):
            if not worker.can_take() or (local_only and worker.remote):
                continue
            if (
                best is None
                or (best.remote and not worker.remote)
                or (best.remote == worker.remote and worker.last_dispatch < best.last_dispatch)
            ):
                best = worker
        return best

    def __repr__(self) -> str:
        return f"<Service {self.name!r} queued={len(self.queue)}>"
