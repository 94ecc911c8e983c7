"""
What the broker model needs from durable storage: the L{Store} interface,
the records it reads back (L{StreamRecord}, L{QueuedRecord}, defined in
L{malamute_pack.protocol.records} with the codecs that carry them between
brokers) and the error it reports (L{StoreError}). It sits below both the
model (L{malamute_pack.broker}), which stores through it, and the journal
(L{malamute_pack.journal.Journal}), which implements it: the model never
imports the journal and runs without one (``--no-journal``).

Tests: ``tests/unit/test_broker_durable.py`` (the model on a real journal),
``tests/unit/test_journal_records.py`` (the records).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from twisted.internet.defer import Deferred

from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import ConsumerPosition, QueuedRecord, StreamRecord


class StoreError(Exception):
    """
    A store operation failed; C{reason} is a short text for clients (no
    paths, the cause first). C{unconfirmed}, when set, says the write is
    on this broker's disk after all, and only a pair's partner did not
    acknowledge it: its position in the order of writes, which
    L{Store.confirm} waits for (a retry must not write it again).
    """

    reason: str = "write failed"
    unconfirmed: int | None = None


# Called once a queued record is durable (None) or could not be made so.
DurableCallback = Callable[[StoreError | None], None]


class Store(Protocol):
    """
    Stream records with sequence numbers, and durable queued letters. Every
    call returns at once: writes are committed later (group commit) and
    reported through C{on_durable}; reads of committed data fire a Deferred.
    """

    def append_stream(
        self,
        stream: str,
        sender: str,
        subject: str,
        content: Sequence[bytes],
        timestamp: float,
        origin: str = "",
        origin_seq: int = 0,
    ) -> int:
        """
        Journal a stream message; its sequence number here, assigned now. A
        message forwarded by a peer broker gives C{origin} (that broker's
        id) and C{origin_seq} (its sequence number there), read back with it.
        """

    def first_seq(self, stream: str) -> int:
        """The first sequence number still retained (last + 1 for none)."""

    def last_seq(self, stream: str) -> int:
        """The last sequence number assigned (0 for none)."""

    def read_stream(self, stream: str, from_seq: int, limit: int) -> Deferred[list[StreamRecord]]:
        """Up to C{limit} records from C{from_seq} on, committed or not."""

    def seq_at_time(self, stream: str, t: float) -> Deferred[int]:
        """The first sequence number with a timestamp at or after C{t}."""

    def compacted(self, stream: str) -> bool:
        """Whether C{stream} is a last-value stream (keeps each subject's latest record)."""

    def read_last_values(self, stream: str) -> Deferred[list[StreamRecord]]:
        """
        A last-value stream's latest record of each subject as of its last
        sequence number now (C{last_seq}), in sequence order.
        """

    def durable_seq(self, stream: str) -> int:
        """The last sequence number whose record is committed (0 for none)."""

    def watch_durable(self, callback: Callable[[Mapping[str, int]], None]) -> None:
        """
        Call C{callback(stream_last)} as writes commit: per stream, the last
        number of the commit (all through it durable now; its records still
        readable from memory during the call).
        """

    def watch_failures(self, callback: Callable[[Mapping[str, int]], None]) -> None:
        """Call C{callback(stream_last)} as writes fail: per stream, the batch's last number."""

    def confirm(self, position: int, on_durable: DurableCallback) -> None:
        """
        C{on_durable(None)} once the write at C{position} (a L{StoreError}'s
        C{unconfirmed}) is acknowledged as any write is (a pair's partner
        has it, or the broker goes on alone), or with the error if it is
        refused again.
        """

    def lost(self, stream: str, first: int, last: int) -> list[tuple[int, int]]:
        """
        The stretches (first, last) of C{stream} within C{first}..C{last},
        clipped to it and in order, whose records the store cannot serve:
        found damaged, or lost with a damaged file. Each read that covers
        one tells its reader of a gap there; no record in one is served.
        """

    def read_rows(
        self, stream: str, from_seq: int, to_seq: int, limit: int, max_bytes: int
    ) -> Deferred[list[ChunkRow]]:
        """
        Committed records from C{from_seq} to C{to_seq}, in order: up to
        C{limit} of them and about C{max_bytes} of content (at least one).
        """

    def append_batch(
        self,
        stream: str,
        sender: str,
        records: Sequence[tuple[str, Sequence[bytes]]],
        timestamp: float,
        key: str,
        forget: Sequence[tuple[str, str]],
        on_durable: DurableCallback,
    ) -> int:
        """
        Journal C{records} (subject, frames) and remember C{key} for them,
        all or nothing, forgetting the (stream, key) pairs in C{forget}; the
        first record's sequence number (the others follow). C{on_durable}
        once committed (or failed).
        """

    def store_queued(
        self,
        kind: str,
        address: str,
        sender: str,
        subject: str,
        tracker: str,
        deadline: float | None,
        content: Sequence[bytes],
        on_durable: DurableCallback,
        relay_origin: str = "",
        relay_id: int = 0,
        record_id: int | None = None,
    ) -> QueuedRecord:
        """
        Journal a mailbox or service letter; C{on_durable} once committed (or
        failed). C{relay_origin} and C{relay_id}: the pack peer that handed
        it over, and its id there. C{record_id}: the id L{queued_id} gave
        it (None: the next one).
        """

    def queued_id(self) -> int:
        """A new letter's id, unique in this journal (and its pair's)."""

    def remove_queued(self, record_id: int) -> None:
        """Forget a letter that is done with."""

    def save_consumer(
        self, position: ConsumerPosition, on_durable: DurableCallback | None = None
    ) -> None:
        """Keep a consumer's position; C{on_durable} once committed (or failed)."""

    def forget_consumer(self, position: ConsumerPosition) -> None:
        """Delete the position of C{position}'s consumer."""
