"""
What the broker model needs from the world, as interfaces: a L{FrameSink}
for outgoing messages (the ROUTER socket, in service) and a L{Store} for
the journal (L{malamute_pack.journal.Journal}: SQLite and a writer thread,
off the reactor thread). The model itself never touches a socket or a file.

Tests: ``tests/test_broker_model.py``, ``tests/test_broker_durable.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from twisted.internet.defer import Deferred

from malamute_pack.journal import JournalError, StreamRecord


class FrameSink(Protocol):
    """Where the broker's outgoing messages go."""

    def send(self, route: bytes, frames: Sequence[bytes]) -> bool:
        """Send C{frames} to the peer with routing id C{route}."""


class Store(Protocol):
    """Stream records with sequence numbers, and durable queued letters."""

    def append_stream(
        self, stream: str, sender: str, subject: str, content: Sequence[bytes], timestamp: float
    ) -> int:
        """Journal a stream message; its sequence number, assigned now."""

    def first_seq(self, stream: str) -> int:
        """The first sequence number still retained."""

    def last_seq(self, stream: str) -> int:
        """The last sequence number assigned (0 for none)."""

    def read_stream(self, stream: str, from_seq: int, limit: int) -> Deferred[list[StreamRecord]]:
        """Up to C{limit} records from C{from_seq} on, committed or not."""

    def seq_at_time(self, stream: str, t: float) -> Deferred[int]:
        """The first sequence number with a timestamp at or after C{t}."""

    def store_queued(
        self,
        kind: str,
        address: str,
        sender: str,
        subject: str,
        tracker: str,
        deadline: float | None,
        content: Sequence[bytes],
        on_durable: Callable[[JournalError | None], None],
    ) -> _HasId:
        """Journal a mailbox or service letter; C{on_durable} once committed (or failed)."""

    def remove_queued(self, record_id: int) -> None:
        """Forget a letter that is done with."""


class _HasId(Protocol):
    @property
    def id(self) -> int: ...
