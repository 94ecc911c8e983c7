"""
The journal as the broker sees it: a facade used from the reactor thread
that never waits on disk.

Sequence numbers and queued-record ids are assigned here, synchronously,
from counters that :meth:`Journal.open` seeds from the database; writes go
to the :class:`~malamute_pack.journal.writer.JournalWriter` thread, which
group-commits them and reports each batch back in one ``callFromThread``.
Stream records stay in an in-memory tail until their batch has committed,
so :meth:`Journal.read_stream` sees them at once; reads of committed
records run on a reader thread with its own connection (WAL lets it read
while the writer writes). Retention runs as a ``LoopingCall`` that hands
each prune to the writer thread.

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
(:meth:`Journal.delete_stream`, :meth:`Journal.set_retention`), and notes
for the partner alone (:meth:`Journal.pass_to_partner`).

A record that alone cannot be written fails alone: a letter's
``on_durable`` gets its own JournalError (``record_refused``), a stream
record is dropped; each is counted (:class:`JournalCounters`) and logged,
and neither is a journal error (``on_error`` hears only of failures of the
journal itself, such as a full disk, which fail a whole batch).

Tests: ``tests/unit/test_journal_journal.py``, ``tests/unit/test_journal_retention.py``,
``tests/system/test_journal_durability.py``, ``tests/unit/test_journal_disk_full.py``,
``tests/unit/test_journal_isolation.py``, ``tests/unit/test_journal_origin.py``,
``tests/unit/test_journal_owners.py``.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol, cast

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from malamute_pack.broker.store import AppendKey, ChunkRow
from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.identity import (
    Marker,
    check_file,
    check_identity,
    read_marker,
    write_marker,
)
from malamute_pack.journal.records import (
    QUEUED_KINDS,
    QueuedRecord,
    StreamRecord,
    StreamRow,
    decode_frames,
    row_record,
    stream_row,
)
from malamute_pack.journal.schema import QUEUED_LAST_ID, RUNNING, journal_identity, migrate
from malamute_pack.journal.writer import (
    SET_COUNTER,
    Barrier,
    BatchOutcome,
    DurableCallback,
    Execute,
    JournalWriter,
    OwnerClaim,
    PartnerNote,
    Prune,
    PruneOutcome,
    QueuedRemove,
    QueuedStore,
    RetentionSet,
    Stop,
    StreamAppend,
    StreamDelete,
    WriteOp,
)

_log = Logger()

# What an operation costs beyond its content: its record, its row's other
# fields, the writer's queue entry.
_OP_OVERHEAD = 256


class _ThreadedReactor(Protocol):
    # The two reactor methods the journal calls; Twisted's zope interfaces
    # declare them without ``self``, which mypy cannot check calls against.
    def seconds(self) -> float: ...

    def callFromThread(self, f: Callable[..., object], *args: object) -> None: ...


@dataclass(slots=True)
class JournalCounters:
    """
    Running totals, updated in the reactor thread as batches report back.
    ``errors`` counts failures of the journal (a batch, a prune);
    ``letters_refused`` and ``stream_records_dropped`` count records that
    alone could not be written while the rest of their batch was.
    """

    batches: int = 0
    records_written: int = 0
    bytes_written: int = 0
    pruned: int = 0
    errors: int = 0
    letters_refused: int = 0
    stream_records_dropped: int = 0


@dataclass(frozen=True, slots=True)
class Recovered:
    """
    What :meth:`Journal.open` found: per stream the (first, last) sequence
    numbers retained (first is last + 1 when retention left none), the
    queued records not yet removed, in id order, and the keys of the
    idempotent appends remembered.
    """

    streams: dict[str, tuple[int, int]]
    queued: list[QueuedRecord]
    # The idempotent appends' keys remembered, oldest first.
    appends: list[AppendKey] = field(default_factory=list)
    # Per stream the last sequence number stored, and the last letter id,
    # before a crash's or a takeover's skip.
    lasts: dict[str, int] = field(default_factory=dict)
    last_id: int = 0
    # The pair_state table (malamute_pack.pair).
    pair: dict[str, str] = field(default_factory=dict)
    # The owners of addresses: address to (user, when claimed).
    owners: dict[str, tuple[str, float]] = field(default_factory=dict)


# What a pair's active hands its shipper: the position (in the order of
# writes, from 1) of the first operation, and the operations.
Shipper = Callable[[int, list[WriteOp]], None]
Rows = list[tuple[Any, ...]]


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
        self._call_from_thread = self._clock.callFromThread
        self._from_threads = cast(IReactorFromThreads, reactor)
        self._config = config if config is not None else JournalConfig()
        self.counters = JournalCounters()
        self.on_error: Callable[[JournalError], None] | None = None
        self._next_seq: dict[str, int] = {}
        self._first_seq: dict[str, int] = {}
        self._tails: dict[str, deque[StreamRow]] = {}
        self._next_id = 1
        self._pending = 0
        # Bytes of the operations handed to the writer and not yet reported
        # back, and each one's share in hand-over order (the writer reports
        # them in that order): what watch_backlog bounds.
        self._backlog_bytes = 0
        self._backlog_shares: deque[int] = deque()
        self._backlog_limit = 0
        self._on_backlog: Callable[[bool], None] | None = None
        self._backlog_over = False
        # Operations not yet handed to the writer (see _hand_over).
        self._outbox: list[WriteOp] = []
        self._outbox_stores: dict[int, QueuedStore] = {}
        self._hand_over_scheduled = False
        self.crashed = False
        self._writer: JournalWriter | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_pool: ThreadPool | None = None
        # A close under way: who else asked for it waits for its end.
        self._closing: list[Deferred[None]] | None = None
        self._prune_loop: LoopingCall | None = None
        self._pruning = False
        self.shipper: Shipper | None = None
        self._reset_positions()

    def _reset_positions(self) -> None:
        # Operations handed to the writer and reported back, counted from 1
        # since open: positions the shipper and the partner's acks use.
        self._handed = 0
        self._reported = 0
        self._hold = False
        self._replica_position = 0
        # Outcomes held for the partner: (position of the batch's last op, outcome).
        self._held: deque[tuple[int, BatchOutcome]] = deque()
        # Per hand-over, the position of its last operation and when: how
        # long a batch took from hand-over to commit (commit_latencies).
        self._handed_at: deque[tuple[int, float]] = deque()
        # Seconds from hand-over to commit of the latest batches (statistics).
        self.commit_latencies: deque[float] = deque(maxlen=256)

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
        return self._writer is not None

    @property
    def config(self) -> JournalConfig:
        """Its settings (retention as L{set_retention} last changed it)."""
        return self._config

    def set_retention(self, config: JournalConfig) -> None:
        """
        Prune by C{config}'s retention from the next pruning step on (an
        operator's change, until the broker restarts). It takes its place
        in the order of writes (L{RetentionSet}), so that a pair's partner
        prunes by it too.
        """
        self._use_config(config)
        if self._writer is not None:
            self._pending += 1
            change = RetentionSet(config.retention, dict(config.per_stream_retention))
            self._submit(self._writer, change)

    def _use_config(self, config: JournalConfig) -> None:
        self._config = config
        if self._writer is not None:
            self._writer.config = config

    def stream_totals(self) -> Deferred[dict[str, tuple[int, int]]]:
        """Per stream, the records and content bytes committed and retained."""
        return self._read(self._select_stream_totals)

    def delete_stream(self, stream: str) -> Deferred[tuple[int, int]]:
        """
        Delete every record of C{stream} assigned so far (an operator's
        delete): gone for readers at once (the first retained sequence
        number moves past them), from the file in the order of writes
        (L{StreamDelete}, which a pair's partner applies too); fires with
        the records and content bytes deleted. Its sequence numbers go on.
        """
        writer = self._open_writer()
        last = self.last_seq(stream)
        if last + 1 > self._first_seq.get(stream, 1):
            self._first_seq[stream] = last + 1
        deleted: Deferred[tuple[int, int]] = Deferred()

        def done(error: JournalError | None) -> None:
            if error is not None:
                deleted.errback(error)
            else:
                deleted.callback((op.deleted, op.freed))

        op = StreamDelete(stream, last, done)
        self._pending += 1
        self._submit(writer, op)
        return deleted

    def save_owner(self, address: str, user: str, claimed: float) -> None:
        """
        Record that C{user} owns C{address} since C{claimed}, replacing any
        other owner it had, in the order of writes (L{OwnerClaim}, shipped
        to a pair's partner): the broker's
        L{OwnerStore<malamute_pack.broker.access.OwnerStore>}. Never
        raises: a claim the journal cannot take is logged.
        """
        writer = self._writer
        if writer is None:
            _log.error(
                "owner of {address} not saved (it is free again after a restart):"
                " the journal {path} is not open",
                address=ascii(address),
                path=str(self._path),
            )
            return
        self._pending += 1
        self._submit(writer, OwnerClaim(address, user, claimed))

    def pass_to_partner(self, change: object) -> None:
        """
        Ship C{change} to a pair's partner in its place in the order of
        writes (a L{PartnerNote}); nothing of it is written here.
        """
        writer = self._open_writer()
        self._pending += 1
        self._submit(writer, PartnerNote(change))

    def read_owners(self, after: str | None, limit: int) -> Deferred[list[tuple[str, str, float]]]:
        """
        Up to C{limit} owners (address, user, when claimed) committed, in
        the order of their addresses, from the first after C{after} (None:
        from the first of all).
        """
        return self._read(self._select_owners, after, limit)

    def forget_before(self, stream: str, first: int) -> None:
        """C{stream} retains nothing before C{first} (a replica following its active's)."""
        if first > self._first_seq.get(stream, 1):
            self._first_seq[stream] = first

    @property
    def pending_writes(self) -> int:
        """Writes (appends, stores, removes) handed to the writer and not yet reported back."""
        return self._pending

    @property
    def backlog_bytes(self) -> int:
        """Bytes of writes handed to the writer and not yet reported back."""
        return self._backlog_bytes

    def watch_backlog(self, limit: int, callback: Callable[[bool], None]) -> None:
        """
        Call C{callback(True)} when the backlog passes C{limit} bytes, and
        C{callback(False)} once it is back under half of it: the broker
        stops reading from its clients in between, so a journal that falls
        behind slows the producers instead of growing the broker's memory.
        """
        self._backlog_limit = limit
        self._on_backlog = callback

    @property
    def handed(self) -> int:
        """Position of the last operation handed to the writer (0 before any)."""
        return self._handed

    def hold_for_replica(self, hold: bool) -> None:
        """
        With C{hold}, each batch's outcome (its callbacks, its stream
        records becoming durable) waits until L{replica_acked} passes its
        last operation; without, whatever waits is let go at once (the
        partner is gone: the broker goes on alone).
        """
        self._hold = hold
        if not hold:
            self._release(self._reported)

    def replica_acked(self, position: int) -> None:
        """The partner has every operation up to C{position} on its disk."""
        if position > self._replica_position:
            self._replica_position = position
            self._release(position)

    def _release(self, position: int) -> None:
        held = self._held
        while held and held[0][0] <= position:
            self._finish_batch(held.popleft()[1])

    def open(self, *, takeover: bool = False) -> Recovered:
        """
        Create or migrate the database, recover its state and start the
        writer and reader threads. Blocks: call it at startup (or again
        after L{close}). With C{takeover} (a pair's passive becoming
        active), numbering jumps past what the old active may have handed
        out, as after a crash.
        """
        if self._writer is not None:
            raise JournalError(f"journal {self._path} is already open")
        conn: sqlite3.Connection | None = None
        reader: sqlite3.Connection | None = None
        try:
            expected = self._check_file()
            self._path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 10000")
            migrate(conn)
            self._check_identity(conn, expected)
            recovered = self._recover(conn, takeover)
            reader = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            reader.execute("PRAGMA busy_timeout = 10000")
            reader.execute("PRAGMA query_only = ON")
        except (sqlite3.Error, ValueError, OSError, JournalError) as exc:
            for c in (conn, reader):
                if c is not None:
                    c.close()
            if isinstance(exc, JournalError):
                raise
            raise JournalError.wrap(exc, self._path, "opening") from exc
        self._reader = reader
        self._tails = {}
        self._pending = 0
        self._backlog_bytes = 0
        self._backlog_shares.clear()
        if self._backlog_over and self._on_backlog is not None:
            self._on_backlog(False)  # opened again: nothing is behind
        self._backlog_over = False
        self._reset_positions()
        self._read_pool = ThreadPool(minthreads=1, maxthreads=1, name="journal-reader")
        # Daemon, as the writer's: a reader left running (a close the reactor
        # did not see through) must not keep the process from exiting.
        self._read_pool.threadFactory = _daemon_thread  # type: ignore[assignment]
        self._read_pool.start()
        self._writer = JournalWriter(
            conn,
            self._path,
            self._config,
            self._call_from_thread,
            self._batch_done,
            self._prune_done,
        )
        self._writer.start()
        self._prune_loop = LoopingCall(self._prune_tick)
        self._prune_loop.clock = self._reactor
        self._prune_loop.start(self._config.prune_interval_s, now=False)
        return recovered

    def _check_file(self) -> Marker | None:
        """
        The marker, if there is one; refuses a journal file that is missing
        or empty where the marker says a journal was created.
        """
        if self._marker is None:
            return None
        expected = read_marker(self._marker)
        if expected is not None:
            check_file(self._path, self._marker, expected)
        return expected

    def _check_identity(self, conn: sqlite3.Connection, expected: Marker | None) -> None:
        """
        Refuse a journal whose identity is not the marker's; record it in a
        new marker where there was none.
        """
        identity, created = journal_identity(conn)
        if self._marker is not None:
            if expected is not None:
                check_identity(self._path, self._marker, expected, identity)
            else:
                write_marker(self._marker, Marker(str(self._path.resolve()), identity, created))
        self.identity = identity

    def _recover(self, conn: sqlite3.Connection, takeover: bool = False) -> Recovered:
        streams: dict[str, tuple[int, int]] = {}
        for stream, last_seq in conn.execute("SELECT stream, last_seq FROM streams").fetchall():
            (first,) = conn.execute(
                "SELECT min(seq) FROM stream_messages WHERE stream = ?", (stream,)
            ).fetchone()
            streams[stream] = (first if first is not None else last_seq + 1, last_seq)
        queued = [
            _queued_record(row)
            for row in conn.execute(f"SELECT {_QUEUED_COLUMNS} FROM queued_messages ORDER BY id")
        ]
        row = conn.execute(
            "SELECT value FROM journal_counters WHERE name = ?", (QUEUED_LAST_ID,)
        ).fetchone()
        last_id = max(row[0] if row else 0, queued[-1].id if queued else 0)
        crashed = conn.execute(
            "SELECT value FROM journal_counters WHERE name = ?", (RUNNING,)
        ).fetchone() not in (None, (0,))
        lasts = {stream: last for stream, (_, last) in streams.items()}
        before_skip = last_id
        if crashed or takeover:
            # Numbers handed out before the crash but never committed (live
            # deliveries, ids of letters being written) must not come again:
            # jump past them. Readers see the hole; nothing is reused.
            skip = self._config.crash_skip
            streams = {
                stream: (first if first <= last else last + skip + 1, last + skip)
                for stream, (first, last) in streams.items()
            }
            last_id += skip
        conn.execute(SET_COUNTER, (RUNNING, 1))
        appends = [
            AppendKey(*row)
            for row in conn.execute(
                "SELECT stream, key, first_seq, last_seq FROM stream_appends ORDER BY created"
            )
        ]
        pair = dict(conn.execute("SELECT name, value FROM pair_state").fetchall())
        owners = {
            str(address): (str(user), float(claimed))
            for address, user, claimed in conn.execute(
                "SELECT address, user, claimed FROM address_owners"
            )
        }
        self.crashed = crashed
        self._next_seq = {stream: last + 1 for stream, (_, last) in streams.items()}
        self._first_seq = {stream: first for stream, (first, _) in streams.items()}
        self._next_id = last_id + 1
        return Recovered(streams, queued, appends, lasts, before_skip, pair, owners)

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
        self._hand_over()
        writer, self._writer = self._writer, None
        if writer is None:
            return succeed(None)
        self._closing = []
        if self._prune_loop is not None and self._prune_loop.running:
            self._prune_loop.stop()
        stopped: Deferred[None] = Deferred()
        writer.submit(Stop(lambda: stopped.callback(None)))

        def close_reader(_: None) -> Deferred[None]:
            writer.join()
            # Closing: what waited for the partner is let go (it is on disk here).
            self.hold_for_replica(False)
            reader, pool = self._reader, self._read_pool
            assert reader is not None and pool is not None
            self._reader = self._read_pool = None
            closed = deferToThreadPool(self._from_threads, pool, reader.close)

            def stop_pool(result: object) -> object:
                pool.stop()
                return result

            return closed.addBoth(stop_pool)

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
        writer = self._writer
        if writer is None:
            raise JournalError(f"journal {self._path} is not open")
        return writer

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
        writer = self._open_writer()
        self._pending += 1
        seq = self._next_seq.get(stream, 1)
        self._next_seq[stream] = seq + 1
        if stream not in self._first_seq:
            self._first_seq[stream] = seq
        row = stream_row(stream, seq, timestamp, sender, subject, content, origin, origin_seq)
        tail = self._tails.get(stream)
        if tail is None:
            tail = self._tails[stream] = deque()
        tail.append(row)
        self._submit(writer, row)
        return seq

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
        writer = self._open_writer()
        self._pending += 1
        first = self._next_seq.get(stream, 1)
        self._next_seq[stream] = first + len(records)
        if stream not in self._first_seq:
            self._first_seq[stream] = first
        rows = [
            stream_row(stream, seq, timestamp, sender, subject, frames)
            for seq, (subject, frames) in enumerate(records, first)
        ]
        tail = self._tails.get(stream)
        if tail is None:
            tail = self._tails[stream] = deque()
        tail.extend(rows)
        last = first + len(records) - 1
        size = sum(row[6] for row in rows)
        op = StreamAppend(
            rows, (stream, key, first, last, timestamp), list(forget), on_durable, size
        )
        self._submit(writer, op)
        return first

    def durable_seq(self, stream: str) -> int:
        """The last sequence number of ``stream`` whose record is committed (0 for none)."""
        tail = self._tails.get(stream)
        if tail:
            return int(tail[0][1]) - 1
        return self.last_seq(stream)

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
        return self._read(self._select_rows, stream, from_seq, to_seq, limit, max_bytes)

    def first_seq(self, stream: str) -> int:
        """The first sequence number ``stream`` still retains (last_seq + 1 if none)."""
        return self._first_seq.get(stream, 1)

    def last_seq(self, stream: str) -> int:
        """The last sequence number assigned in ``stream`` (0 for an unknown stream)."""
        return self._next_seq.get(stream, 1) - 1

    def read_stream(self, stream: str, from_seq: int, limit: int) -> Deferred[list[StreamRecord]]:
        """
        Up to ``limit`` records of ``stream`` with seq >= ``from_seq``, in
        order, committed or not. Below ``first_seq`` the answer starts at
        ``first_seq``: the caller sees the gap by comparing.
        """
        if limit <= 0:
            return succeed([])
        tail = self._tails.get(stream)
        if tail and from_seq >= tail[0][1]:
            # All of it is still in memory: no thread, no disk.
            start = from_seq - tail[0][1]
            return succeed([row_record(row) for row in islice(tail, start, start + limit)])
        # Committed records leave the tail only after their commit, so what
        # is not in this snapshot the reader's later read transaction sees.
        snapshot = [row_record(row) for row in islice(tail, 0, limit)] if tail else []
        reading = self._read(self._select_stream, stream, from_seq, limit)
        return reading.addCallback(_merge_tail, snapshot, from_seq, limit)

    def seq_at_time(self, stream: str, t: float) -> Deferred[int]:
        """The first seq of ``stream`` with timestamp >= ``t`` (last_seq + 1 if none)."""
        tail = self._tails.get(stream, ())
        in_tail = next((row[1] for row in tail if row[2] >= t), None)
        after_last = self.last_seq(stream) + 1

        def choose(committed: int | None) -> int:
            found = [seq for seq in (committed, in_tail) if seq is not None]
            return min(found) if found else after_last

        return self._read(self._select_seq_at_time, stream, t).addCallback(choose)

    def _read(self, f: Callable[..., Any], *args: object) -> Deferred[Any]:
        pool = self._read_pool
        if pool is None:
            raise JournalError(f"journal {self._path} is not open")
        return deferToThreadPool(self._from_threads, pool, f, *args).addErrback(
            self._wrap_read_failure
        )

    def _wrap_read_failure(self, failure: Failure) -> Failure:
        if isinstance(failure.value, sqlite3.Error | ValueError):
            raise JournalError.wrap(failure.value, self._path, "reading") from failure.value
        return failure

    # Runs on the reader thread. A stream name SQLite cannot take (not valid
    # UTF-8) has nothing stored: its records were dropped as they came.
    def _select_stream(self, stream: str, from_seq: int, limit: int) -> list[StreamRecord]:
        assert self._reader is not None
        try:
            rows = self._reader.execute(
                "SELECT seq, ts, sender, subject, content, origin, origin_seq "
                "FROM stream_messages WHERE stream = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (stream, from_seq, limit),
            )
        except UnicodeEncodeError:
            return []
        return [
            StreamRecord(stream, seq, ts, sender, subject, decode_frames(content), origin, oseq)
            for seq, ts, sender, subject, content, origin, oseq in rows
        ]

    # Runs on the reader thread.
    def _select_rows(
        self, stream: str, from_seq: int, to_seq: int, limit: int, max_bytes: int
    ) -> list[ChunkRow]:
        assert self._reader is not None
        try:
            cursor = self._reader.execute(
                "SELECT seq, ts, sender, subject, content FROM stream_messages "
                "WHERE stream = ? AND seq >= ? AND seq <= ? ORDER BY seq LIMIT ?",
                (stream, from_seq, to_seq, limit),
            )
        except UnicodeEncodeError:
            return []
        rows: list[ChunkRow] = []
        size = 0
        new_row = ChunkRow._make
        for row in cursor:
            rows.append(new_row(row))
            size += len(row[4]) + 64
            if size >= max_bytes:
                break
        cursor.close()
        return rows

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
                marks = _committed_origin_marks(conn)
        except sqlite3.Error as exc:
            raise JournalError.wrap(exc, self._path, "reading origin marks") from exc
        # The tail leaves memory only in this thread, after its commit: a
        # row is in the tail, in what the query saw, or both.
        for tail in self._tails.values():
            for row in tail:
                if row[7]:
                    key = (row[0], row[7])
                    if row[8] > marks.get(key, 0):
                        marks[key] = row[8]
        return marks

    # Runs on the reader thread.
    def _select_seq_at_time(self, stream: str, t: float) -> int | None:
        assert self._reader is not None
        try:
            (seq,) = self._reader.execute(
                "SELECT min(seq) FROM stream_messages WHERE stream = ? AND ts >= ?", (stream, t)
            ).fetchone()
        except UnicodeEncodeError:
            return None
        return cast(int | None, seq)

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
    ) -> QueuedRecord:
        """
        Journal a mailbox or service-queue message; its id is assigned now.
        ``on_durable`` is called in the reactor thread with ``None`` once it
        has committed, or with the JournalError if its batch failed.
        ``relay_origin`` and ``relay_id`` name the pack peer that handed it
        over and its id there.
        """
        if kind not in QUEUED_KINDS:
            raise ValueError(f"kind must be 'mailbox' or 'service': {kind!r}")
        writer = self._open_writer()
        self._pending += 1
        record = QueuedRecord(
            self._next_id,
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
        self._next_id += 1
        store = QueuedStore(record, on_durable)
        self._outbox_stores[record.id] = store
        self._submit(writer, store)
        return record

    def remove_queued(self, record_id: int) -> None:
        """Delete a queued record (its recipient confirmed it), in the next batch."""
        writer = self._open_writer()
        store = self._outbox_stores.pop(record_id, None)
        if store is not None:
            # Stored and done with in the same reactor turn (a letter handed
            # straight to its recipient): neither need touch the disk.
            store.cancelled = True
            self._pending -= 1
            return
        self._pending += 1
        self._submit(writer, QueuedRemove(record_id))

    def apply(self, ops: Sequence[WriteOp]) -> None:
        """
        Write C{ops} as they are: a pair's passive applying what its
        active wrote (sequence numbers and ids already assigned there).
        The counters follow, so nothing here is numbered again.
        """
        writer = self._open_writer()
        next_seq = self._next_seq
        first_seq = self._first_seq
        for op in ops:
            kind = type(op)
            if kind is tuple:
                row = cast(StreamRow, op)
                stream, seq = row[0], row[1]
                if seq >= next_seq.get(stream, 1):
                    next_seq[stream] = seq + 1
                first_seq.setdefault(stream, seq)
            elif kind is QueuedStore:
                store = cast(QueuedStore, op)
                self._next_id = max(self._next_id, store.record.id + 1)
                self._outbox_stores[store.record.id] = store
            elif kind is StreamAppend:
                append = cast(StreamAppend, op)
                stream, last = append.key[0], append.key[3]
                next_seq[stream] = max(next_seq.get(stream, 1), last + 1)
                first_seq.setdefault(stream, append.key[2])
            elif kind is QueuedRemove:
                stored = self._outbox_stores.pop(cast(QueuedRemove, op).record_id, None)
                if stored is not None:
                    stored.cancelled = True
                    self._pending -= 1
                    continue
            elif kind is StreamDelete:
                delete = cast(StreamDelete, op)
                self.forget_before(delete.stream, delete.through + 1)
                if delete.through >= next_seq.get(delete.stream, 1):
                    next_seq[delete.stream] = delete.through + 1
            elif kind is RetentionSet:
                change = cast(RetentionSet, op)
                self._use_config(
                    dataclasses.replace(
                        self._config,
                        retention=change.retention,
                        per_stream_retention=dict(change.per_stream),
                    )
                )  # pruned by it at the next pruning step
            self._pending += 1
            self._submit(writer, op)

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
        self._hand_over()
        result: Deferred[list[Rows]] = Deferred()

        def done(error: JournalError | None, rows: list[Rows]) -> None:
            if error is not None:
                self._report(error)
                result.errback(error)
            else:
                result.callback(rows)

        writer.submit(Execute(list(statements), list(queries), done))
        return result

    def note_counters(self, lasts: dict[str, int], last_id: int) -> None:
        """
        Numbers the partner has handed out: never hand them out here (a
        pair's passive keeps its counters at least at its active's).
        """
        for stream, last in lasts.items():
            if last >= self._next_seq.get(stream, 1):
                self._next_seq[stream] = last + 1
        self._next_id = max(self._next_id, last_id + 1)

    def truncated(self, stream: str, last: int) -> None:
        """C{stream} now ends at C{last} (a replica cut back to its active's history)."""
        self._next_seq[stream] = last + 1
        self._first_seq[stream] = min(self._first_seq.get(stream, last + 1), last + 1)

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
        return self._read(self._select_full_rows, stream, from_seq, to_seq, limit)

    def read_queued(self, ids: Sequence[int]) -> Deferred[list[QueuedRecord]]:
        """The queued records among C{ids} still stored, in id order."""
        if not ids:
            return succeed([])
        return self._read(self._select_queued, list(ids))

    def read_append_keys(
        self, stream: str, from_seq: int, to_seq: int
    ) -> Deferred[list[tuple[str, str, int, int, float]]]:
        """The append keys of C{stream} whose last record is in [from_seq, to_seq]."""
        return self._read(self._select_append_keys, stream, from_seq, to_seq)

    # Run on the reader thread.
    def _select_full_rows(
        self, stream: str, from_seq: int, to_seq: int, limit: int
    ) -> list[StreamRow]:
        assert self._reader is not None
        rows = self._reader.execute(
            "SELECT stream, seq, ts, sender, subject, content, bytes, origin, origin_seq "
            "FROM stream_messages WHERE stream = ? AND seq >= ? AND seq <= ? "
            "ORDER BY seq LIMIT ?",
            (stream, from_seq, to_seq, limit),
        ).fetchall()
        return cast(list[StreamRow], rows)

    def _select_owners(self, after: str | None, limit: int) -> list[tuple[str, str, float]]:
        assert self._reader is not None
        select = "SELECT address, user, claimed FROM address_owners"
        if after is None:
            cursor = self._reader.execute(f"{select} ORDER BY address LIMIT ?", (limit,))
        else:
            cursor = self._reader.execute(
                f"{select} WHERE address > ? ORDER BY address LIMIT ?", (after, limit)
            )
        return [(str(a), str(u), float(c)) for a, u, c in cursor.fetchall()]

    def _select_stream_totals(self) -> dict[str, tuple[int, int]]:
        assert self._reader is not None
        rows = self._reader.execute("SELECT stream, message_count, total_bytes FROM streams")
        return {stream: (count, size) for stream, count, size in rows}

    def _select_queued(self, ids: list[int]) -> list[QueuedRecord]:
        assert self._reader is not None
        found: list[QueuedRecord] = []
        for start in range(0, len(ids), 500):
            part = ids[start : start + 500]
            marks = ",".join("?" * len(part))
            rows = self._reader.execute(
                f"SELECT {_QUEUED_COLUMNS} FROM queued_messages WHERE id IN ({marks}) ORDER BY id",
                part,
            )
            found.extend(map(_queued_record, rows))
        return found

    def _select_append_keys(
        self, stream: str, from_seq: int, to_seq: int
    ) -> list[tuple[str, str, int, int, float]]:
        assert self._reader is not None
        rows = self._reader.execute(
            "SELECT stream, key, first_seq, last_seq, created FROM stream_appends "
            "WHERE stream = ? AND last_seq >= ? AND last_seq <= ?",
            (stream, from_seq, to_seq),
        ).fetchall()
        return cast(list[tuple[str, str, int, int, float]], rows)

    def _submit(self, writer: JournalWriter, op: WriteOp) -> None:
        """Queue C{op}; the writer gets a reactor turn's operations at once."""
        self._outbox.append(op)
        if not self._hand_over_scheduled:
            self._hand_over_scheduled = True
            self._reactor.callLater(0, self._hand_over)

    def _hand_over(self) -> None:
        """Give the writer everything queued since the last hand-over, in order."""
        self._hand_over_scheduled = False
        ops, self._outbox = self._outbox, []
        self._outbox_stores.clear()
        kept: list[WriteOp] = []
        shares = self._backlog_shares
        added = 0
        for op in ops:
            if type(op) is QueuedStore:
                if op.cancelled:
                    op.on_durable(None)
                    continue
                share = _OP_OVERHEAD + sum(map(len, op.record.content))
            elif type(op) is tuple:  # a stream row: its content is one blob
                share = _OP_OVERHEAD + op[6]
            elif type(op) is StreamAppend:
                share = _OP_OVERHEAD * len(op.rows) + op.bytes
            else:
                share = _OP_OVERHEAD
            kept.append(op)
            shares.append(share)
            added += share
        if kept and self._writer is not None:
            self._writer.submit(kept)
            first = self._handed + 1
            self._handed += len(kept)
            self._handed_at.append((self._handed, self._clock.seconds()))
            if self.shipper is not None:
                self.shipper(first, kept)
            self._backlog_bytes += added
            watcher = self._on_backlog
            if watcher and not self._backlog_over and self._backlog_bytes > self._backlog_limit:
                self._backlog_over = True
                watcher(True)
        elif kept:
            for _ in kept:
                shares.pop()

    # Flushing and retention.

    def flush(self) -> Deferred[None]:
        """Fires once everything queued so far has been written (or has failed)."""
        flushed: Deferred[None] = Deferred()
        writer = self._open_writer()
        self._hand_over()
        writer.submit(Barrier(lambda: flushed.callback(None)))
        return flushed

    def prune(self, now: float | None = None) -> Deferred[int]:
        """
        Apply retention as of ``now`` (the reactor's time by default); fires
        with the number of stream records deleted, or fails with JournalError.
        Prunes asked for while one is under way run after it, in turn; the
        timer asks for one every ``prune_interval_s`` unless one is running.
        """
        pruned: Deferred[int] = Deferred()

        def done(outcome: PruneOutcome) -> None:
            if outcome.error is not None:
                pruned.errback(outcome.error)
            else:
                pruned.callback(outcome.deleted)

        at = self._clock.seconds() if now is None else now
        writer = self._open_writer()
        self._hand_over()
        writer.submit(Prune(at, done))
        return pruned

    def _prune_tick(self) -> None:
        if self._pruning or self._writer is None:
            return
        self._pruning = True

        def finished(result: object) -> object:
            self._pruning = False
            if isinstance(result, Failure) and isinstance(result.value, JournalError):
                return None  # already reported through on_error by _prune_done
            return result

        self.prune().addBoth(finished)

    # Reports from the writer thread, run in the reactor thread.

    def _batch_done(self, outcome: BatchOutcome) -> None:
        self._reported += outcome.operations
        handed_at = self._handed_at
        if handed_at:
            self.commit_latencies.append(self._clock.seconds() - handed_at[0][1])
            while handed_at and handed_at[0][0] <= self._reported:
                handed_at.popleft()
        if self._hold and (self._held or self._replica_position < self._reported):
            self._held.append((self._reported, outcome))
            return
        self._finish_batch(outcome)

    def _finish_batch(self, outcome: BatchOutcome) -> None:
        self._pending -= outcome.operations
        self._drain_backlog(outcome.operations)
        for stream, last in outcome.stream_last.items():
            tail = self._tails.get(stream)
            while tail and tail[0][1] <= last:
                tail.popleft()
            if not tail:
                self._tails.pop(stream, None)
        counters = self.counters
        error = outcome.error
        if error is None:
            counters.batches += 1
            counters.records_written += outcome.records
            counters.bytes_written += outcome.bytes
        for on_durable in outcome.callbacks:
            try:
                on_durable(error)
            except Exception:
                _log.failure("on_durable callback failed")
        if outcome.refused or outcome.dropped:
            self._report_records(outcome)
        if error is not None:
            self._report(error)

    def _drain_backlog(self, operations: int) -> None:
        """The writer is done with the next C{operations} operations handed over."""
        shares = self._backlog_shares
        freed = 0
        for _ in range(min(operations, len(shares))):
            freed += shares.popleft()
        self._backlog_bytes -= freed
        if self._backlog_over and self._backlog_bytes <= self._backlog_limit // 2:
            self._backlog_over = False
            assert self._on_backlog is not None
            self._on_backlog(False)

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

    def _prune_done(self, outcome: PruneOutcome) -> None:
        self.counters.pruned += outcome.deleted
        for stream, first in outcome.first_seq.items():
            if first > self._first_seq.get(stream, 1):
                self._first_seq[stream] = first
        if outcome.error is not None:
            self._report(outcome.error)

    def _report(self, error: JournalError) -> None:
        self.counters.errors += 1
        if self.on_error is None:
            _log.error("{error}", error=error)
            return
        try:
            self.on_error(error)
        except Exception:
            _log.failure("journal on_error callback failed")


# Each query names the origin index's condition (origin != ''): SQLite uses
# a partial index only for a query whose WHERE holds that term.
_FIRST_ORIGIN = (
    "SELECT stream, origin FROM stream_messages WHERE origin != '' ORDER BY stream, origin LIMIT 1"
)
_ORIGIN_MARK = (
    "SELECT max(origin_seq) FROM stream_messages WHERE origin != '' AND stream = ? AND origin = ?"
)
# The pair after (stream, origin, its mark). All three columns: a seek past
# (stream, origin) alone steps over each of that pair's entries.
_NEXT_ORIGIN = (
    "SELECT stream, origin FROM stream_messages WHERE origin != '' "
    "AND (stream, origin, origin_seq) > (?, ?, ?) ORDER BY stream, origin, origin_seq LIMIT 1"
)


def _committed_origin_marks(conn: sqlite3.Connection) -> dict[tuple[str, str], int]:
    """
    The highest origin_seq per (stream, origin) committed on ``conn``, in
    one read transaction. It seeks from one pair to the next in the origin
    index, two lookups each: the cost grows with the number of pairs, not
    with the number of forwarded records (a GROUP BY reads every entry).
    """
    marks: dict[tuple[str, str], int] = {}
    conn.execute("BEGIN")
    try:
        pair = conn.execute(_FIRST_ORIGIN).fetchone()
        while pair is not None:
            stream, origin = pair
            (mark,) = conn.execute(_ORIGIN_MARK, (stream, origin)).fetchone()
            marks[stream, origin] = mark
            pair = conn.execute(_NEXT_ORIGIN, (stream, origin, mark)).fetchone()
    finally:
        conn.execute("COMMIT")
    return marks


# A queued record's columns, in the order of QueuedRecord's fields.
_QUEUED_COLUMNS = (
    "id, kind, address, sender, subject, tracker, deadline, created, content,"
    " relay_origin, relay_id"
)


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    """The reader pool's threads (L{ThreadPool.threadFactory}), daemon ones."""
    return threading.Thread(*args, daemon=True, **kwargs)


def _queued_record(row: tuple[Any, ...]) -> QueuedRecord:
    """The queued record a row of L{_QUEUED_COLUMNS} holds."""
    rid, kind, address, sender, subject, tracker, deadline, created, blob, *relay = row
    frames = decode_frames(blob)
    return QueuedRecord(
        rid, kind, address, sender, subject, tracker, deadline, created, frames, *relay
    )


def _merge_tail(
    committed: list[StreamRecord], snapshot: list[StreamRecord], from_seq: int, limit: int
) -> list[StreamRecord]:
    """``committed`` continued with the tail snapshot's later records, up to ``limit``."""
    last = committed[-1].seq if committed else from_seq - 1
    for record in snapshot:
        if len(committed) >= limit:
            break
        if record.seq > last:
            committed.append(record)
    return committed
