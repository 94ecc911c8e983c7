"""
The hand-over to the journal's writer thread, and its reports back: what
the reactor thread queues in one turn goes to the
:class:`~malamute_pack.journal.writer.JournalWriter` at once, in order (a
letter stored and removed in the same turn goes nowhere), each operation
taking its positions in the order of writes
(:mod:`malamute_pack.journal.replica`) and its share of the backlog
(:mod:`malamute_pack.journal.backlog`). Each batch the writer reports back
is finished here: its stream records leave the tail, its callbacks run,
and it is counted (:class:`JournalCounters`).

A turn of stream records alone (a flood of them) is handed over with no
pass over its records: each record's size is noted as it is queued, while
it is still in the processor's cache (a pass at the end of a turn of a
thousand records meets each of them cold), and the backlog keeps the sizes
per hand-over.

A record that alone cannot be written fails alone: a letter's
``on_durable`` gets its own JournalError (``record_refused``), a stream
record is dropped; each is counted and logged, and neither is a journal
error (``on_error`` hears only of failures of the journal itself, such as
a full disk, which fail a whole batch).

Tests: ``tests/unit/test_journal_handover.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from malamute_pack.journal.backlog import OP_OVERHEAD, Backlog
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.replica import ReplicaHold
from malamute_pack.journal.sequencing import Sequencer
from malamute_pack.journal.writer import (
    BatchOutcome,
    JournalWriter,
    QueuedStore,
    Resume,
    StreamAppend,
    WriteOp,
)
from malamute_pack.protocol.records import StreamRow

_log = Logger()


@dataclass(slots=True)
class JournalCounters:
    """
    Running totals, updated in the reactor thread as batches report back.
    ``errors`` counts failures of the journal (a batch, a prune);
    ``letters_refused`` and ``stream_records_dropped`` count records that
    alone could not be written while the rest of their batch was;
    ``damaged_records`` the records and letters reads found damaged, each
    once (:mod:`malamute_pack.journal.damage`).
    """

    batches: int = 0
    records_written: int = 0
    bytes_written: int = 0
    pruned: int = 0
    errors: int = 0
    letters_refused: int = 0
    stream_records_dropped: int = 0
    damaged_records: int = 0


class HandOver:
    """
    Operations on their way to the journal's ``writer`` (None while the
    journal is closed) and back. ``call_later`` is the reactor's, for the
    hand-over at the end of the turn; ``seconds`` its clock.
    """

    def __init__(
        self,
        path: Path,
        call_later: Callable[..., Any],
        seconds: Callable[[], float],
        sequence: Sequencer,
        backlog: Backlog,
    ) -> None:
        self._path = path
        self._call_later = call_later
        self._sequence = sequence
        self._backlog = backlog
        self.replica = ReplicaHold(self.finish, seconds, self._write_failed)
        self.counters = JournalCounters()
        self.on_error: Callable[[JournalError], None] | None = None
        # Told the records of each batch that committed.
        self.on_batch: Callable[[int], None] | None = None
        # Told, per stream, the last number of each batch that committed,
        # and of each batch the writer failed (its records are not written;
        # not one written but refused for a pair's partner).
        self.durable_watchers: list[Callable[[Mapping[str, int]], None]] = []
        self.failure_watchers: list[Callable[[Mapping[str, int]], None]] = []
        self.writer: JournalWriter | None = None
        # Operations handed over and not yet reported back, and those queued
        # but not handed over yet.
        self.pending = 0
        # Operations not yet handed to the writer, and the letters among them;
        # while they are stream rows alone, their content sizes.
        self._outbox: list[WriteOp] = []
        self._outbox_stores: dict[int, QueuedStore] = {}
        self._outbox_sizes: list[int] = []
        self._outbox_rows_only = True
        self._scheduled = False

    def start(self, writer: JournalWriter) -> None:
        """Hand over to ``writer`` (just opened): nothing is pending or behind."""
        self.writer = writer
        self.pending = 0
        self._backlog.reset()
        self.replica.reset()

    # Queueing and handing over.

    def submit(self, op: WriteOp) -> None:
        """Queue ``op``; the writer gets a reactor turn's operations at once."""
        self._outbox_rows_only = False
        self._queue(op)

    def submit_row(self, row: StreamRow) -> None:
        """Queue stream ``row`` (L{submit}), noting its size."""
        self._outbox_sizes.append(row[6])
        self._queue(row)

    def _queue(self, op: WriteOp) -> None:
        self.pending += 1
        self._outbox.append(op)
        if not self._scheduled:
            self._scheduled = True
            self._call_later(0, self.hand_over)

    def submit_store(self, store: QueuedStore) -> None:
        """Queue a letter's store, which a remove in the same turn cancels."""
        self._outbox_stores[store.record.id] = store
        self.submit(store)

    def cancel_store(self, record_id: int) -> bool:
        """
        Cancel the store of letter ``record_id`` if it is still queued
        (stored and done with in the same reactor turn: neither need touch
        the disk); whether it was.
        """
        store = self._outbox_stores.pop(record_id, None)
        if store is None:
            return False
        store.cancelled = True
        self.pending -= 1
        return True

    def direct(self, writer: JournalWriter, op: Any) -> None:
        """Hand ``op`` (a barrier, a prune, statements) to ``writer`` after everything queued."""
        self.hand_over()
        writer.submit(op)

    def hand_over(self) -> None:
        """Give the writer everything queued since the last hand-over, in order."""
        self._scheduled = False
        ops, self._outbox = self._outbox, []
        sizes, self._outbox_sizes = self._outbox_sizes, []
        rows_only, self._outbox_rows_only = self._outbox_rows_only, True
        self._outbox_stores.clear()
        writer = self.writer
        if writer is not None and ops and rows_only:
            writer.submit(ops)
            self.replica.handed_over(ops)
            self._backlog.handed(sizes, OP_OVERHEAD * len(ops) + sum(sizes), OP_OVERHEAD)
            return
        self._hand_over_each(ops)

    def _hand_over_each(self, ops: list[WriteOp]) -> None:
        """Hand ``ops`` over one by one: a letter cancelled since goes nowhere."""
        kept: list[WriteOp] = []
        shares: list[int] = []
        added = 0
        for op in ops:
            if type(op) is QueuedStore:
                if op.cancelled:
                    op.on_durable(None)
                    continue
                share = OP_OVERHEAD + sum(map(len, op.record.content))
            elif type(op) is tuple:  # a stream row: its content is one blob
                share = OP_OVERHEAD + op[6]
            elif type(op) is StreamAppend:
                share = OP_OVERHEAD * len(op.rows) + op.bytes
            else:
                share = OP_OVERHEAD
            kept.append(op)
            shares.append(share)
            added += share
        writer = self.writer
        if kept and writer is not None:
            writer.submit(kept)
            self.replica.handed_over(kept)
            self._backlog.handed(shares, added)

    # Reports from the writer thread, run in the reactor thread.

    def _write_failed(self, stream_last: Mapping[str, int]) -> None:
        """
        The writer failed a batch (its records are not on the disk): what
        was queued before now fails too, unwritten (L{Resume}), and what
        comes from now on is written again.
        """
        if self.writer is not None:
            self.direct(self.writer, Resume())
        if stream_last:
            for watcher in self.failure_watchers:
                watcher(stream_last)

    def finish(self, outcome: BatchOutcome) -> None:
        """A batch is done (and, in a pair, on the partner's disk too)."""
        self.pending -= outcome.operations
        self._backlog.done(outcome.operations)
        if outcome.error is None and outcome.stream_last:
            # Before the tail lets the records go: a read of them a watcher
            # makes now is served from memory.
            for watcher in self.durable_watchers:
                watcher(outcome.stream_last)
        self._sequence.committed(outcome.stream_last)
        counters = self.counters
        error = outcome.error
        if error is None:
            counters.batches += 1
            counters.records_written += outcome.records
            counters.bytes_written += outcome.bytes
            if self.on_batch is not None:
                self.on_batch(outcome.records)
        for on_durable in outcome.callbacks:
            try:
                on_durable(error)
            except Exception:
                _log.failure("on_durable callback failed")
        if outcome.refused or outcome.dropped:
            self._report_records(outcome)
        if error is not None:
            self.report(error)

    def _report_records(self, outcome: BatchOutcome) -> None:
        """Count and log the records that alone failed; tell each letter's sender."""
        counters = self.counters
        for on_durable, refusal in outcome.refused:
            counters.letters_refused += 1
            _log.warn("{error}; its sender is told", error=refusal)
            try:
                on_durable(refusal)
            except Exception:
                _log.failure("on_durable callback failed")
        for dropped in outcome.dropped:
            counters.stream_records_dropped += 1
            _log.warn(
                "stream record dropped: stream {stream} seq {seq}: {error}",
                stream=ascii(dropped.stream),
                seq=dropped.seq,
                error=dropped.error,
            )

    def report(self, error: JournalError) -> None:
        """A failure of the journal: counted, and told to ``on_error`` (else logged)."""
        self.counters.errors += 1
        if self.on_error is None:
            _log.error("{error}", error=error)
            return
        try:
            self.on_error(error)
        except Exception:
            _log.failure("journal on_error callback failed")
