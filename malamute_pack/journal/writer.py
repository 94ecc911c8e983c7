"""
The journal's writer thread: the only code that writes to the database.

The reactor thread hands it operations through a queue and never waits.
Group commit: the thread blocks for a first operation, gathers more until
``commit_max_batch`` records are in hand or ``commit_interval_s`` has
passed since the first, and writes them in one transaction, setting
``PRAGMA synchronous`` first to the strongest level any of them needs.
Each batch's outcome (what committed, every ``on_durable`` callback, or the
error) goes back to the reactor in one ``callFromThread``. Every stream
record and letter is written with its checksum
(:mod:`malamute_pack.journal.checksums`), computed here (or by the insert
process), never in the reactor thread. A batch of many
stream records alone (a flood's) is prepared with no loop over its records
in Python and written by the writer's insert process, outside the broker's
GIL (:mod:`malamute_pack.journal.inserts`); the thread waits for its COMMIT
before it reports the batch, as for its own.

A batch that fails is rolled back. If the storage failed (a full disk, an
I/O error: :func:`~malamute_pack.journal.errors.storage_failure`) the whole
batch fails and is reported; so does every write handed over before the
reactor heard of it (up to the L{Resume} the reactor then hands over),
unwritten: a write queued behind a failed one never lands before the
failed one's retry (a peer broker's forwarded records would otherwise be
stored out of their origin's order, and a group would deliver them so).
The thread keeps going with what comes after the L{Resume}.
Otherwise one of its records is to blame (text SQLite cannot take, a
constraint), and the batch is written again with each chunk of rows in a
savepoint, and each row of a chunk that fails in a savepoint of its own:
every record that can be written is, and only a record that cannot be fails
(a letter's ``on_durable`` gets its error; a stream record, which has no
callback, is reported as dropped). The fast path pays nothing for this.

Besides records and letters, the ordered writes carry an address's owner
(L{OwnerClaim}, an upsert of ``address_owners``), an operator's delete of
a stream's records (L{StreamDelete}), and two changes that write nothing
but take their place in the order of writes for a pair's partner: a
retention change (L{RetentionSet}) and a L{PartnerNote} (the clients'
security state after a reload). A claim or a delete is written with
``queue_synchronous``: each is a decision (who owns an address, what an
operator removed), as durable as a letter.

Last-value streams (:mod:`malamute_pack.journal.last_values`): a batch that
holds records of a stream compacted by subject keeps their subjects' last
values in its transaction; a L{CompactSet} (the streams compacted, in the
order of writes, so a pair's partner keeps the same last values) turns
compaction on (rebuilding from the records retained) and off, and a
L{LastValuesMark} starts noting, from its place in the order of writes,
what a snapshot being read needs of the updates that follow it.

It also keeps the ``streams`` and ``journal_counters`` high-water marks in
step (a failed batch's sequence numbers are saved with the next batch that
commits, so they are not handed out again after a restart; a mark that
cannot be written at all is dropped, never retried forever) and runs
retention pruning in bounded steps, one step between write batches.

An unexpected error anywhere else in the thread (outside the statements a
batch, a pruning step or an L{Execute} guards: a bug) does not end it: it
is logged once, critical, with its traceback, and reported once as a
journal error (``on_failure``), and from then on the writer is broken for
good, until the journal is opened again (the broker restarts). Whatever it
had in hand is answered, and so is everything handed to it later: a batch
fails as on a full disk (every ``on_durable`` gets a JournalError whose
reason says the writer failed, and names the error:
:class:`~malamute_pack.journal.errors.WriterFailed`), a L{Barrier} or a
L{LastValuesMark} is let through, an L{Execute} gets the error, a L{Prune}
finishes with nothing deleted (and the error), and a L{Stop} closes the
connection and is answered. Broken for good, rather than failing the one
operation in hand and going on, because after an error nobody foresaw the
thread's own state (the high-water marks owed, the last values of the
transaction, the prunes under way, the connection's transaction and
synchronous level) may no longer match the file, and a later commit would
claim a durability nobody can prove; nothing is written after it, not even
the clean close's mark, so the next open takes the run for a crash
(numbering jumps past what the failed batches took). A reply lost on its
way to the reactor counts as such an error: its batch is answered again as
failed, though it may have committed (told failed, a sender retries; told
durable, it would not). A thread that ends all the same (a BaseException)
answers what it had on its way out, and a submission to a writer whose
thread has ended is answered as a broken writer's, never queued for nobody.

Tests: ``tests/unit/test_journal_journal.py``, ``tests/unit/test_journal_retention.py``,
``tests/unit/test_journal_disk_full.py``, ``tests/unit/test_journal_isolation.py``,
``tests/unit/test_journal_gather.py``, ``tests/unit/test_journal_writer_failure.py``.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Final, TypeAlias, cast

from twisted.logger import Logger

from malamute_pack.journal.checksums import CHECKSUM_ERRORS, letter_checksum, with_checksums
from malamute_pack.journal.config import SYNCHRONOUS_LEVELS, JournalConfig
from malamute_pack.journal.errors import JournalError, WriterFailed, storage_failure
from malamute_pack.journal.inserts import (
    INSERT_STREAM,
    ROWS_PER_INSERT,
    UPSERT_STREAM_STATS,
    InsertProcess,
    InsertProcessLost,
    InsertRefused,
    batch_committed,
    chunk_statement,
    insert_all,
    rows_per_insert,
)
from malamute_pack.journal.last_values import Capture, LastValues, Pending
from malamute_pack.journal.retention import PruneStep, prune_step
from malamute_pack.journal.schema import QUEUED_LAST_ID, RAISE_COUNTER, RUNNING
from malamute_pack.protocol.chunks import encode_frames
from malamute_pack.protocol.records import (
    ConsumerPosition,
    QueuedRecord,
    RetentionPolicy,
    StreamRow,
)

DurableCallback: TypeAlias = Callable[[JournalError | None], None]

_UPSERT_CONSUMER: Final = (
    "INSERT INTO stream_consumers (stream, kind, name, seq, acked, updated, owner)"
    " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, kind, name) DO UPDATE SET"
    " seq = excluded.seq, acked = excluded.acked, updated = excluded.updated,"
    " owner = excluded.owner"
)
_DELETE_CONSUMER: Final = "DELETE FROM stream_consumers WHERE stream = ? AND kind = ? AND name = ?"

# A stream row's (records.StreamRow) stream and content size.
_ROW_STREAM: Final = itemgetter(0)
_ROW_BYTES: Final = itemgetter(6)


@contextlib.contextmanager
def _savepoint(conn: sqlite3.Connection) -> Iterator[None]:
    """
    What the block writes, all or nothing: inside a savepoint, rolled back
    if the block raises (the caller's transaction goes on).
    """
    conn.execute("SAVEPOINT record")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK TO record")
        conn.execute("RELEASE record")
        raise
    conn.execute("RELEASE record")


def _in_savepoint(conn: sqlite3.Connection, sql: str, *rows: tuple[Any, ...]) -> None:
    """Run C{sql} once per row, all or nothing (L{_savepoint})."""
    with _savepoint(conn):
        if len(rows) == 1:
            conn.execute(sql, rows[0])
        else:
            conn.executemany(sql, rows)


def _insert_isolated(
    conn: sqlite3.Connection, single: str, rows: Sequence[tuple[Any, ...]]
) -> list[Exception | None]:
    """
    Insert every row of C{rows} that can be inserted by itself with
    C{single} (in the caller's transaction); per row, None or what stopped
    it. A chunk of rows goes in one statement; only a chunk that fails is
    tried again row by row. Raises what L{storage_failure} says is the
    storage's failure.
    """
    failed: list[Exception | None] = [None] * len(rows)
    for start in range(0, len(rows), ROWS_PER_INSERT):
        chunk = rows[start : start + ROWS_PER_INSERT]
        try:
            _in_savepoint(conn, chunk_statement(single, len(chunk)), tuple(chain(*chunk)))
            continue
        except Exception as exc:
            if storage_failure(exc):
                raise
        for offset, row in enumerate(chunk):
            try:
                _in_savepoint(conn, single, row)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                failed[start + offset] = exc
    return failed


_INSERT_QUEUED: Final = (
    "INSERT INTO queued_messages "
    "(id, kind, address, sender, subject, tracker, deadline, created, content,"
    " relay_origin, relay_id, checksum) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_DELETE_QUEUED: Final = "DELETE FROM queued_messages WHERE id = ?"
_INSERT_APPEND_KEY: Final = (
    "INSERT INTO stream_appends (stream, key, first_seq, last_seq, created) VALUES (?, ?, ?, ?, ?)"
)
_APPEND_KEY_NUMBERS: Final = (
    "SELECT first_seq, last_seq FROM stream_appends WHERE stream = ? AND key = ?"
)
_RANGE: Final = "FROM stream_messages WHERE stream = ? AND seq BETWEEN ? AND ?"
_COUNT_RANGE: Final = f"SELECT count(*), coalesce(sum(bytes), 0) {_RANGE}"
_DELETE_RANGE: Final = f"DELETE {_RANGE}"
_DELETE_APPEND_KEY: Final = "DELETE FROM stream_appends WHERE stream = ? AND key = ?"
SET_COUNTER: Final = (
    "INSERT INTO journal_counters (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
UPSERT_OWNER: Final = (
    "INSERT INTO address_owners (address, user, claimed) VALUES (?, ?, ?) "
    "ON CONFLICT (address) DO UPDATE SET user = excluded.user, claimed = excluded.claimed"
)
_DELETED: Final = "FROM stream_messages WHERE stream = ? AND seq <= ?"
_COUNT_DELETED: Final = f"SELECT count(*), coalesce(sum(bytes), 0) {_DELETED}"
_DELETE_RECORDS: Final = f"DELETE {_DELETED}"
_LESS_TOTALS: Final = (
    "UPDATE streams SET message_count = max(0, message_count - ?),"
    " total_bytes = max(0, total_bytes - ?) WHERE stream = ?"
)


def _letter_checksum(letter: tuple[Any, ...]) -> int | None:
    """
    A letter row's checksum; None for a row whose values are not a letter's
    types (SQLite refuses it alone, with its own reason).
    """
    try:
        return letter_checksum(letter)
    except CHECKSUM_ERRORS:
        return None


def _delete_records(conn: sqlite3.Connection, delete: StreamDelete) -> None:
    """A stream's records up to C{delete.through}, off its totals; what went, on C{delete}."""
    count, size = conn.execute(_COUNT_DELETED, (delete.stream, delete.through)).fetchone()
    if count:
        conn.execute(_DELETE_RECORDS, (delete.stream, delete.through))
        conn.execute(_LESS_TOTALS, (count, size, delete.stream))
    delete.deleted, delete.freed = int(count), int(size)


def _written(
    rows: Sequence[StreamRow | None], appends: Sequence[StreamAppend | None]
) -> Iterator[StreamRow]:
    """The stream records of ``rows`` and ``appends`` that were written (not None)."""
    return chain(
        (row for row in rows if row is not None),
        chain.from_iterable(append.rows for append in appends if append is not None),
    )


def _drop_earlier_copy(conn: sqlite3.Connection, key: tuple[str, str, int, int, float]) -> None:
    """
    A pair's passive has C{key} already at other numbers (see
    L{StreamAppend.follows}): that copy's records and key go, off the totals.
    """
    stream, name, first, last, _ = key
    found = conn.execute(_APPEND_KEY_NUMBERS, (stream, name)).fetchone()
    if found is None or tuple(found) == (first, last):
        return
    count, size = conn.execute(_COUNT_RANGE, (stream, *found)).fetchone()
    if count:
        conn.execute(_DELETE_RANGE, (stream, *found))
        conn.execute(_LESS_TOTALS, (count, size, stream))
    conn.execute(_DELETE_APPEND_KEY, (stream, name))


def _write_append(conn: sqlite3.Connection, append: StreamAppend, most: int) -> None:
    """
    An append's records (C{most} rows per INSERT at most, L{insert_all}),
    its key, and the keys it makes the journal forget.
    """
    if append.follows:
        _drop_earlier_copy(conn, append.key)
    insert_all(conn, INSERT_STREAM, with_checksums(append.rows), most)
    conn.execute(_INSERT_APPEND_KEY, append.key)
    if append.forget:
        conn.executemany(_DELETE_APPEND_KEY, append.forget)


@dataclass(slots=True)
class QueuedStore:
    """Write ``record``; tell ``on_durable`` once its batch commits or fails."""

    record: QueuedRecord
    on_durable: DurableCallback
    cancelled: bool = False  # removed before it reached the writer


@dataclass(slots=True)
class StreamAppend:
    """
    Write ``rows`` (stream records) and remember ``key`` for them, all in
    one transaction (never split across batches), forgetting the keys in
    ``forget`` (stream, key); tell ``on_durable`` once that commits or fails.
    """

    rows: list[StreamRow]
    key: tuple[str, str, int, int, float]  # stream, key, first seq, last seq, created
    forget: list[tuple[str, str]]
    on_durable: DurableCallback
    bytes: int
    # A pair's passive applying its active's append: the active's key wins
    # over a copy of it here at other numbers, which is of a write the
    # active shipped and then failed to make itself (its full disk), so its
    # writer wrote the key again: that copy's records go (the active never
    # had them, and never acknowledged them).
    follows: bool = False


@dataclass(slots=True)
class QueuedRemove:
    """Delete the queued record ``record_id``."""

    record_id: int


@dataclass(slots=True)
class OwnerClaim:
    """Record that ``user`` owns ``address`` since ``claimed`` (replacing another owner)."""

    address: str
    user: str
    claimed: float


@dataclass(slots=True)
class ConsumerSave:
    """
    Save a consumer's ``position`` (``forget``: delete it); ``on_durable``
    (if any) once that commits or fails.
    """

    position: ConsumerPosition
    forget: bool = False
    on_durable: DurableCallback | None = None


def _write_consumer(conn: sqlite3.Connection, op: ConsumerSave) -> None:
    p = op.position
    if op.forget:
        conn.execute(_DELETE_CONSUMER, (p.stream, p.kind, p.name))
    else:
        conn.execute(
            _UPSERT_CONSUMER, (p.stream, p.kind, p.name, p.seq, p.acked, p.updated, p.owner)
        )


@dataclass(slots=True)
class StreamDelete:
    """
    Delete the records of ``stream`` up to ``through`` (an operator's
    delete) and take them off its totals; ``on_durable`` (if any) once that
    commits or fails, ``deleted`` and ``freed`` (records and content bytes
    deleted) set by then.
    """

    stream: str
    through: int
    on_durable: DurableCallback | None = None
    deleted: int = 0
    freed: int = 0


@dataclass(slots=True)
class RetentionSet:
    """
    An operator's retention change (the default ``retention`` and
    ``per_stream``): nothing is written (it lasts until the broker
    restarts), but it takes its place in the order of writes, so that a
    pair's partner prunes by it too.
    """

    retention: RetentionPolicy
    per_stream: dict[str, RetentionPolicy]


@dataclass(slots=True)
class CompactSet:
    """
    Compact exactly ``streams`` by subject from here on (last-value
    streams): a stream turned on gets its last values from its retained
    records, every one of them with ``rebuild`` (a pair's partner catching
    up); one turned off loses them. ``on_durable`` (if any) once that
    commits or fails.
    """

    streams: frozenset[str]
    rebuild: bool = False
    on_durable: DurableCallback | None = None


@dataclass(slots=True)
class PartnerNote:
    """
    Nothing to write: a change for a pair's partner alone (the clients'
    security state after a reload), in its place in the order of writes.
    ``change`` is opaque to the journal.
    """

    change: object


@dataclass(slots=True)
class Prune:
    """Apply retention as of ``now``; ``done`` gets the total once every step ran."""

    now: float
    done: Callable[[PruneOutcome], None]


@dataclass(slots=True)
class Barrier:
    """Call ``done`` once every operation queued before this one has been written."""

    done: Callable[[], None]


@dataclass(slots=True)
class Execute:
    """
    Once every operation queued before this one is written, run
    ``statements`` (SQL, parameters) and then ``queries`` in one
    transaction; ``done`` gets None and each query's rows, or the error
    (nothing of it written). Used where the order of changes matters
    beyond what a batch keeps: a replica's truncation before the records
    that follow it, a snapshot at an exact point of the writes.
    """

    statements: list[tuple[str, tuple[Any, ...]]]
    queries: list[tuple[str, tuple[Any, ...]]]
    done: Callable[[JournalError | None, list[list[tuple[Any, ...]]]], None]


@dataclass(slots=True)
class Resume:
    """
    The reactor heard that a batch failed: the writes handed over after
    this one are written again (those before it fail unwritten, as the
    failed batch did).
    """


@dataclass(slots=True)
class Stop:
    """Write everything queued before this, close the connection, call ``done``."""

    done: Callable[[], None]


# A stream message is queued as the row the writer inserts (records.StreamRow).
WriteOp: TypeAlias = (
    StreamRow
    | QueuedStore
    | QueuedRemove
    | StreamAppend
    | OwnerClaim
    | ConsumerSave
    | StreamDelete
    | RetentionSet
    | CompactSet
    | PartnerNote
)


@dataclass(slots=True)
class LastValuesMark:
    """
    From here in the order of writes (every write before it written),
    note for ``capture`` the updates of its stream's last values; then
    call ``done``.
    """

    capture: Capture
    done: Callable[[], None]


Control: TypeAlias = Prune | Barrier | Execute | LastValuesMark | Resume | Stop
Operation: TypeAlias = WriteOp | Control
# What the writer's queue carries: one operation, or a reactor turn's writes.
Submission: TypeAlias = Operation | list[WriteOp]

_log = Logger()


@dataclass(frozen=True, slots=True)
class Dropped:
    """A stream record that could not be written, and why."""

    stream: str
    seq: int
    error: JournalError


@dataclass(slots=True)
class BatchOutcome:
    """
    One batch as the reactor needs to hear of it: ``callbacks`` get
    ``error`` (None when the batch committed); ``refused`` are the letters
    that alone could not be written, each with its own error, and
    ``dropped`` the stream records.
    """

    operations: int
    records: int
    bytes: int
    stream_last: dict[str, int]
    callbacks: list[DurableCallback]
    error: JournalError | None
    refused: list[tuple[DurableCallback, JournalError]] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)


@dataclass(slots=True)
class _Prepared:
    """
    A batch's rows, ready to insert: ``callbacks[i]`` is ``queued_rows[i]``'s;
    ``stream_stats`` per stream is [last seq, records, bytes].
    """

    operations: int
    stream_rows: list[StreamRow]
    stream_stats: dict[str, list[int]]
    queued_rows: list[tuple[Any, ...]]
    callbacks: list[DurableCallback]
    removed: list[tuple[int]]
    level: int
    bytes: int
    refused: list[tuple[DurableCallback, JournalError]]
    appends: list[StreamAppend] = field(default_factory=list)
    claims: list[tuple[str, str, float]] = field(default_factory=list)
    deletes: list[StreamDelete] = field(default_factory=list)
    consumers: list[ConsumerSave] = field(default_factory=list)
    # Each change of the compacted streams, with how many of the rows and
    # appends came before it.
    compactions: list[tuple[CompactSet, int, int]] = field(default_factory=list)
    # What the transaction changes of the last-value streams.
    kept: Pending = field(default_factory=Pending)


@dataclass(slots=True)
class PruneOutcome:
    """One pruning step; ``finished`` on the last step of a prune."""

    deleted: int
    first_seq: dict[str, int]
    finished: bool
    error: JournalError | None = None


@dataclass(slots=True)
class _PruneJob:
    request: Prune
    resume_from: str = ""
    deleted: int = 0
    first_seq: dict[str, int] = field(default_factory=dict)


# A count of operations no submission reaches: nobody is to be woken.
_NEVER: Final = 1 << 62


class JournalWriter:
    """
    The writer thread over ``conn`` (opened with ``isolation_level=None``
    and ``check_same_thread=False``; this thread is its only user once
    started). ``call_from_thread`` is the reactor's; ``on_batch``,
    ``on_prune`` and ``on_failure`` (told once if the writer breaks on an
    unexpected error) are called through it, in the reactor thread.
    ``failure`` is that error, as a JournalError, once the writer broke.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        config: JournalConfig,
        call_from_thread: Callable[..., Any],
        on_batch: Callable[[BatchOutcome], None],
        on_prune: Callable[[PruneOutcome], None],
        on_failure: Callable[[JournalError], None] | None = None,
    ) -> None:
        self._conn = conn
        self._path = path
        # Read at each commit and pruning step: an operator's retention
        # change (Journal.set_retention) is a new config set from the reactor.
        self.config = config
        self._call_from_thread = call_from_thread
        self._on_batch = on_batch
        self._on_prune = on_prune
        self._on_failure = on_failure
        # Set by the thread when it breaks (or ends): why it writes no more.
        self.failure: JournalError | None = None
        self._cause: WriterFailed | None = None
        # What the thread has taken and not answered yet: a batch, a
        # control operation (answered by a broken writer, L{_break}).
        self._in_hand: list[WriteOp] | None = None
        self._control_in_hand: Control | None = None
        # Set by the thread as it ends: a submission from then on is answered
        # by the submitting thread (L{submit}), in order under the lock.
        self._ended = False
        self._drain_lock = threading.Lock()
        self._queue: queue.SimpleQueue[Submission] = queue.SimpleQueue()
        # While a batch gathers, the thread dozes on this instead of the
        # queue: a submission wakes it only for a control operation or once
        # the operations submitted (counted by the submitting thread) reach
        # C{_wake_at}, set by this thread (which counts those it took) to
        # what fills the batch in hand.
        self._wake = threading.Event()
        self._submitted = 0
        self._taken = 0
        self._wake_at = _NEVER
        # Write operations the last batch had no room for.
        self._backlog: list[WriteOp] = []
        # The error of a batch that failed, until the reactor's L{Resume}:
        # what is handed over meanwhile fails with it, unwritten.
        self._unheard: JournalError | None = None
        self._stream_level = SYNCHRONOUS_LEVELS.index(config.stream_synchronous)
        # Rows per INSERT: a full batch's in one statement (L{insert_all}).
        self._stream_chunk = rows_per_insert(conn, INSERT_STREAM, config.commit_max_batch)
        self._queued_chunk = rows_per_insert(conn, _INSERT_QUEUED, config.commit_max_batch)
        # Batches of this many stream records or more go to the insert process.
        self._insert_process_rows = config.insert_process_rows
        self._inserts = (
            InsertProcess(path, self._stream_chunk) if config.insert_process_rows > 0 else None
        )
        self._queue_level = SYNCHRONOUS_LEVELS.index(config.queue_synchronous)
        self._synchronous: int | None = None
        # High-water marks assigned but not yet saved (their batch failed).
        self._unsaved_stream_last: dict[str, int] = {}
        self._unsaved_queued_last = 0
        # Prunes in arrival order; the first is under way.
        self._prune_jobs: deque[_PruneJob] = deque()
        # The last-value streams, as the file holds them (read here, before
        # the thread starts: nothing else uses the connection yet).
        self.last_values = LastValues(config.last_value_subjects)
        self.last_values.load(conn)
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the thread runs (started, and not ended)."""
        return self._thread.is_alive() and not self._ended

    def submit(self, item: Submission) -> None:
        """
        Give the thread a reactor turn's write operations (a list) or a
        control operation. A thread idle on the queue wakes at once; one
        gathering a batch is woken only by a control operation or once a
        full batch waits, and otherwise takes what came when its commit
        interval ends: under a steady flow of small turns it wakes once a
        batch, not once a turn (each wake-up costs both threads a switch).
        A thread that has ended takes nothing: ``item`` is answered here
        at once, as a broken writer answers (L{_refuse}), its callbacks
        run in the reactor thread.
        """
        self._queue.put(item)
        if self._ended:  # read after the put: an ending thread's drain saw it, else this one
            self._drain()
            return
        if type(item) is list:
            self._submitted += len(item)
            if self._submitted < self._wake_at:
                return
        self._wake.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _take(self, block: bool = True) -> list[WriteOp] | Control:
        """
        The next submission, whole: write operations (what the last batch
        left over first, then a reactor turn's list at once, never taken
        one by one) or a control operation.
        """
        if self._backlog:
            ops, self._backlog = self._backlog, []
            return ops
        item = self._queue.get(block)
        if isinstance(item, list):
            self._taken += len(item)
            return item
        if isinstance(item, Prune | Barrier | Execute | LastValuesMark | Resume | Stop):
            return item
        return [item]

    def _run(self) -> None:
        """
        Serve until a Stop; an unexpected error breaks the writer
        (L{_break}), which serves on broken (L{_serve_broken}). However the
        thread ends, what it had and what is handed to it later is answered.
        """
        try:
            while True:
                try:
                    if self._cause is None:
                        self._serve()
                    else:
                        self._serve_broken()
                    return
                except Exception as exc:
                    if self._break(exc):
                        return
        except BaseException as exc:  # the thread ends all the same: answer what it had
            self._break(exc)
        finally:
            if self._cause is None:  # stopped: whatever comes later finds it stopped
                self._cause = WriterFailed(None)
            self._ended = True
            self._drain()

    def _serve(self) -> None:
        """Write what is handed over, a batch at a time (group commit), until a Stop."""
        take = self._take
        wake = self._wake
        interval = self.config.commit_interval_s
        max_batch = self.config.commit_max_batch
        while True:
            if self._prune_jobs:
                # One pruning step between write batches: neither starves the other.
                self._prune_step(self._prune_jobs[0])
                try:
                    item = take(block=False)
                except queue.Empty:
                    continue
            else:
                item = take()
            control: Control | None = None
            if not isinstance(item, list):
                control = self._control_in_hand = item
            elif self._unheard is not None:
                # Handed over before the reactor heard that a batch failed.
                self._in_hand = item
                self._call_from_thread(self._on_batch, self._failed_after(item, self._unheard))
                self._in_hand = None
            else:
                self._in_hand = item
                # The reactor's list: its shipper reads it too.
                batch = self._in_hand = item.copy()
                deadline = time.monotonic() + interval
                while len(batch) < max_batch:
                    try:
                        item = take(block=False)
                    except queue.Empty:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        # A wake-up after this clear is kept; one before
                        # it came with items the emptiness check sees.
                        wake.clear()
                        self._wake_at = self._taken + max_batch - len(batch)
                        if self._queue.empty():
                            wake.wait(remaining)
                        self._wake_at = _NEVER
                        continue
                    if not isinstance(item, list):
                        control = self._control_in_hand = item
                        break
                    batch += item
                if len(batch) > max_batch:
                    # The rest starts the next batch, before anything newer.
                    self._backlog = batch[max_batch:]
                    del batch[max_batch:]
                outcome = self._write(batch)
                if outcome.error is not None:
                    self._unheard = outcome.error
                self._call_from_thread(self._on_batch, outcome)
                self._in_hand = None
            if control is not None:
                stop = self._control(control)
                self._control_in_hand = None
                if stop:
                    return

    def _serve_broken(self) -> None:
        """Answer everything handed over as a broken writer does, until a Stop."""
        while True:
            if self._answer(self._take()):
                return

    def _break(self, exc: BaseException) -> bool:
        """
        The thread met ``exc``, which nothing expected (call it while
        handling it: its traceback is logged): from now on the writer
        writes nothing. Log it (critical) and report it (``on_failure``) the
        first time; roll back whatever transaction is open, stop the insert
        process, and answer what the thread had in hand and the prunes under
        way. Whether a Stop was among them (it is answered: the thread ends).
        """
        if self._cause is None:
            cause = self._cause = WriterFailed(exc)
            failure = JournalError(f"journal {self._path}: {cause}")
            failure.reason = cause.reason
            failure.__cause__ = cause
            self.failure = failure
            _log.failure(
                "journal {path}: its writer thread failed on an unexpected error (a bug);"
                " every write fails from now on, until the journal is opened again",
                path=str(self._path),
            )
            if self._on_failure is not None:
                with self._logged("reporting its failure"):
                    self._call_from_thread(self._on_failure, failure)
        else:
            _log.failure("journal {path}: its broken writer failed again", path=str(self._path))
        self._wake_at = _NEVER
        with self._logged("rolling back"), contextlib.suppress(sqlite3.ProgrammingError):
            self._rollback()  # (a connection closed already has nothing to roll back)
        inserts, self._inserts = self._inserts, None
        if inserts is not None:
            with self._logged("stopping its insert process"):
                inserts.stop()
        batch, self._in_hand = self._in_hand, None
        control, self._control_in_hand = self._control_in_hand, None
        if batch is not None:
            self._answer(batch)
        while self._prune_jobs:
            job = self._prune_jobs.popleft()
            error = JournalError.wrap(self._cause, self._path, "pruning streams")
            with self._logged("answering a prune"):
                outcome = PruneOutcome(job.deleted, job.first_seq, finished=True, error=error)
                self._call_from_thread(job.request.done, outcome)
        return control is not None and self._answer(control)

    def _answer(self, item: list[WriteOp] | Control) -> bool:
        """L{_refuse} ``item``, logging an error that stops it; whether it is a Stop."""
        with self._logged("answering what was handed to it"):
            return self._refuse(item)
        return isinstance(item, Stop)

    def _refuse(self, item: list[WriteOp] | Control) -> bool:
        """
        Answer ``item`` as a writer that writes no more: a batch fails
        (L{_failed}: as a full disk fails it), a barrier or a last-values
        mark is let through, statements fail, a prune finishes with nothing
        deleted and the error, a Stop closes the connection (leaving the
        journal marked as running: its next open takes the run for a crash)
        and is answered. Whether it is a Stop.
        """
        cause = self._cause
        assert cause is not None
        call = self._call_from_thread
        if isinstance(item, list):
            call(self._on_batch, self._failed(item, cause))
        elif isinstance(item, Barrier | LastValuesMark):
            call(item.done)
        elif isinstance(item, Execute):
            call(item.done, JournalError.wrap(cause, self._path, "running statements"), [])
        elif isinstance(item, Prune):
            error = JournalError.wrap(cause, self._path, "pruning streams")
            call(item.done, PruneOutcome(0, {}, finished=True, error=error))
        elif isinstance(item, Resume):
            pass
        else:
            with self._logged("closing its connection"):
                self._conn.close()
            call(item.done)
            return True
        return False

    def _drain(self) -> None:
        """
        Answer everything handed over to a thread that has ended, in the
        order it was handed over (L{_refuse}); from any thread.
        """
        with self._drain_lock:
            while True:
                try:
                    item = self._take(block=False)
                except queue.Empty:
                    return
                self._answer(item)

    @contextlib.contextmanager
    def _logged(self, doing: str) -> Iterator[None]:
        """Log what the block raises (while ``doing``), and go on."""
        try:
            yield
        except Exception:
            _log.failure("journal {path}: {doing} failed", path=str(self._path), doing=doing)

    def _control(self, op: Control) -> bool:
        """Act on a control operation; True when the thread must end."""
        if isinstance(op, Prune):
            self._prune_jobs.append(_PruneJob(op))
            return False
        if isinstance(op, Barrier):
            self._call_from_thread(op.done)
            return False
        if isinstance(op, Execute):
            self._execute(op)
            return False
        if isinstance(op, LastValuesMark):
            self.last_values.captures.append(op.capture)
            self._call_from_thread(op.done)
            return False
        if isinstance(op, Resume):
            self._unheard = None
            return False
        inserts, self._inserts = self._inserts, None
        if inserts is not None:
            inserts.stop()
        # Prunes still under way stop where they are: retention is not durability.
        while self._prune_jobs:
            job = self._prune_jobs.popleft()
            outcome = PruneOutcome(job.deleted, job.first_seq, finished=True)
            self._call_from_thread(job.request.done, outcome)
        try:
            self._close_cleanly()
        except Exception as e:  # a stream name SQLite cannot take, too: never stuck here
            _log.warn("could not mark the journal closed cleanly: {error}", error=e)
        self._conn.close()
        self._call_from_thread(op.done)
        return True

    def _close_cleanly(self) -> None:
        """
        Mark the journal closed cleanly, in one transaction with the
        high-water marks still owed (stream numbers and letter ids given
        to records a failed batch did not write, with no commit since):
        opened again, it gives none of them again. If that cannot be
        written, the journal stays marked running, and its next open jumps
        past them as after a crash.
        """
        conn = self._conn
        self._rollback()
        if not (self._unsaved_stream_last or self._unsaved_queued_last):
            conn.execute(SET_COUNTER, (RUNNING, 0))
            return
        conn.execute("BEGIN")
        try:
            for stream, last in self._unsaved_stream_last.items():
                conn.execute(UPSERT_STREAM_STATS, (stream, last, 0, 0))
            if self._unsaved_queued_last:
                conn.execute(RAISE_COUNTER, (QUEUED_LAST_ID, self._unsaved_queued_last))
            conn.execute(SET_COUNTER, (RUNNING, 0))
            conn.execute("COMMIT")
        except BaseException:
            self._rollback()
            raise

    def _execute(self, op: Execute) -> None:
        results: list[list[tuple[Any, ...]]] = []
        try:
            self._set_synchronous(self._queue_level)
            self._conn.execute("BEGIN")
            for sql, parameters in op.statements:
                self._conn.execute(sql, parameters)
            for sql, parameters in op.queries:
                results.append(self._conn.execute(sql, parameters).fetchall())
            self._conn.execute("COMMIT")
        except Exception as exc:
            self._rollback()
            error = JournalError.wrap(exc, self._path, "running statements")
            self._call_from_thread(op.done, error, [])
            return
        if op.statements:  # they may have removed records below retention's floors
            self.last_values.forget_floors()
        self._call_from_thread(op.done, None, results)

    def _set_synchronous(self, level: int) -> None:
        # Outside any transaction: SQLite ignores the pragma inside one.
        if level != self._synchronous:
            self._conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS_LEVELS[level]}")
            self._synchronous = level

    def _write(self, batch: list[WriteOp]) -> BatchOutcome:
        try:
            prepared = self._prepare(batch)
            try:
                return self._commit(prepared)
            except Exception as exc:
                self._rollback()
                if storage_failure(exc):
                    raise
                return self._commit_isolated(prepared)
        except Exception as exc:  # a bug as much as a full disk must not end the thread
            self._rollback()
            return self._failed(batch, exc)

    def _prepare(self, batch: list[WriteOp]) -> _Prepared:
        """The rows of ``batch``; notes its high-water marks as unsaved."""
        if set(map(type, batch)) == {tuple}:
            prepared = self._prepare_stream(cast(list[StreamRow], batch))
            if prepared is not None:
                return prepared
        stream_rows: list[StreamRow] = []
        stream_stats: dict[str, list[int]] = {}  # stream -> [last seq, count, bytes]
        queued_rows: list[tuple[Any, ...]] = []
        removed: list[tuple[int]] = []
        callbacks: list[DurableCallback] = []
        refused: list[tuple[DurableCallback, JournalError]] = []
        appends: list[StreamAppend] = []
        claims: list[tuple[str, str, float]] = []
        deletes: list[StreamDelete] = []
        consumers: list[ConsumerSave] = []
        compactions: list[tuple[CompactSet, int, int]] = []
        level = -1
        written_bytes = 0
        for op in batch:
            if type(op) is StreamAppend:
                appends.append(op)
                for row in op.rows:
                    counts = stream_stats.setdefault(row[0], [row[1], 0, 0])
                    counts[0] = row[1]
                    counts[1] += 1
                    counts[2] += row[6]
                written_bytes += op.bytes
                # Acknowledged as durable: as strong as a letter.
                level = max(level, self._queue_level)
                continue
            if type(op) is tuple:
                stream_rows.append(op)
                size = op[6]
                stats = stream_stats.get(op[0])
                if stats is None:
                    stream_stats[op[0]] = [op[1], 1, size]
                else:
                    stats[0] = op[1]
                    stats[1] += 1
                    stats[2] += size
                written_bytes += size
                level = max(level, self._stream_level)
            elif type(op) is QueuedStore:
                r = op.record
                self._unsaved_queued_last = max(self._unsaved_queued_last, r.id)
                try:
                    blob = encode_frames(r.content)
                    letter = (
                        r.id,
                        r.kind,
                        r.address,
                        r.sender,
                        r.subject,
                        r.tracker,
                        r.deadline,
                        r.created,
                        blob,
                        r.relay_origin,
                        r.relay_id,
                    )
                    checksum = _letter_checksum(letter)
                except ValueError as exc:  # a frame too large to store
                    refused.append((op.on_durable, self._refused(exc, r.id, r.kind, r.address)))
                    continue
                queued_rows.append((*letter, checksum))
                callbacks.append(op.on_durable)
                written_bytes += len(blob)
                level = max(level, self._queue_level)
            elif type(op) is QueuedRemove:
                removed.append((op.record_id,))
                level = max(level, self._queue_level)
            elif type(op) is OwnerClaim:
                claims.append((op.address, op.user, op.claimed))
                level = max(level, self._queue_level)
            elif type(op) is StreamDelete:
                deletes.append(op)
                level = max(level, self._queue_level)
            elif type(op) is ConsumerSave:
                # As durable as the stream records it points into, no more.
                consumers.append(op)
                level = max(level, self._stream_level)
            elif type(op) is CompactSet:
                compactions.append((op, len(stream_rows), len(appends)))
                level = max(level, self._queue_level)
            # RetentionSet, PartnerNote: nothing to write.
        for stream, (last, _, _) in stream_stats.items():
            self._unsaved_stream_last[stream] = last
        if level < 0:  # nothing written: keep whatever level is set
            level = self._stream_level if self._synchronous is None else self._synchronous
        return _Prepared(
            len(batch),
            stream_rows,
            stream_stats,
            queued_rows,
            callbacks,
            removed,
            level,
            written_bytes,
            refused,
            appends,
            claims,
            deletes,
            consumers,
            compactions,
        )

    def _prepare_stream(self, rows: list[StreamRow]) -> _Prepared | None:
        """
        A batch of records of one stream alone (a flood's), prepared with
        no loop over its rows in Python (each C{map} is one pass of C, and
        reads the rows alone, not their numbers); None for records of
        several streams, which L{_prepare} takes one by one. Notes the
        stream's high-water mark as unsaved.
        """
        streams = set(map(_ROW_STREAM, rows))
        if len(streams) != 1:
            return None
        (stream,) = streams
        last = rows[-1][1]
        size = sum(map(_ROW_BYTES, rows))
        self._unsaved_stream_last[stream] = last
        return _Prepared(
            len(rows),
            rows,
            {stream: [last, len(rows), size]},
            [],
            [],
            [],
            self._stream_level,
            size,
            [],
        )

    def _commit(self, p: _Prepared) -> BatchOutcome:
        """
        Write ``p`` in one transaction, in the insert process if it is a
        batch for it, else here; raises if anything fails.
        """
        # Streams whose last records failed earlier get their high-water mark saved now.
        stats_rows = [
            (stream, last, *p.stream_stats.get(stream, (0, 0, 0))[1:])
            for stream, last in self._unsaved_stream_last.items()
        ]
        if not self._insert_elsewhere(p, stats_rows):
            self._commit_here(p, stats_rows)
        return BatchOutcome(
            operations=p.operations,
            records=len(p.stream_rows)
            + len(p.queued_rows)
            + sum(len(append.rows) for append in p.appends),
            bytes=p.bytes,
            stream_last={stream: stats[0] for stream, stats in p.stream_stats.items()},
            callbacks=p.callbacks
            + [append.on_durable for append in p.appends]
            + [d.on_durable for d in p.deletes if d.on_durable is not None]
            + [c.on_durable for c in p.consumers if c.on_durable is not None]
            + [c.on_durable for c, _, _ in p.compactions if c.on_durable is not None],
            error=None,
            refused=p.refused,
        )

    def _insert_elsewhere(self, p: _Prepared, stats_rows: list[tuple[Any, ...]]) -> bool:
        """
        Have the insert process write ``p`` (with ``stats_rows``) if it is a
        batch for it: stream records alone, ``insert_process_rows`` of them
        or more, none of a last-value stream, no letter id mark owed; whether
        it did. A batch the process did not write (L{InsertRefused}: the
        error it met there is met again here) is written here; so is one
        whose process was lost on the way, unless it had committed there
        (the process is not used again: that is logged).
        """
        inserts = self._inserts
        if (
            inserts is None
            or len(p.stream_rows) < self._insert_process_rows
            or p.operations != len(p.stream_rows)
            or self._unsaved_queued_last
            or self.last_values.involved(p.stream_stats)
        ):
            return False
        try:
            inserts.insert(p.stream_rows, stats_rows, SYNCHRONOUS_LEVELS[p.level])
        except InsertRefused:
            return False
        except InsertProcessLost as e:
            self._inserts = None
            _log.warn(
                "journal {path}: {error}; its writer thread writes every batch from now on",
                path=str(self._path),
                error=e,
            )
            if not (e.in_doubt and batch_committed(self._conn, p.stream_rows)):
                return False
        self._committed(p)
        return True

    def _commit_here(self, p: _Prepared, stats_rows: list[tuple[Any, ...]]) -> None:
        """Write ``p`` (with ``stats_rows``) in one transaction on this thread's connection."""
        conn = self._conn
        self._set_synchronous(p.level)
        conn.execute("BEGIN")
        if p.stream_rows:
            insert_all(conn, INSERT_STREAM, with_checksums(p.stream_rows), self._stream_chunk)
        if stats_rows:
            conn.executemany(UPSERT_STREAM_STATS, stats_rows)
        if p.queued_rows:
            insert_all(conn, _INSERT_QUEUED, p.queued_rows, self._queued_chunk)
        for append in p.appends:
            _write_append(conn, append, self._stream_chunk)
        if p.claims:
            conn.executemany(UPSERT_OWNER, p.claims)
        for consumer in p.consumers:
            _write_consumer(conn, consumer)
        last_values = self.last_values

        def change(op: CompactSet, upto: dict[str, int]) -> None:
            last_values.change(conn, op.streams, op.rebuild, p.kept, upto)

        self._keep_last_values(p, p.stream_rows, p.appends, change)
        # After every record of the batch: a delete covers those before it.
        for delete in p.deletes:
            _delete_records(conn, delete)
            last_values.deleted(conn, delete.stream, delete.through, p.kept)
        self._finish(p)

    def _commit_isolated(self, p: _Prepared) -> BatchOutcome:
        """
        Write ``p`` again, in one transaction, leaving out every record that
        cannot be written by itself; raises if the storage fails.
        """
        conn = self._conn
        p.kept = Pending()  # the first try's changes were rolled back
        self._set_synchronous(p.level)
        conn.execute("BEGIN")
        bad_streams = _insert_isolated(conn, INSERT_STREAM, with_checksums(p.stream_rows))
        bad_queued = _insert_isolated(conn, _INSERT_QUEUED, p.queued_rows)
        dropped: list[Dropped] = []
        written_stats: dict[str, list[int]] = {}  # stream -> [records, bytes] written
        for row, problem in zip(p.stream_rows, bad_streams, strict=True):
            if problem is None:
                counts = written_stats.setdefault(row[0], [0, 0])
                counts[0] += 1
                counts[1] += row[6]
            else:
                what = f"stream {row[0]!r} record {row[1]}"
                dropped.append(
                    Dropped(row[0], row[1], JournalError.refused(problem, self._path, what))
                )
        refused = list(p.refused)
        appended: list[DurableCallback] = []
        # The stream records and appends written (None: not), for their last values.
        written_rows = [
            row if problem is None else None
            for row, problem in zip(p.stream_rows, bad_streams, strict=True)
        ]
        written_appends: list[StreamAppend | None] = []
        for append in p.appends:
            try:
                with _savepoint(conn):  # all of an append or none of it
                    _write_append(conn, append, self._stream_chunk)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                stream, key = append.key[:2]
                what = f"stream {stream!r} append {key!r}"
                refused.append((append.on_durable, JournalError.refused(exc, self._path, what)))
                written_appends.append(None)
                continue
            appended.append(append.on_durable)
            counts = written_stats.setdefault(append.key[0], [0, 0])
            counts[0] += len(append.rows)
            counts[1] += append.bytes
            written_appends.append(append)
        for stream, last in self._unsaved_stream_last.items():
            count, size = written_stats.get(stream, (0, 0))
            try:
                _in_savepoint(conn, UPSERT_STREAM_STATS, (stream, last, count, size))
            except Exception as exc:
                if storage_failure(exc):
                    raise
                # A stream name SQLite cannot take: its records were dropped
                # above; its mark is not kept to fail every later batch.
        for claim in p.claims:
            try:
                _in_savepoint(conn, UPSERT_OWNER, claim)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                _log.warn(
                    "owner of {address} not saved in the journal (it is free again after a"
                    " restart): {error}",
                    address=ascii(claim[0]),
                    error=exc,
                )
        deleted: list[DurableCallback] = []
        last_values = self.last_values

        def change(op: CompactSet, upto: dict[str, int]) -> None:
            try:
                with _savepoint(conn):
                    last_values.change(conn, op.streams, op.rebuild, p.kept, upto)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                if op.on_durable is not None:
                    error = JournalError.refused(exc, self._path, "changing last-value streams")
                    refused.append((op.on_durable, error))
                return
            if op.on_durable is not None:
                deleted.append(op.on_durable)

        self._keep_last_values(p, written_rows, written_appends, change)
        for delete in p.deletes:
            try:
                with _savepoint(conn):
                    _delete_records(conn, delete)
                    last_values.deleted(conn, delete.stream, delete.through, p.kept)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                what = f"deleting stream {delete.stream!r}"
                if delete.on_durable is not None:
                    refused.append((delete.on_durable, JournalError.refused(exc, self._path, what)))
                continue
            if delete.on_durable is not None:
                deleted.append(delete.on_durable)
        for consumer in p.consumers:
            try:
                with _savepoint(conn):
                    _write_consumer(conn, consumer)
            except Exception as exc:
                if storage_failure(exc):
                    raise
                what = f"consumer {consumer.position.name!r} of {consumer.position.stream!r}"
                if consumer.on_durable is not None:
                    refused.append(
                        (consumer.on_durable, JournalError.refused(exc, self._path, what))
                    )
                continue
            if consumer.on_durable is not None:
                deleted.append(consumer.on_durable)
        self._finish(p)
        callbacks: list[DurableCallback] = []
        written = sum(counts[1] for counts in written_stats.values())
        for letter, callback, problem in zip(p.queued_rows, p.callbacks, bad_queued, strict=True):
            if problem is None:
                callbacks.append(callback)
                written += len(letter[8])
            else:
                refused.append((callback, self._refused(problem, *letter[:3])))
        return BatchOutcome(
            operations=p.operations,
            records=len(p.stream_rows) - len(dropped) + len(callbacks),
            bytes=written,
            stream_last={stream: stats[0] for stream, stats in p.stream_stats.items()},
            callbacks=callbacks + appended + deleted,
            error=None,
            refused=refused,
            dropped=dropped,
        )

    def _keep_last_values(
        self,
        p: _Prepared,
        rows: Sequence[StreamRow | None],
        appends: Sequence[StreamAppend | None],
        change: Callable[[CompactSet, dict[str, int]], None],
    ) -> None:
        """
        Keep the last values of ``p``'s records (``rows`` and ``appends``,
        None for one that was not written), in the order of writes with
        its changes of the compacted streams, each made by ``change`` with
        the sequence number each stream's rebuild goes up to (the records
        after the change are kept after it): whatever the batches, the
        same last values.
        """
        last_values = self.last_values
        conn = self._conn
        if not p.compactions:
            if last_values.involved(p.stream_stats):
                last_values.keep(conn, _written(rows, appends), p.kept)
            return
        rows_from = appends_from = 0
        for op, rows_at, appends_at in p.compactions:
            before = _written(rows[rows_from:rows_at], appends[appends_from:appends_at])
            last_values.keep(conn, before, p.kept)
            upto: dict[str, int] = {}
            for row in _written(rows[rows_at:], appends[appends_at:]):
                if row[1] <= upto.get(row[0], row[1]):
                    upto[row[0]] = row[1] - 1
            change(op, upto)
            rows_from, appends_from = rows_at, appends_at
        last_values.keep(conn, _written(rows[rows_from:], appends[appends_from:]), p.kept)

    def _finish(self, p: _Prepared) -> None:
        """
        End ``p``'s transaction: save the id high-water mark, delete what
        was confirmed, commit; the marks saved are no longer owed.
        """
        conn = self._conn
        if self._unsaved_queued_last:
            conn.execute(RAISE_COUNTER, (QUEUED_LAST_ID, self._unsaved_queued_last))
        if p.removed:
            conn.executemany(_DELETE_QUEUED, p.removed)
        conn.execute("COMMIT")
        self._committed(p)

    def _committed(self, p: _Prepared) -> None:
        """``p`` has committed: the marks it saved are no longer owed."""
        self.last_values.committed(p.kept)
        self._unsaved_stream_last.clear()
        self._unsaved_queued_last = 0

    def _refused(self, exc: Exception, rid: int, kind: str, address: str) -> JournalError:
        """The error for letter ``rid``, which cannot be written because of ``exc``."""
        return JournalError.refused(exc, self._path, f"letter {rid} for {kind} {address!r}")

    def _failed_after(self, batch: list[WriteOp], first: JournalError) -> BatchOutcome:
        """
        The outcome of ``batch``, handed over before the reactor heard that
        a batch failed with ``first``: not written, it fails as that one did.
        """
        records = sum(1 for op in batch if type(op) in (tuple, QueuedStore, StreamAppend))
        error = JournalError(
            f"journal {self._path}: a batch of {records} records was not written: it came"
            f" after one that failed ({first}), and is failed too so that nothing is"
            " written out of order",
            sqlite_error=first.sqlite_error,
            disk_full=first.disk_full,
        )
        error.reason = first.reason
        return self._failed(batch, error, error)

    def _failed(
        self, batch: list[WriteOp], exc: Exception, error: JournalError | None = None
    ) -> BatchOutcome:
        """
        The outcome of a batch that ``exc`` stopped: every record in it
        failed (with ``error``, else ``exc`` wrapped).
        """
        stream_last: dict[str, int] = {}
        callbacks: list[DurableCallback] = []
        for op in batch:
            if type(op) is tuple:
                stream_last[op[0]] = op[1]
            elif type(op) is QueuedStore:
                callbacks.append(op.on_durable)
                self._unsaved_queued_last = max(self._unsaved_queued_last, op.record.id)
            elif type(op) is StreamAppend:
                callbacks.append(op.on_durable)
                stream_last[op.key[0]] = op.key[3]
            elif (
                isinstance(op, StreamDelete | CompactSet | ConsumerSave)
                and op.on_durable is not None
            ):
                callbacks.append(op.on_durable)
        for stream, last in stream_last.items():
            self._unsaved_stream_last[stream] = max(last, self._unsaved_stream_last.get(stream, 0))
        records = sum(1 for op in batch if type(op) in (tuple, QueuedStore, StreamAppend))
        if error is None:
            error = JournalError.wrap(exc, self._path, f"writing a batch of {records} records")
        return BatchOutcome(len(batch), 0, 0, stream_last, callbacks, error)

    def _rollback(self) -> None:
        # SQLite rolls some errors (SQLITE_FULL among them) back on its own.
        if self._conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")

    def _prune_step(self, job: _PruneJob) -> None:
        try:
            self._set_synchronous(self._stream_level)
            self._conn.execute("BEGIN")
            step = prune_step(
                self._conn,
                self.config.retention_for,
                job.request.now,
                self.config.prune_chunk_rows,
                job.resume_from,
                self.last_values.streams,
            )
            self._conn.execute("COMMIT")
        except Exception as exc:
            self._rollback()
            self.last_values.forget_floors()  # moved on in the step rolled back
            error = JournalError.wrap(exc, self._path, "pruning streams")
            self._call_from_thread(self._on_prune, PruneOutcome(0, {}, True, error))
            outcome = PruneOutcome(job.deleted, job.first_seq, finished=True, error=error)
            self._call_from_thread(job.request.done, outcome)
            self._prune_jobs.popleft()  # once answered: until then, a broken writer answers it
            return
        self._report_step(job, step)

    def _report_step(self, job: _PruneJob, step: PruneStep) -> None:
        job.deleted += step.deleted
        job.first_seq.update(step.first_seq)
        finished = step.resume_from is None
        if not finished:
            assert step.resume_from is not None
            job.resume_from = step.resume_from
        if step.deleted or finished:
            # first_seq advances (and readers see it) step by step.
            self._call_from_thread(
                self._on_prune, PruneOutcome(step.deleted, step.first_seq, finished)
            )
        if finished:
            self._call_from_thread(
                job.request.done, PruneOutcome(job.deleted, job.first_seq, finished=True)
            )
            self._prune_jobs.popleft()  # once answered, as above
