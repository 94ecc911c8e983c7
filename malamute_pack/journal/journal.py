"""
The journal as the broker sees it: a facade used from the reactor thread
that never waits on disk, composed of parts with one job each:

- opening and recovery (:mod:`malamute_pack.journal.opening`): the file
  checked against the data directory's marker, migrated, and read back
  (:class:`Recovered`);
- sequencing and the tail (:mod:`malamute_pack.journal.sequencing`):
  sequence numbers and queued-record ids assigned here, synchronously, and
  the stream records not yet committed, which reads see at once;
- the hand-over to the :class:`~malamute_pack.journal.writer.JournalWriter`
  thread, which group-commits, and its reports back
  (:mod:`malamute_pack.journal.handover`); a writer broken by an
  unexpected error fails every write as a full disk does, until the
  journal opens again (:attr:`Journal.writer_failure` says why);
- reads of committed records (:mod:`malamute_pack.journal.reads`, the SQL),
  on a reader thread with its own connection
  (:mod:`malamute_pack.journal.reader`; WAL lets it read while the writer
  writes); every record read is verified against its checksum
  (:mod:`malamute_pack.journal.verify`), a damaged one left out and
  remembered (:mod:`malamute_pack.journal.damage`: :meth:`Journal.lost`
  says which stretches a read cannot serve, so the broker tells its
  readers of gaps there; logged once, counted in ``damaged_records``);
- a file found damaged as it opens is salvaged first
  (:mod:`malamute_pack.journal.checking`, :mod:`malamute_pack.journal.salvage`;
  :attr:`Journal.salvaged` says what was lost, and the stretches lost stay
  told as gaps after restarts; a pair's partner fills them again,
  :meth:`Journal.losses`, :meth:`Journal.forget_losses`);
- replication hooks (:mod:`malamute_pack.journal.replica`);
- backpressure (:mod:`malamute_pack.journal.backlog`) and retention, a
  ``LoopingCall`` that hands each prune to the writer thread
  (:mod:`malamute_pack.journal.pruning`).

A broker of a primary/backup pair (:mod:`malamute_pack.pair`) sees every
batch of writes handed to the writer (``shipper``, with its position in
the order of writes) to send to its partner, and may have the journal hold
each batch's outcome (callbacks, the durability of stream records) until
the partner says it has it too (``hold_for_replica``, ``replica_acked``);
the partner applies what it receives with :meth:`Journal.apply`. Besides
records and letters, the writes it ships are the owners of addresses
(:meth:`Journal.save_owner`: the journal is the broker's
:class:`~malamute_pack.broker.access.OwnerStore`, and :meth:`Journal.open`
reads the claims back), an operator's stream deletes and retention changes
(:meth:`Journal.delete_stream`, :meth:`Journal.set_retention`), the
last-value streams (:meth:`Journal.set_compaction`), and notes for the
partner alone (:meth:`Journal.pass_to_partner`).

Last-value streams (compacted by subject, docs/protocol.md): the config's
``compacted`` streams (turned on and off at open when the file says
otherwise) and an operator's changes (until the broker restarts) keep each
subject's latest record (:mod:`malamute_pack.journal.last_values`);
:meth:`Journal.read_last_values` reads them as of the stream's last
sequence number at the call.

Tests: ``tests/unit/test_journal_journal.py``, ``tests/unit/test_journal_retention.py``,
``tests/system/test_journal_durability.py``, ``tests/unit/test_journal_disk_full.py``,
``tests/unit/test_journal_isolation.py``, ``tests/unit/test_journal_origin.py``,
``tests/unit/test_journal_owners.py``, ``tests/unit/test_journal_last_values.py``,
``tests/unit/test_journal_writer_failure.py``, ``tests/unit/test_journal_damage.py``.
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.journal import reads
from malamute_pack.journal.backlog import Backlog
from malamute_pack.journal.checksums import with_checksums
from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.damage import Damage
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.handover import HandOver, JournalCounters
from malamute_pack.journal.inserts import INSERT_STREAM
from malamute_pack.journal.last_values import Capture
from malamute_pack.journal.opening import Recovered, open_journal
from malamute_pack.journal.pruning import Pruning
from malamute_pack.journal.reader import ReaderThread
from malamute_pack.journal.records import QUEUED_KINDS
from malamute_pack.journal.replica import Shipper
from malamute_pack.journal.salvage import Salvage
from malamute_pack.journal.schema import (
    QUEUED_LAST_ID,
    RAISE_COUNTER,
    SKIP_UP_TO,
    STREAM_FLOOR,
)
from malamute_pack.journal.sequencing import Ceiling, Sequencer, merge_tail
from malamute_pack.journal.verify import Found
from malamute_pack.journal.writer import (
    Barrier,
    CompactSet,
    ConsumerSave,
    DurableCallback,
    Execute,
    JournalWriter,
    LastValuesMark,
    OwnerClaim,
    PartnerNote,
    QueuedRemove,
    QueuedStore,
    RetentionSet,
    Stop,
    StreamAppend,
    StreamDelete,
    WriteOp,
)
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import ConsumerPosition, QueuedRecord, StreamRecord, StreamRow
from malamute_pack.text import plural

__all__ = ["Journal", "JournalCounters", "Recovered", "Rows", "Shipper"]

_log = Logger()

Rows = list[tuple[Any, ...]]
T = TypeVar("T")

# A record lost to damage and copied again from a pair's partner (one
# already there stays), and its stream's totals after a page of them.
_REFILL_ROW: Final = INSERT_STREAM.replace("INSERT", "INSERT OR IGNORE", 1)
_REFILL_COUNTS: Final = (
    "UPDATE streams SET message_count = message_count + ?, total_bytes = total_bytes + ?"
    " WHERE stream = ?"
)


class _ThreadedReactor(Protocol):
    # The reactor methods the journal calls; Twisted's zope interfaces
    # declare them without ``self``, which mypy cannot check calls against.
    def seconds(self) -> float: ...

    def callLater(self, delay: float, f: Callable[..., object], *args: object) -> object: ...

    def callFromThread(self, f: Callable[..., object], *args: object) -> None: ...


class Journal:
    """
    The SQLite journal at ``path``. ``reactor`` must provide
    ``IReactorTime`` and ``IReactorFromThreads`` (the real reactor does; in
    tests a ``Clock`` with a ``callFromThread`` will do). With ``marker``
    (a path in the data directory), the journal's identity is checked
    against that marker when it opens, and recorded there the first time
    (:mod:`malamute_pack.journal.identity`).
    """

    def __init__(
        self,
        path: Path,
        reactor: IReactorTime,
        config: JournalConfig | None = None,
        *,
        marker: Path | None = None,
    ) -> None:
        self._path = Path(path)
        self._marker = None if marker is None else Path(marker).absolute()
        self.identity: str | None = None
        self._reactor = reactor
        self._clock = cast(_ThreadedReactor, reactor)
        self._config = config if config is not None else JournalConfig()
        self.crashed = False
        # What the salvage of a damaged file did when it last opened (None: none ran).
        self.salvaged: Salvage | None = None
        self._sequence = Sequencer()
        self._backlog = Backlog()
        self._hand = HandOver(
            self._path, self._clock.callLater, self._clock.seconds, self._sequence, self._backlog
        )
        self._replica = self._hand.replica
        self._submit = self._hand.submit
        self._reader = ReaderThread(self._path, cast(IReactorFromThreads, reactor))
        self._damage = Damage(str(self._path), self._clock.seconds, self._hand.counters)
        self._pruning = Pruning(reactor, self._hand, self._sequence, self._open_writer)
        # A close under way: who else asked for it waits for its end.
        self._closing: list[Deferred[None]] | None = None

    @property
    def path(self) -> Path:
        return self._path

    @property
    def marker(self) -> Path | None:
        """The data directory's marker this journal checks its identity against, if any."""
        return self._marker

    @property
    def is_open(self) -> bool:
        """Whether the journal is open (its writer running)."""
        return self._hand.writer is not None

    @property
    def writer_failure(self) -> JournalError | None:
        """
        Why the writer takes no writes while the journal is open, or None:
        its thread failed on an unexpected error (a bug), reported once
        through L{on_error} and logged with its traceback; every write
        fails from then on, as on a full disk, until the journal is opened
        again.
        """
        writer = self._hand.writer
        return None if writer is None else writer.failure

    @property
    def config(self) -> JournalConfig:
        """Its settings (retention as L{set_retention} last changed it)."""
        return self._config

    @property
    def counters(self) -> JournalCounters:
        """Running totals (L{JournalCounters})."""
        return self._hand.counters

    @property
    def on_error(self) -> Callable[[JournalError], None] | None:
        """Told of each failure of the journal itself (else it is logged)."""
        return self._hand.on_error

    @on_error.setter
    def on_error(self, callback: Callable[[JournalError], None] | None) -> None:
        self._hand.on_error = callback

    @property
    def on_batch(self) -> Callable[[int], None] | None:
        """Told the records of each batch that committed."""
        return self._hand.on_batch

    @on_batch.setter
    def on_batch(self, callback: Callable[[int], None] | None) -> None:
        self._hand.on_batch = callback

    @property
    def shipper(self) -> Shipper | None:
        """A pair's active's: sees every hand-over to the writer (L{Shipper})."""
        return self._replica.shipper

    @shipper.setter
    def shipper(self, shipper: Shipper | None) -> None:
        self._replica.shipper = shipper

    @property
    def on_unwritten(self) -> Callable[[list[WriteOp]], None] | None:
        """
        A pair's active's: told the operations it shipped in a batch its
        writer then failed (a full disk), for the partner to remove them.
        """
        return self._replica.on_unwritten

    @on_unwritten.setter
    def on_unwritten(self, callback: Callable[[list[WriteOp]], None] | None) -> None:
        self._replica.on_unwritten = callback

    @property
    def commit_latencies(self) -> deque[float]:
        """Seconds from hand-over to commit of the latest batches (statistics)."""
        return self._replica.commit_latencies

    # Opening and closing.

    def open(self, *, takeover: bool = False) -> Recovered:
        """
        Create or migrate the database, recover its state and start the
        writer and reader threads. Blocks: call it at startup (or again
        after L{close}). With C{takeover} (a pair's passive becoming
        active), numbering jumps past what the old active may have handed
        out, as after a crash.
        """
        if self._hand.writer is not None:
            raise JournalError(f"journal {self._path} is already open")
        opened = open_journal(
            self._path,
            self._marker,
            self._config.crash_skip,
            takeover=takeover,
            check=self._config.check_at_open,
            now=self._clock.seconds,
        )
        self.identity = opened.identity
        self.crashed = opened.crashed
        if opened.wal_repaired is not None:
            _log.error("journal {path}: {why}", path=str(self._path), why=opened.wal_repaired)
        if opened.salvage is not None:
            self.salvaged = opened.salvage
            self._log_salvage(opened.salvage)
        recovered = opened.recovered
        self._sequence.recovered(recovered.streams, opened.last_id, recovered.stream_floor)
        self._damage.clear()
        for stream, first, last, why in recovered.losses:
            self._damage.add(stream, first, last, why, quiet=True)
        self._damage.found(recovered.found, self._sequence.last_seq)
        if recovered.losses and opened.salvage is None:
            _log.warn(
                "journal {path}: {n} of records lost in an earlier salvage of a damaged"
                " journal: their readers are told of gaps",
                path=str(self._path),
                n=plural(len(recovered.losses), "stretch", "stretches"),
            )
        self._reader.start(opened.reader)
        writer = JournalWriter(
            opened.conn,
            self._path,
            self._config,
            self._clock.callFromThread,
            self._replica.batch_done,
            self._pruning.done,
            self._hand.report,
        )
        self._hand.start(writer)
        writer.start()
        if writer.last_values.names() != self._config.compacted:
            # The config says which streams are last-value streams (an
            # operator's change lasted until the restart).
            self._submit(CompactSet(self._config.compacted))
        self._pruning.start(self._config.prune_interval_s)
        return recovered

    def _log_salvage(self, salvaged: Salvage) -> None:
        _log.critical(
            "journal {path} was damaged ({reason}): salvaged into a new journal with the same"
            " identity; the damaged file is kept at {aside}. Lost:",
            path=str(self._path),
            reason=salvaged.reason,
            aside=str(salvaged.aside),
        )
        for line in salvaged.report():
            _log.error("journal {path} salvage: {line}", path=str(self._path), line=line)
        _log.warn(
            "journal {path} salvage: numbering jumps past every number the damaged file"
            " showed, as after a crash; the lost records' readers are told of gaps",
            path=str(self._path),
        )

    def close(self) -> Deferred[None]:
        """
        Write everything queued, then stop the threads and close the
        database. While a close is under way (its writer stopping, its
        reader closing), another fires only when that one is done: the
        journal service's close at shutdown waits for a pair's takeover's.
        """
        if self._closing is not None:
            waiting: Deferred[None] = Deferred()
            self._closing.append(waiting)
            return waiting
        hand = self._hand
        hand.hand_over()
        writer, hand.writer = hand.writer, None
        if writer is None:
            return succeed(None)
        self._closing = []
        self._pruning.stop()
        stopped: Deferred[None] = Deferred()
        writer.submit(Stop(lambda: stopped.callback(None)))

        def close_reader(_: None) -> Deferred[None]:
            writer.join()
            # Closing: what waited for the partner is not acknowledged (it
            # is on disk here, but the partner, which may serve next, may
            # lack it: a client told so tries again).
            self.withhold("the broker closed before its pair's partner had it")
            return self._reader.stop()

        def done(result: object) -> object:
            waiting, self._closing = self._closing or [], None
            for d in waiting:
                if isinstance(result, Failure):
                    d.errback(result)
                else:
                    d.callback(None)
            return result

        return stopped.addCallback(close_reader).addBoth(done)

    def _open_writer(self) -> JournalWriter:
        writer = self._hand.writer
        if writer is None:
            raise JournalError(f"journal {self._path} is not open")
        return writer

    def flush(self) -> Deferred[None]:
        """Fires once everything queued so far has been written (or has failed)."""
        flushed: Deferred[None] = Deferred()
        writer = self._open_writer()
        self._hand.direct(writer, Barrier(lambda: flushed.callback(None)))
        return flushed

    # Streams.

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
        Journal a stream message; return its sequence number (assigned now).
        A message a peer broker forwarded gives ``origin`` (that broker's
        id) and ``origin_seq`` (its sequence number there); a local write
        leaves them "" and 0.
        """
        if self._hand.writer is None:
            raise JournalError(f"journal {self._path} is not open")
        row = self._sequence.stream_row(
            stream, sender, subject, content, timestamp, origin, origin_seq
        )
        self._hand.submit_row(row)
        return row[1]

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
        Journal ``records`` (subject, frames) on ``stream`` and remember
        ``key`` for them, in one transaction, forgetting the keys in
        ``forget``; return the first record's sequence number (the others
        follow it). ``on_durable`` once that commits (None) or fails.
        """
        self._open_writer()
        first = self._sequence.last_seq(stream) + 1
        rows = self._sequence.batch_rows(stream, sender, records, timestamp)
        last = first + len(records) - 1
        size = sum(row[6] for row in rows)
        op = StreamAppend(
            rows, (stream, key, first, last, timestamp), list(forget), on_durable, size
        )
        self._submit(op)
        return first

    def stream_names(self) -> list[str]:
        """Every stream the journal has numbered, recovered or since, sorted."""
        return self._sequence.stream_names()

    def first_seq(self, stream: str) -> int:
        """The first sequence number ``stream`` still retains (last_seq + 1 if none)."""
        return self._sequence.first_seq(stream)

    def last_seq(self, stream: str) -> int:
        """The last sequence number assigned in ``stream`` (0 for an unknown stream)."""
        return self._sequence.last_seq(stream)

    def durable_seq(self, stream: str) -> int:
        """The last sequence number of ``stream`` whose record is committed (0 for none)."""
        return self._sequence.durable_seq(stream)

    def watch_durable(self, callback: Callable[[Mapping[str, int]], None]) -> None:
        """
        Call ``callback(stream_last)`` as each batch commits (in a pair, once
        the partner has it too): per stream, its last number in the batch,
        all through it now durable. Called before the in-memory tail lets
        the batch's records go, so reading them then costs no disk read.
        """
        self._hand.durable_watchers.append(callback)

    def watch_failures(self, callback: Callable[[Mapping[str, int]], None]) -> None:
        """
        Call ``callback(stream_last)`` as a batch fails (a full disk, or, in a
        pair, not acknowledged): per stream, its last number in the batch;
        the batch's records are not served.
        """
        self._hand.failure_watchers.append(callback)

    def read_stream(self, stream: str, from_seq: int, limit: int) -> Deferred[list[StreamRecord]]:
        """
        Up to ``limit`` records of ``stream`` with seq >= ``from_seq``, in
        order, committed or not. Below ``first_seq`` the answer starts at
        ``first_seq``: the caller sees the gap by comparing.
        """
        if limit <= 0:
            return succeed([])
        snapshot, complete = self._sequence.read_tail(stream, from_seq, limit)
        if complete:
            return succeed(snapshot)
        found = Found()
        reading = self._reader.read(reads.stream_records, stream, from_seq, limit, found)
        return reading.addCallback(self._took, found).addCallback(
            merge_tail, snapshot, from_seq, limit
        )

    def read_rows(
        self, stream: str, from_seq: int, to_seq: int, limit: int, max_bytes: int
    ) -> Deferred[list[ChunkRow]]:
        """
        The committed records of ``stream`` with ``from_seq <= seq <=
        to_seq``, in order, up to ``limit`` of them and about ``max_bytes``
        of content (at least one), with their frames as stored.
        """
        if limit <= 0 or from_seq > to_seq:
            return succeed([])
        found = Found()
        reading = self._reader.read(
            reads.chunk_rows, stream, from_seq, to_seq, limit, max_bytes, found
        )
        return reading.addCallback(self._took, found)

    def _took(self, result: T, found: Found) -> T:
        """A read's C{result}, once the damage it C{found} is known (and logged, counted)."""
        if found:
            self._damage.found(found, self._sequence.last_seq)
        return result

    def lost(self, stream: str, first: int, last: int) -> list[tuple[int, int]]:
        """
        The stretches of C{stream} in C{first}..C{last} (clipped to it, in
        order) whose records cannot be served: found damaged by a read, or
        lost in a salvage of a damaged file
        (:mod:`malamute_pack.journal.damage`). A reader is told of each as
        a gap.
        """
        return self._damage.lost(stream, first, last)

    def losses(self) -> dict[str, int]:
        """Per stream, the first number it cannot serve (a pair's partner may have it)."""
        return self._damage.losses()

    def forget_losses(self, streams: Sequence[str]) -> Deferred[list[Rows]]:
        """
        C{streams} were filled again (a pair's catch-up copied them from the
        partner past their first loss): their stretches are forgotten, and
        their salvage's losses leave the file.
        """
        self._damage.clear(streams)
        return self.execute(
            [("DELETE FROM journal_losses WHERE stream = ?", (stream,)) for stream in streams]
        )

    def loss_stretches(self) -> dict[str, list[tuple[int, int]]]:
        """Per stream, every stretch it cannot serve (L{lost}), in order."""
        return self._damage.stretches()

    def refill(
        self,
        stream: str,
        first: int,
        last: int,
        rows: Sequence[StreamRow],
        still: Sequence[tuple[int, int]],
    ) -> Deferred[list[Rows]]:
        """
        Records of C{stream} this journal had lost, C{rows} (all in
        C{first}..C{last}), copied again from a pair's partner: written
        (with their checksums, not shipped), and the losses in
        C{first}..C{last} become C{still} (what the partner lacked too),
        in the file and, once written, here.
        """
        statements: list[tuple[str, tuple[Any, ...]]] = [
            (_REFILL_ROW, row) for row in with_checksums(rows)
        ]
        if rows:
            size = sum(row[6] for row in rows)
            statements.append((_REFILL_COUNTS, (len(rows), size, stream)))
        after = self._damage.replaced(stream, first, last, still)
        now = self._clock.seconds()
        statements.append(("DELETE FROM journal_losses WHERE stream = ?", (stream,)))
        statements += [
            (
                "INSERT INTO journal_losses (stream, first_seq, last_seq, found, reason)"
                " VALUES (?, ?, ?, ?, ?)",
                (stream, a, b, now, "lost to damage; the pair's partner did not have it"),
            )
            for a, b in after
        ]
        writing = self.execute(statements)

        def written(result: list[Rows]) -> list[Rows]:
            self._damage.put(stream, after)
            return result

        return writing.addCallback(written)

    def seq_at_time(self, stream: str, t: float) -> Deferred[int]:
        """The first seq of ``stream`` with timestamp >= ``t`` (last_seq + 1 if none)."""
        in_tail = self._sequence.first_in_tail_at(stream, t)
        after_last = self.last_seq(stream) + 1

        def choose(committed: int | None) -> int:
            found = [seq for seq in (committed, in_tail) if seq is not None]
            return min(found) if found else after_last

        return self._reader.read(reads.first_at_time, stream, t).addCallback(choose)

    def stream_totals(self) -> Deferred[dict[str, tuple[int, int]]]:
        """Per stream, the records and content bytes committed and retained."""
        return self._reader.read(reads.stream_totals)

    def origin_marks(self) -> dict[tuple[str, str], int]:
        """
        Per (stream, origin) of the forwarded records still retained, the
        highest ``origin_seq``: how far each peer's copy has been received,
        so a receiver can drop what a peer sends again. Records not yet
        committed count too.

        A startup call: it blocks on the disk (a query on its own
        connection, answered from the partial origin index), so make it
        once, after :meth:`open`, before traffic flows. Marks come from the
        records themselves: an origin whose records retention has pruned
        entirely is forgotten (no mark), so its peer resends from its own
        retained history and the receiver dedupes by the mark of what it
        journals again.
        """
        self._open_writer()
        try:
            with closing(sqlite3.connect(self._path, isolation_level=None)) as conn:
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("PRAGMA query_only = ON")
                marks = reads.committed_origin_marks(conn)
        except sqlite3.Error as exc:
            raise JournalError.wrap(exc, self._path, "reading origin marks") from exc
        # The tail leaves memory only in this thread, after its commit: a
        # row is in the tail, in what the query saw, or both.
        self._sequence.tail_origin_marks(marks)
        return marks

    def newest_times(self) -> dict[str, float]:
        """
        Per stream, the time of its newest committed record: about when this
        broker last took part in it (a pack asks its peers for what they
        wrote since, when it has taken nothing from them yet). A startup
        call, blocking on the disk as L{origin_marks}.
        """
        self._open_writer()
        try:
            with closing(sqlite3.connect(self._path, isolation_level=None)) as conn:
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("PRAGMA query_only = ON")
                return reads.newest_times(conn)
        except sqlite3.Error as exc:
            raise JournalError.wrap(exc, self._path, "reading the newest records' times") from exc

    def delete_stream(self, stream: str) -> Deferred[tuple[int, int]]:
        """
        Delete every record of C{stream} assigned so far (an operator's
        delete): gone for readers at once (the first retained sequence
        number moves past them), from the file in the order of writes
        (L{StreamDelete}, which a pair's partner applies too); fires with
        the records and content bytes deleted. Its sequence numbers go on.
        """
        self._open_writer()
        last = self._sequence.delete_all(stream)
        deleted: Deferred[tuple[int, int]] = Deferred()

        def done(error: JournalError | None) -> None:
            if error is not None:
                deleted.errback(error)
            else:
                deleted.callback((op.deleted, op.freed))

        op = StreamDelete(stream, last, done)
        self._submit(op)
        return deleted

    def forget_before(self, stream: str, first: int) -> None:
        """C{stream} retains nothing before C{first} (a replica following its active's)."""
        self._sequence.forget_before(stream, first)

    # Mailboxes and service queues.

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
        Journal a mailbox or service-queue message, under ``record_id`` (an
        id L{queued_id} gave) or the next id. ``on_durable`` is called in
        the reactor thread with ``None`` once it has committed, or with the
        JournalError if its batch failed. ``relay_origin`` and ``relay_id``
        name the pack peer that handed it over and its id there.
        """
        if kind not in QUEUED_KINDS:
            raise ValueError(f"kind must be 'mailbox' or 'service': {kind!r}")
        self._open_writer()
        record = QueuedRecord(
            self._sequence.queued_id() if record_id is None else record_id,
            kind,
            address,
            sender,
            subject,
            tracker,
            deadline,
            self._clock.seconds(),
            tuple(content),
            relay_origin,
            relay_id,
        )
        self._hand.submit_store(QueuedStore(record, on_durable))
        return record

    def queued_id(self) -> int:
        """A new queued record's id (to L{store_queued} later, or never)."""
        return self._sequence.queued_id()

    def remove_queued(self, record_id: int) -> None:
        """Delete a queued record (its recipient confirmed it), in the next batch."""
        self._open_writer()
        if not self._hand.cancel_store(record_id):
            self._submit(QueuedRemove(record_id))

    def read_queued(self, ids: Sequence[int]) -> Deferred[list[QueuedRecord]]:
        """The queued records among C{ids} still stored, in id order."""
        if not ids:
            return succeed([])
        found = Found()
        return self._reader.read(reads.queued_by_ids, list(ids), found).addCallback(
            self._took, found
        )

    # Owners of addresses.

    def save_owner(self, address: str, user: str, claimed: float) -> None:
        """
        Record that C{user} owns C{address} since C{claimed}, replacing any
        other owner it had, in the order of writes (L{OwnerClaim}, shipped
        to a pair's partner): the broker's
        L{OwnerStore<malamute_pack.broker.access.OwnerStore>}. Never
        raises: a claim the journal cannot take is logged.
        """
        if self._hand.writer is None:
            _log.error(
                "owner of {address} not saved (it is free again after a restart):"
                " the journal {path} is not open",
                address=ascii(address),
                path=str(self._path),
            )
            return
        self._submit(OwnerClaim(address, user, claimed))

    def read_owners(self, after: str | None, limit: int) -> Deferred[list[tuple[str, str, float]]]:
        """
        Up to C{limit} owners (address, user, when claimed) committed, in
        the order of their addresses, from the first after C{after} (None:
        from the first of all).
        """
        return self._reader.read(reads.owners_page, after, limit)

    # Consumers the broker remembers.

    def save_consumer(
        self,
        position: ConsumerPosition,
        on_durable: Callable[[JournalError | None], None] | None = None,
    ) -> None:
        """
        Keep C{position} (replacing the consumer's earlier one), in the
        order of writes (L{ConsumerSave}, shipped to a pair's partner);
        C{on_durable} once it is committed, or with the error.
        """
        self._open_writer()
        self._submit(ConsumerSave(position, False, on_durable))

    def read_consumers(self) -> Deferred[list[ConsumerPosition]]:
        """Every consumer position committed, least recently used first."""
        return self._reader.read(reads.consumers)

    def forget_consumer(self, position: ConsumerPosition) -> None:
        """Delete the position of C{position}'s consumer, in the order of writes."""
        self._open_writer()
        self._submit(ConsumerSave(position, True))

    # Last-value streams.

    def compacted(self, stream: str) -> bool:
        """Whether C{stream} is a last-value stream (compacted by subject)."""
        return stream in self._config.compacted

    def set_compaction(self, stream: str, compact: bool) -> Deferred[int]:
        """
        Make C{stream} a last-value stream (C{compact}) or not, from here in
        the order of writes (L{CompactSet}, which a pair's partner applies
        too), until the broker restarts: turned on, its last values are
        built from its retained records; off, they are forgotten. Fires
        with the subjects it keeps once that is committed, or fails with
        the JournalError.
        """
        self._open_writer()
        wanted = set(self._config.compacted)
        if compact:
            wanted.add(stream)
        else:
            wanted.discard(stream)
        streams = frozenset(wanted)
        self._use_config(dataclasses.replace(self._config, compacted=streams))
        changed: Deferred[int] = Deferred()

        def done(error: JournalError | None) -> None:
            if error is not None:
                changed.errback(error)
            else:
                changed.callback(self.last_value_stats(stream)[0])

        self._submit(CompactSet(streams, False, done))
        return changed

    def last_value_stats(self, stream: str) -> tuple[int, int]:
        """
        Of last-value stream C{stream}: the subjects it keeps, and the
        records of new subjects past the limit not kept (since the journal
        opened); (0, 0) for another stream.
        """
        writer = self._hand.writer
        state = None if writer is None else writer.last_values.streams.get(stream)
        return (0, 0) if state is None else (state.subjects, state.not_kept)

    def read_last_values(self, stream: str) -> Deferred[list[StreamRecord]]:
        """
        The latest record of each subject of last-value stream C{stream}
        as of its last sequence number now (records not yet committed
        included: the read starts once they are), in sequence order. A
        subject updated since is there at its value as of now.
        """
        writer = self._open_writer()
        capture = Capture(stream, self._sequence.last_seq(stream))
        result: Deferred[list[StreamRecord]] = Deferred()

        def read() -> None:
            found = Found()
            try:
                reading = self._reader.read(
                    reads.last_values, stream, capture.through, capture.old, found
                )
            except JournalError as e:
                capture.open = False
                result.errback(e)
                return

            def got(records: list[StreamRecord]) -> None:
                capture.open = False
                result.callback(self._took(records, found))

            def failed(failure: Failure) -> None:
                capture.open = False
                result.errback(failure)

            reading.addCallbacks(got, failed)

        self._hand.direct(writer, LastValuesMark(capture, read))
        return result

    # Retention and backpressure.

    def set_retention(self, config: JournalConfig) -> None:
        """
        Prune by C{config}'s retention from the next pruning step on (an
        operator's change, until the broker restarts). It takes its place
        in the order of writes (L{RetentionSet}), so that a pair's partner
        prunes by it too.
        """
        self._use_config(config)
        if self._hand.writer is not None:
            self._submit(RetentionSet(config.retention, dict(config.per_stream_retention)))

    def _use_config(self, config: JournalConfig) -> None:
        self._config = config
        if self._hand.writer is not None:
            self._hand.writer.config = config

    def prune(self, now: float | None = None) -> Deferred[int]:
        """
        Apply retention as of ``now`` (the reactor's time by default); fires
        with the number of stream records deleted, or fails with JournalError.
        Prunes asked for while one is under way run after it, in turn; the
        timer asks for one every ``prune_interval_s`` unless one is running.
        """
        return self._pruning.prune(now)

    @property
    def pending_writes(self) -> int:
        """Writes (appends, stores, removes) handed to the writer and not yet reported back."""
        return self._hand.pending

    @property
    def pending_reads(self) -> int:
        """Reads handed to the reader thread and not yet answered."""
        return self._reader.pending

    @property
    def backlog_bytes(self) -> int:
        """Bytes of writes handed to the writer and not yet reported back."""
        return self._backlog.bytes

    def watch_backlog(self, limit: int, callback: Callable[[bool], None]) -> None:
        """
        Call C{callback(True)} when the backlog passes C{limit} bytes, and
        C{callback(False)} once it is back under half of it: the broker
        stops reading from its clients in between, so a journal that falls
        behind slows the producers instead of growing the broker's memory.
        """
        self._backlog.watch(limit, callback)

    # Replication.

    @property
    def handed(self) -> int:
        """Position of the last operation handed to the writer (0 before any)."""
        return self._replica.handed

    def hold_for_replica(self, hold: bool) -> None:
        """
        With C{hold}, each batch's outcome (its callbacks, its stream
        records becoming durable) waits until L{replica_acked} passes its
        last operation; without, whatever waits is let go at once (the
        partner is gone: the broker goes on alone).
        """
        self._replica.hold_for_replica(hold)

    def refuse_held(self, why: str) -> None:
        """
        What waits for a pair's partner now is not acknowledged: each fails,
        saying C{why} (the partner is unreachable: the clients try it).
        """
        error = JournalError(f"journal {self.path}: not acknowledged: {why}")
        error.reason = f"not acknowledged: {why}"
        self._replica.refuse_held(error)

    def withhold(self, why: str) -> None:
        """
        Acknowledge nothing more that waits for, or would wait for, a pair's
        partner: each such outcome fails, saying C{why} (the broker yields
        to its partner, or closes). Until the journal opens again.
        """
        error = JournalError(f"journal {self.path}: not acknowledged: {why}")
        error.reason = f"not acknowledged: {why}"
        self._replica.withhold(error)

    def replica_acked(self, position: int) -> None:
        """The partner has every operation up to C{position} on its disk."""
        self._replica.replica_acked(position)

    def confirm(self, position: int, on_durable: DurableCallback) -> None:
        """
        C{on_durable(None)} once the write at C{position} (a refused
        outcome's C{unconfirmed}: on this disk, not acknowledged by the
        pair's partner) is acknowledged after all, or with the error if it
        is refused again (L{ReplicaHold.confirm}).
        """
        self._replica.confirm(position, on_durable)

    def pass_to_partner(self, change: object) -> None:
        """
        Ship C{change} to a pair's partner in its place in the order of
        writes (a L{PartnerNote}); nothing of it is written here.
        """
        self._open_writer()
        self._submit(PartnerNote(change))

    def apply(self, ops: Sequence[WriteOp]) -> None:
        """
        Write C{ops} as they are: a pair's passive applying what its
        active wrote (sequence numbers and ids already assigned there).
        The counters follow, so nothing here is numbered again.
        """
        self._open_writer()
        sequence = self._sequence
        hand = self._hand
        for op in ops:
            kind = type(op)
            if kind is tuple:
                row = cast(StreamRow, op)
                sequence.follow_row(row[0], row[1])
            elif kind is QueuedStore:
                store = cast(QueuedStore, op)
                sequence.follow_id(store.record.id)
                hand.submit_store(store)
                continue
            elif kind is StreamAppend:
                append = cast(StreamAppend, op)
                sequence.follow_append(append.key[0], append.key[2], append.key[3])
            elif kind is QueuedRemove:
                if hand.cancel_store(cast(QueuedRemove, op).record_id):
                    continue
            elif kind is StreamDelete:
                delete = cast(StreamDelete, op)
                sequence.follow_delete(delete.stream, delete.through)
            elif kind is CompactSet:
                compaction = cast(CompactSet, op)
                self._use_config(dataclasses.replace(self._config, compacted=compaction.streams))
            elif kind is RetentionSet:
                change = cast(RetentionSet, op)
                self._use_config(
                    dataclasses.replace(
                        self._config,
                        retention=change.retention,
                        per_stream_retention=dict(change.per_stream),
                    )
                )  # pruned by it at the next pruning step
            self._submit(op)

    def execute(
        self,
        statements: Sequence[tuple[str, tuple[Any, ...]]],
        queries: Sequence[tuple[str, tuple[Any, ...]]] = (),
    ) -> Deferred[list[Rows]]:
        """
        Run C{statements}, then C{queries}, in one transaction once
        everything queued before has been written; fires with each query's
        rows, or fails with the JournalError (nothing of it written).
        """
        writer = self._open_writer()
        result: Deferred[list[Rows]] = Deferred()

        def done(error: JournalError | None, rows: list[Rows]) -> None:
            if error is not None:
                self._hand.report(error)
                result.errback(error)
            else:
                result.callback(rows)

        self._hand.direct(writer, Execute(list(statements), list(queries), done))
        return result

    def note_counters(self, lasts: dict[str, int], last_id: int) -> None:
        """
        Numbers the partner has handed out: never hand them out here (a
        pair's passive keeps its counters at least at its active's).
        """
        self._sequence.note_counters(lasts, last_id)

    def numbering_ceiling(self) -> Ceiling:
        """The highest stream number and letter id this journal may have given (0 for none)."""
        return self._sequence.ceiling()

    def number_past(self, ceiling: Ceiling) -> Deferred[list[Rows]]:
        """
        Give no stream number nor letter id up to C{ceiling}'s from now on,
        also after a restart (numbers a pair's partner may have given in a
        history this journal does not hold): every stream, and any stream
        to come, numbers past its stream number, letters past its id. Fires
        once that is committed.
        """
        self._sequence.number_past(ceiling)
        return self.execute(
            [
                # Numbers this journal never gives: a salvage counts none of them lost.
                (SKIP_UP_TO, (ceiling.streams,)),
                ("UPDATE streams SET last_seq = max(last_seq, ?)", (ceiling.streams,)),
                (RAISE_COUNTER, (STREAM_FLOOR, ceiling.streams)),
                (RAISE_COUNTER, (QUEUED_LAST_ID, ceiling.letters)),
            ]
        )

    def truncated(self, stream: str, last: int) -> None:
        """C{stream} now ends at C{last} (a replica cut back to its active's history)."""
        self._sequence.truncated(stream, last)

    def read_stream_rows(
        self, stream: str, from_seq: int, to_seq: int, limit: int
    ) -> Deferred[list[StreamRow]]:
        """
        The committed rows of C{stream} with C{from_seq <= seq <= to_seq},
        in order, up to C{limit}, as the writer inserts them (for a pair's
        partner catching up).
        """
        if limit <= 0 or from_seq > to_seq:
            return succeed([])
        found = Found()
        reading = self._reader.read(reads.full_rows, stream, from_seq, to_seq, limit, found)
        return reading.addCallback(self._took, found)

    def read_append_keys(
        self, stream: str, from_seq: int, to_seq: int
    ) -> Deferred[list[tuple[str, str, int, int, float]]]:
        """The append keys of C{stream} whose last record is in [from_seq, to_seq]."""
        return self._reader.read(reads.append_keys, stream, from_seq, to_seq)
