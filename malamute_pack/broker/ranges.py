"""
Bulk reads of retained stream records (STREAM_QUERY and STREAM_READ_RANGE,
``docs/protocol.md`` "Bulk reads and idempotent appends"): what a data
pipeline (the Spark data source) uses to read a stream by sequence ranges.

A range read is not a subscription: it never joins the live stream. It
reads the journal's committed records from C{first} to C{last} (clamped to
the last committed record when it starts), keeps those whose subject
matches its pattern, and hands them to the reader's session a chunk at a
time, each chunk one message. It is paced by the reader's credit (one per
record delivered; a reader that never sent CREDIT gets nothing), and by its
session (a chunk it cannot take is read again once it drains). Records that
retention removed before they were read are reported as a gap, then the
read goes on; so are records the journal cannot serve (found damaged, or
lost with a damaged file: the store's C{lost}), in their place among the
records around them. After the last record the reader is told the range
ended. A read that fails, or whose records cannot be sent, is answered with
ERROR 502 and its reason: a reader is never left waiting.

Tests: ``tests/unit/test_broker_ranges.py``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from operator import attrgetter
from typing import Final

from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.stalled import Stalled
from malamute_pack.matching import Pattern, PatternError, parse_pattern
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.store import Store, StoreError

_log = Logger()

# A chunk holds at most this many records and, past one record, about this
# much content: a few thousand records per message, and a bound on what a
# reader's queue of chunks can hold.
CHUNK_RECORDS: Final = 4096
CHUNK_BYTES: Final = 256 * 1024
_SEQ: Final = attrgetter("seq")


@dataclass(slots=True, eq=False)
class RangeRead:
    """
    One range read under way: the next sequence number to read, the last,
    the pattern (None: every record) and whether a journal read is out.
    """

    next: int
    last: int
    pattern: Pattern | None
    reading: bool = False


class Ranges:
    """
    Stream queries and range reads, from the journal.

    @ivar delivered: records delivered by range reads.
    @ivar gaps: range reads that lost records to retention.
    """

    def __init__(
        self,
        store: Store | None,
        stalled: Stalled,
        chunk_records: int = CHUNK_RECORDS,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> None:
        self._store = store
        self._stalled = stalled
        self._chunk_records = chunk_records
        self._chunk_bytes = chunk_bytes
        self.delivered = 0
        self.gaps = 0

    def _require_store(self) -> Store:
        if self._store is None:
            raise Refused("not implemented: reading by sequence numbers needs the journal", 501)
        return self._store

    # STREAM_QUERY

    def query(self, connection: Connection, name: str, whence: int, position: int) -> None:
        """Answer with C{name}'s first and last committed numbers and where C{whence} points."""
        store = self._require_store()
        first, last = store.first_seq(name), store.durable_seq(name)
        session = connection.session
        if whence == mlm.EARLIEST:
            session.stream_status(name, first, last, first)
        elif whence == mlm.LATEST:
            session.stream_status(name, first, last, last + 1)
        elif whence == mlm.SEQUENCE:
            session.stream_status(name, first, last, position)
        elif whence == mlm.TIME:

            def found(seq: int) -> None:
                if not connection.gone:
                    session.stream_status(name, first, last, seq)

            def failed(failure: Failure) -> None:
                _log.failure("looking up a time in stream {stream!r}", failure, stream=name)
                if not connection.gone:
                    session.error(mlm.INTERNAL_ERROR, "internal error: the journal read failed")

            store.seq_at_time(name, position / 1000.0).addCallbacks(found, failed)
        else:
            raise Refused(f"invalid position: whence {whence} is not 0, 1, 2 or 3")

    # STREAM_READ_RANGE

    def read(self, connection: Connection, name: str, pattern: str, first: int, last: int) -> None:
        """Start reading C{first}..C{last} of C{name} for C{connection} (see the module)."""
        store = self._require_store()
        if name in connection.reading or name in connection.ranges:
            raise Refused(f"already reading stream {name!r}: cancel it first")
        try:
            matcher = parse_pattern(pattern) if pattern else None
        except PatternError as e:
            raise Refused(f"invalid pattern: {e}") from e
        connection.ranges[name] = RangeRead(
            max(first, 1), min(last, store.durable_seq(name)), matcher
        )

    def cancel(self, connection: Connection, name: str) -> None:
        connection.ranges.pop(name, None)

    def resume_all(self, connection: Connection) -> None:
        """Go on with every range read of C{connection} (after CREDIT, or once it drained)."""
        for name in list(connection.ranges):
            self.resume(connection, name)

    def resume(self, connection: Connection, name: str) -> None:
        read = connection.ranges.get(name)
        store = self._store
        if read is None or read.reading or connection.gone or store is None:
            return
        first = store.first_seq(name)
        if read.next < first and read.next <= read.last:
            self._gap(connection, name, read.next, min(first, read.last + 1))
            read.next = first
        if read.next > read.last:
            del connection.ranges[name]
            connection.session.range_end(name, read.last)
            return
        credit = connection.credit
        if connection.stalled or credit is None or credit <= 0:
            return
        read.reading = True
        store.read_rows(
            name, read.next, read.last, min(credit, self._chunk_records), self._chunk_bytes
        ).addCallback(self._read_done, connection, name, read).addErrback(
            self._read_failed, connection, name, read
        )

    def _read_done(
        self, rows: list[ChunkRow], connection: Connection, name: str, read: RangeRead
    ) -> None:
        read.reading = False
        if connection.gone or connection.ranges.get(name) is not read:
            return
        store = self._store
        assert store is not None
        first = store.first_seq(name)
        if read.next < first:
            # Retention went past the next record while it was being read.
            upto = min(first, rows[0].seq if rows else read.last + 1)
            if read.next < upto:
                self._gap(connection, name, read.next, upto)
                read.next = upto
        # What the read covered: up to its last record, or to the end.
        covered = rows[-1].seq if rows else read.last
        start = 0
        for missed, last in store.lost(name, read.next, covered):
            cut = bisect_left(rows, missed, start, key=_SEQ)
            if not self._deliver(connection, name, read, rows[start:cut]):
                return
            self.gaps += 1
            connection.lost_to_damage(name, missed, last + 1)
            read.next = last + 1
            start = bisect_right(rows, last, cut, key=_SEQ)
        if not self._deliver(connection, name, read, rows[start:]):
            return
        read.next = max(read.next, covered + 1)
        self.resume(connection, name)

    def _deliver(
        self, connection: Connection, name: str, read: RangeRead, rows: list[ChunkRow]
    ) -> bool:
        """Send C{rows} that match (none: nothing); False if the reader cannot take them now."""
        if not rows:
            return True
        pattern = read.pattern
        matched = rows if pattern is None else [r for r in rows if pattern.matches(r.subject)]
        if matched:
            if not connection.session.deliver_chunk(name, matched):
                self._stalled.add(connection)  # read again once it drains
                return False
            if connection.credit is not None:
                connection.credit -= len(matched)
            self.delivered += len(matched)
        read.next = rows[-1].seq + 1
        return True

    def _read_failed(
        self, failure: Failure, connection: Connection, name: str, read: RangeRead
    ) -> None:
        """The read failed, or its records could not be sent: the reader is told why."""
        read.reading = False
        _log.failure(
            "range read of stream {stream!r} for {connection} failed",
            failure,
            stream=name,
            connection=connection,
        )
        if connection.ranges.get(name) is read:
            del connection.ranges[name]
            if not connection.gone:
                connection.session.error(mlm.INTERNAL_ERROR, failed_read(name, failure))

    def _gap(self, connection: Connection, name: str, missed: int, available: int) -> None:
        self.gaps += 1
        connection.lost_to_retention(name, missed, available)


def failed_read(name: str, failure: Failure) -> str:
    """What a reader is told of a read of stream C{name} that failed with C{failure}."""
    error = failure.value
    reason = getattr(error, "reason", None) if isinstance(error, StoreError) else None
    why = reason or f"{type(error).__name__}: {error}"
    return mlm.fit_string(f"internal error: reading stream {name!r} failed: {why}")
