"""
Every stream of the broker: writing, live delivery to matching readers, and
delivery from the journal for readers that are behind (out of credit, or
reading from a position) until they catch up with the live stream.

A reader is either live on a stream or behind it, with the sequence number
it needs next in C{connection.behind}. A live message skips a reader that is
behind: the message is in the journal and reaches it in order from there.
A reader that runs out of credit, or whose session cannot take a message
(it does not drain: L{Stalled}), becomes behind at the message it could not
take; with no journal to replay from, that message is missed (counted) by
that reader only. Reading from the journal goes a batch at a time, only while the
reader has credit, and ends when it has reached the stream's last sequence
number, at which point it is live again: no gap, no duplicate. Records the
journal cannot serve (found damaged, or lost with a damaged file: the
store's C{lost}) are told to the reader as a gap in their place, never
served and never skipped in silence; a read that fails, or whose records
cannot be sent, is answered with ERROR 502 and its reason.

Every delivery is one call of the reader's session with a L{StreamRecord};
a live fan-out hands the same record to every reader, so each dialect
encodes it once.

A peer broker of the pack (a C{remote} reader) keeps what it is sent in
its own journal, so it is sent only what is durable here: it never reads
live, but from the journal up to the last number committed (in a pair,
that the partner has too), resumed as each batch commits (the store's
C{watch_durable}, while the batch is still in memory). A record whose
write failed (a full disk), or that a yielding pair broker withholds,
never reaches another broker, to come back there under another number
when its writer tries again. A consumer group's reader (a C{durable}
one) and a durable consumer (STREAM_CONSUME) read the same way: such a
record never reaches one member and then, at its new number, another,
and a consumer never commits a position past a record that is then not
there, or is another at that number (a pair's broker that yields).

A reader of a last-value stream may start from its last values
(C{mlm.LAST_VALUES}): it is put behind at the stream's last sequence
number + 1 at once, and the store's snapshot as of that number (the latest
record of each subject, in sequence order) is read; the records its
patterns match (not its own) go to it first, while it has credit, then it
reads on from there as any reader behind does: no gap, no duplicate, and
a subject updated meanwhile comes again at its new value after the
snapshot.

Tests: ``tests/unit/test_broker_model.py``, ``tests/unit/test_broker_durable.py``,
``tests/unit/test_broker_known_streams.py``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from operator import attrgetter

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.appends import AppendKeys, Waiter
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.interests import Interests
from malamute_pack.broker.limits import longer_than
from malamute_pack.broker.ranges import failed_read
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.stream import Stream
from malamute_pack.matching import PatternError, validate_pattern
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import StreamRecord
from malamute_pack.store import DurableCallback, Store, StoreError

_log = Logger()

# The whence STREAM_READ_FROM takes.
_READ_WHENCES = frozenset(
    {mlm.LATEST, mlm.EARLIEST, mlm.SEQUENCE, mlm.TIME, mlm.LAST_VALUES, mlm.RESUME}
)

# The subject of a notice: a record every reader of its stream gets, whatever
# its patterns (L{Streams.write_forwarded}; docs/multicast.md).
NOTICE = "$gap"

# StreamRecord(...) without the named tuple's Python-level __new__: one is
# made for every message written.
_new_record = partial(tuple.__new__, StreamRecord)
_SEQ = attrgetter("seq")


@dataclass(slots=True)
class _Snapshot:
    """
    A reader's last-value snapshot as of sequence number C{through}: its
    C{records} (None while being read), those from C{next} on still to send.
    """

    through: int
    records: list[StreamRecord] | None = None
    next: int = 0
    finishing: bool = False  # all sent: forgotten at the next turn


def check_pattern(pattern: str) -> None:
    """Refuse a pattern that does not compile, with the reason."""
    try:
        validate_pattern(pattern)
    except PatternError as e:
        raise Refused(f"invalid pattern: {e}") from e


def _durable_reader(connection: Connection, name: str) -> bool:
    """
    Whether C{connection} reads C{name} only up to what is durable: a peer
    broker, a consumer group's reader, or a durable consumer of C{name}.
    """
    consuming = connection.consuming
    return connection.remote or connection.durable or (consuming is not None and name in consuming)


class Streams:
    """
    Every stream of the broker, and delivery to their readers.

    @ivar delivered: deliveries made (live and from the journal).
    @ivar dropped: messages a reader missed (no journal to replay from).
    @ivar gaps: times a reader lost messages to retention.
    @ivar appends: the keys of the idempotent appends written and being written.
    """

    def __init__(
        self,
        clock: IReactorTime,
        store: Store | None,
        stalled: Stalled,
        match_cache: int,
        replay_batch: int,
        max_subject: int = 255,
        interests: Interests | None = None,
        append_keys: int = 100_000,
    ) -> None:
        self._clock = clock
        self.appends = AppendKeys(append_keys)
        # Told of local readers' patterns (the pack announces them to peers).
        self._interests = interests
        self._stalled = stalled
        self._store = store
        self._match_cache = match_cache
        self._replay_batch = replay_batch
        self._max_subject = max_subject
        self.streams: dict[str, Stream] = {}
        self._last_seq: dict[str, int] = {}  # sequence numbers when there is no journal
        # Last-value snapshots being read or sent, by reader and stream.
        self._snapshots: dict[tuple[Connection, str], _Snapshot] = {}
        # Per stream, the highest number heard durable, and the peer brokers
        # waiting for more to be (see the module).
        self._durable: dict[str, int] = {}
        self._awaiting: dict[str, set[Connection]] = {}
        # Records forwarded here by peer brokers, not yet durable, per
        # stream: (seq here, origin, origin_seq). Those of a batch that
        # fails are asked for again (L{on_forward_failed}: the pack).
        self._forwarded: dict[str, deque[tuple[int, str, int]]] = {}
        self.on_forward_failed: Callable[[str, str, list[int]], None] | None = None
        if store is not None:
            store.watch_durable(self._committed)
            store.watch_failures(self._failed)
        self.delivered = 0
        self.dropped = 0
        self.gaps = 0

    def restore(self, names: Iterable[str]) -> None:
        """
        Know the streams C{names} (those a journal holds, once it opens):
        listed with the others from the start, as if a client had named
        them, though nobody reads or writes them yet.
        """
        for name in names:
            self.require(name)

    def require(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = Stream(name, self._match_cache)
        return stream

    def last_seq(self, name: str) -> int:
        """The last sequence number given on C{name} (0 for none)."""
        if self._store is not None:
            return self._store.last_seq(name)
        return self._last_seq.get(name, 0)

    def set_writer(self, connection: Connection, name: str) -> None:
        connection.writer = self.require(name)

    def subscribe(self, connection: Connection, name: str, pattern: str) -> None:
        check_pattern(pattern)
        stream = self.require(name)
        if stream.readers.subscribe(connection, pattern):
            connection.reading.setdefault(name, set()).add(pattern)
            if self._interests is not None and not connection.remote:
                self._interests.read(name, pattern)

    def cancel(self, connection: Connection, name: str) -> None:
        stream = self.streams.get(name)
        self._snapshots.pop((connection, name), None)
        connection.behind.pop(name, None)
        connection.history.discard(name)
        patterns = connection.reading.pop(name, None)
        if patterns is not None and stream is not None:
            stream.readers.unsubscribe_owner(connection)
            self._unread(connection, name, patterns)

    def unsubscribe(self, connection: Connection, name: str, pattern: str) -> None:
        """Drop one pattern of C{connection} on C{name} (all of them: L{cancel})."""
        patterns = connection.reading.get(name)
        if not patterns or pattern not in patterns:
            return
        if len(patterns) == 1:
            self.cancel(connection, name)
            return
        patterns.discard(pattern)
        self.streams[name].readers.unsubscribe(connection, pattern)
        self._unread(connection, name, {pattern})

    def forget(self, connection: Connection) -> None:
        """Drop every reading of a connection that is gone."""
        for name, patterns in connection.reading.items():
            self._snapshots.pop((connection, name), None)
            self.streams[name].readers.unsubscribe_owner(connection)
            self._unread(connection, name, patterns)
        if connection.remote or connection.durable or connection.consuming:
            for waiting in self._awaiting.values():
                waiting.discard(connection)
        connection.reading.clear()
        connection.behind.clear()
        connection.history.clear()
        connection.writer = None

    def _unread(self, connection: Connection, name: str, patterns: set[str]) -> None:
        if self._interests is not None and not connection.remote:
            for pattern in patterns:
                self._interests.unread(name, pattern)

    # Writing and live delivery

    def write(self, writer: Connection, message: mlm.StreamSend) -> None:
        """Journal C{message} on the writer's stream and deliver it live."""
        stream = writer.writer
        if stream is None:
            raise Refused("no stream: send STREAM_WRITE before STREAM_SEND")
        subject = message.subject
        if len(subject) * 4 > self._max_subject and longer_than(subject, self._max_subject):
            raise Refused(f"invalid subject: longer than {self._max_subject} bytes")
        self._publish(stream, writer, self._clock.seconds(), subject, message.content)

    def write_forwarded(
        self,
        peer: Connection,
        name: str,
        record: StreamRecord,
        history: bool = False,
        everyone: bool = False,
    ) -> None:
        """
        Journal and deliver a record that came from another broker (its
        C{origin} and C{origin_seq} set: forwarded by a peer of the pack, or
        received by a multicast bridge): it gets this broker's next
        sequence number on C{name}. A record of the peer's C{history}
        reaches live only the readers that asked for history. A notice
        (C{everyone}: subject L{NOTICE}, what a multicast bridge could not
        recover) reaches every reader of the stream, whatever its patterns,
        live and in replays.
        """
        assert not everyone or record.subject == NOTICE, record
        self._publish(
            self.require(name),
            peer,
            record.timestamp,
            record.subject,
            record.content,
            record.sender,
            record.origin,
            record.origin_seq,
            history,
            everyone,
        )

    def _publish(
        self,
        stream: Stream,
        writer: Connection,
        now: float,
        subject: str,
        content: Sequence[bytes],
        sender: str | None = None,
        origin: str = "",
        origin_seq: int = 0,
        history: bool = False,
        everyone: bool = False,
    ) -> None:
        """
        Journal a record on C{stream} and deliver it to the live readers it
        matches (C{everyone}: to all its readers).
        """
        name = stream.name
        if sender is None:
            sender = writer.address
        if self._store is not None:
            seq = self._store.append_stream(name, sender, subject, content, now, origin, origin_seq)
            if origin:
                self._forwarded.setdefault(name, deque()).append((seq, origin, origin_seq))
        else:
            seq = self._last_seq.get(name, 0) + 1
            self._last_seq[name] = seq
        stream.messages += 1
        readers = stream.readers.owners() if everyone else stream.readers.match(subject)
        if not readers:
            return
        record = _new_record((name, seq, now, sender, subject, content, origin, origin_seq))
        self._fan_out(stream, writer, record, readers, history)

    def _fan_out(
        self,
        stream: Stream,
        writer: Connection,
        record: StreamRecord,
        readers: Iterable[Connection],
        history: bool = False,
    ) -> None:
        """Deliver C{record} to the live C{readers} it matched."""
        name = record.stream
        seq = record.seq
        delivered = 0
        journaled = self._store is not None
        for reader in readers:
            if reader is writer or (reader.behind and name in reader.behind):
                continue
            # (Most readers are plain clients: the cheap fields first.)
            if (
                journaled
                and (reader.remote or reader.durable or reader.consuming)
                and _durable_reader(reader, name)
            ):
                # A peer broker, a consumer: from the journal once durable (see the module).
                reader.behind[name] = seq
                self._awaiting.setdefault(name, set()).add(reader)
                continue
            if history and name not in reader.history:
                continue
            credit = reader.credit
            if reader.stalled or (credit is not None and credit <= 0):
                self._fall_behind(reader, stream, seq)
                continue
            if not reader.session.deliver_stream(record):
                self._fall_behind(reader, stream, seq)
                self._stalled.add(reader)
                continue
            if credit is not None:
                reader.credit = credit - 1
            delivered += 1
        stream.delivered += delivered
        self.delivered += delivered

    def undelivered(self, reader: Connection, record: StreamRecord) -> None:
        """
        C{record}, counted as delivered to C{reader}, could not be sent
        after all: not counted, its credit given back, and the reader
        behind from it (stalled, so it is tried again). If the reader was
        already behind from a later record, it is now behind from this one
        (the records between may come twice: never lost).
        """
        stream = self.streams.get(record.stream)
        if stream is None:
            return
        stream.delivered -= 1
        self.delivered -= 1
        if reader.credit is not None:
            reader.credit += 1
        snapshot = self._snapshots.get((reader, stream.name))
        if snapshot is not None and snapshot.records and record.seq <= snapshot.through:
            # One of its last values: sent again from it, before the records after them.
            index = bisect_left(snapshot.records, record.seq, key=_SEQ)
            snapshot.next = min(snapshot.next, index)
            through = snapshot.through + 1
            reader.behind[stream.name] = min(reader.behind.get(stream.name, through), through)
            self._stalled.add(reader)
            return
        earlier = reader.behind.get(stream.name)
        self._fall_behind(reader, stream, record.seq)
        if earlier is not None and earlier < record.seq:
            reader.behind[stream.name] = earlier
        self._stalled.add(reader)

    def _fall_behind(self, reader: Connection, stream: Stream, seq: int) -> None:
        if self._store is None:
            # Nothing to replay from: the miss is counted.
            stream.dropped += 1
            reader.dropped += 1
            self.dropped += 1
        else:
            reader.behind[stream.name] = seq

    # Idempotent appends

    def append(
        self,
        writer: Connection,
        name: str,
        key: str,
        records: Sequence[tuple[str, Sequence[bytes]]],
        answer: Waiter,
    ) -> None:
        """
        Write C{records} (subject, frames) to C{name} as C{writer}, all or
        none, unless C{key} was written there already; C{answer} gets the
        outcome (first and last sequence numbers, code, reason) once the
        records are durable, or at once for a key already written.
        """
        for subject, _ in records:
            if longer_than(subject, self._max_subject):
                raise Refused(f"invalid subject: longer than {self._max_subject} bytes")
        if self.appends.wait(name, key, answer):
            return  # the same key is being written: its outcome is this one's
        found = self.appends.written(name, key)
        if found is not None:
            position = self.appends.unconfirmed(name, key)
            if position is None:
                answer(found[0], found[1], mlm.ALREADY_WRITTEN, "already written")
            else:
                self._confirm(name, key, found, position, answer)
            return
        forget = self.appends.begin(name, key, answer)
        stream = self.require(name)
        now = self._clock.seconds()
        count = len(records)
        store = self._store
        if store is not None:
            first = store.last_seq(name) + 1
            last = first + count - 1

            durable = self._append_ended(name, key, first, last, mlm.SUCCESS, "")
            given = store.append_batch(name, writer.address, records, now, key, forget, durable)
            assert given == first, (given, first)
        else:
            first = self._last_seq.get(name, 0) + 1
            last = self._last_seq[name] = first + count - 1
        stream.messages += count
        sender = writer.address
        for seq, (subject, content) in enumerate(records, first):
            readers = stream.readers.match(subject)
            if readers:
                record = _new_record((name, seq, now, sender, subject, content, "", 0))
                self._fan_out(stream, writer, record, readers)
        if store is None:
            self.appends.end(name, key, first, last, mlm.SUCCESS, "")

    def _confirm(
        self, name: str, key: str, found: tuple[int, int], position: int, answer: Waiter
    ) -> None:
        """
        A retry of C{key}, written here (C{found}) at C{position} and not
        acknowledged by the pair's partner: nothing is written again; it is
        answered as already written once the partner has it, or fails again.
        """
        store = self._store
        assert store is not None, "only a store refuses a write it holds"
        first, last = found
        self.appends.begin_confirm(name, key, answer)
        store.confirm(
            position,
            self._append_ended(name, key, first, last, mlm.ALREADY_WRITTEN, "already written"),
        )

    def _append_ended(
        self, name: str, key: str, first: int, last: int, code: int, reason: str
    ) -> DurableCallback:
        """
        What ends the append of C{key} (C{first}..C{last}) once the store
        has it: C{code} and C{reason}, or its failure (unconfirmed if the
        records are on this disk all the same).
        """

        def ended(error: StoreError | None) -> None:
            if error is None:
                self.appends.end(name, key, first, last, code, reason)
            else:
                self.appends.end(
                    name, key, first, last, mlm.FAILED, error.reason, error.unconfirmed
                )

        return ended

    # Reading from a position

    def read_from(
        self, connection: Connection, name: str, pattern: str, whence: int, pos: int
    ) -> None:
        """
        Subscribe C{connection} and move its position on the stream to
        C{whence}/C{pos} (LAST_VALUES: a last-value stream's snapshot, then on).
        """
        if whence not in _READ_WHENCES:
            raise Refused(f"invalid position: whence {whence} is not 0, 1, 2, 3, 4 or 5")
        store = self._store
        if store is None and whence != mlm.LATEST:
            raise Refused("not implemented: reading from a position needs the journal", 501)
        if whence == mlm.LAST_VALUES and store is not None and not store.compacted(name):
            raise Refused(
                f"not a last-value stream: {name!r} does not keep its subjects' last values"
                f" (malamute/streams/{name}/compact = subject)"
            )
        self.subscribe(connection, name, pattern)
        if store is None or whence == mlm.LATEST:
            return
        self._snapshots.pop((connection, name), None)  # its position moves
        if whence == mlm.LAST_VALUES:
            self._read_last_values(connection, name, store)
            return
        if whence == mlm.RESUME:
            whence, pos = mlm.SEQUENCE, self.resume_point(connection, name, pos)
        connection.history.add(name)
        if self._interests is not None and not connection.remote:
            self._interests.history(name, pattern, whence, pos)
        behind = connection.behind
        if whence == mlm.EARLIEST:
            behind[name] = store.first_seq(name)
        elif whence == mlm.SEQUENCE:
            behind[name] = max(1, pos)
        else:
            # Hold live delivery from now on; replay from the time once found
            # (until then a journal read is under way: nothing else starts).
            behind[name] = min(behind.get(name, 1 << 63), store.last_seq(name) + 1)
            connection.replaying.add(name)
            store.seq_at_time(name, pos / 1000.0).addCallbacks(
                self._found_time,
                self._replay_failed,
                callbackArgs=(connection, name),
                errbackArgs=(connection, name),
            )

    def resume_point(self, connection: Connection, name: str, pos: int) -> int:
        """
        Where a reader resuming C{name} after a reconnection, at C{pos} (the
        number after the last record it was handed), goes on: there; or,
        if C{pos} is past anything the stream numbered (this journal was
        made afresh and numbers it from 1 again), from its first record,
        the reader told so by a STREAM_GAP whose C{available} is below its
        C{missed} (it forgets the numbers it had: found by the soak, a
        client dropped the new journal's records as repeats of the old's).
        """
        store = self._store
        assert store is not None
        if pos <= store.last_seq(name) + 1:
            return max(1, pos)
        first = store.first_seq(name)
        _log.info(
            "{connection} resumes stream {stream!r} at {pos}, past its last number {last}"
            " (this broker's journal numbers it again): told so, and read from {first}",
            connection=connection,
            stream=name,
            pos=pos,
            last=store.last_seq(name),
            first=first,
        )
        connection.session.gap(name, pos, first)
        return first

    def sent_through(self, connection: Connection, name: str) -> int:
        """
        The last record of C{name} that C{connection} (reading it) was
        sent or passed over (one its patterns do not match): every record
        before the one it waits for, or, live, the stream's last.
        """
        waiting = connection.behind.get(name)
        if waiting is not None:
            return waiting - 1
        return self._store.last_seq(name) if self._store is not None else 0

    def _read_last_values(self, connection: Connection, name: str, store: Store) -> None:
        """Put C{connection} behind after the last record of C{name}, its snapshot first."""
        through = store.last_seq(name)
        connection.behind[name] = through + 1
        connection.replaying.add(name)  # nothing else starts until it is read
        snapshot = self._snapshots[connection, name] = _Snapshot(through)
        store.read_last_values(name).addCallback(
            self._read_snapshot, connection, name, snapshot
        ).addErrback(self._snapshot_failed, connection, name, snapshot)

    def _read_snapshot(
        self, records: list[StreamRecord], connection: Connection, name: str, snapshot: _Snapshot
    ) -> None:
        connection.replaying.discard(name)
        if connection.gone:
            return
        if self._snapshots.get((connection, name)) is snapshot:  # else cancelled or moved since
            store = self._store
            assert store is not None
            # Last values it cannot be served (damaged or lost): told as gaps.
            for missed, last in store.lost(name, store.first_seq(name), snapshot.through):
                self.gaps += 1
                connection.lost_to_damage(name, missed, last + 1)
            matches = self.streams[name].readers.owner_matches
            address = connection.address
            snapshot.records = [
                record
                for record in records
                if matches(connection, record.subject)
                and not (record.sender != "" and record.sender == address)
            ]
        self.resume(connection, name)

    def _snapshot_failed(
        self, failure: Failure, connection: Connection, name: str, snapshot: _Snapshot
    ) -> None:
        # Read on after the snapshot's point: the live records are not held back.
        connection.replaying.discard(name)
        if self._snapshots.get((connection, name)) is snapshot:
            snapshot.records = []
        _log.failure(
            "reading the last values of stream {stream!r} for {connection} failed",
            failure,
            stream=name,
            connection=connection,
        )
        if not connection.gone:
            self.resume(connection, name)

    def _send_snapshot(self, connection: Connection, name: str, snapshot: _Snapshot) -> bool:
        """Send C{connection} its snapshot while it can take it; whether it is all sent."""
        records = snapshot.records
        if records is None:
            return False  # still being read
        stream = self.streams[name]
        session = connection.session
        while snapshot.next < len(records):
            if not connection.can_take():
                return False
            if not session.deliver_stream(records[snapshot.next]):
                self._stalled.add(connection)
                return False
            connection.took()
            stream.delivered += 1
            self.delivered += 1
            snapshot.next += 1
        if not snapshot.finishing:
            # Kept until the sends of this turn are done: one that fails starts again there.
            snapshot.finishing = True
            self._clock.callLater(0, self._snapshot_sent, connection, name, snapshot)
        return True

    def _snapshot_sent(self, connection: Connection, name: str, snapshot: _Snapshot) -> None:
        key = (connection, name)
        snapshot.finishing = False
        if self._snapshots.get(key) is not snapshot or snapshot.records is None:
            return
        if snapshot.next >= len(snapshot.records):
            del self._snapshots[key]

    def _found_time(self, seq: int, connection: Connection, name: str) -> None:
        connection.replaying.discard(name)
        if not connection.gone and name in connection.behind:
            connection.behind[name] = min(connection.behind[name], seq)
            self.resume(connection, name)

    # Delivery from the journal

    def resume_all(self, connection: Connection) -> None:
        """Continue every journal delivery C{connection} is owed (after CREDIT)."""
        for name in list(connection.behind):
            self.resume(connection, name)

    def resume(self, connection: Connection, name: str) -> None:
        """Deliver from the journal to C{connection} on C{name} while it has credit."""
        store = self._store
        if store is None or connection.gone:
            return
        if name not in connection.behind or name in connection.replaying:
            return
        snapshot = self._snapshots.get((connection, name))
        if snapshot is not None and not self._send_snapshot(connection, name, snapshot):
            return
        wanted = connection.behind[name]
        first = store.first_seq(name)
        if wanted < first:
            self._gap(connection, name, wanted, first)
            wanted = connection.behind[name] = first
        if wanted > store.last_seq(name):
            del connection.behind[name]  # caught up: live from here on
            return
        durable: int | None = None
        if _durable_reader(connection, name):
            durable = self._durable_through(name)
            if wanted > durable:
                self._awaiting.setdefault(name, set()).add(connection)
                return
        if not connection.can_take():
            return
        # A read served from the journal's in-memory tail fires at once, one
        # from disk later; either way _read_done continues from there
        # (nesting at most tail/batch deep).
        connection.replaying.add(name)
        # What the read covers: a hole it finds ends here, not at what was
        # written while it ran (those come next, not skipped with the hole).
        through = store.last_seq(name)
        store.read_stream(name, wanted, self._replay_batch).addCallback(
            self._read_done, connection, name, through, durable
        ).addErrback(self._replay_failed, connection, name)

    def _read_done(
        self,
        records: list[StreamRecord],
        connection: Connection,
        name: str,
        through: int,
        durable: int | None,
    ) -> None:
        connection.replaying.discard(name)
        if connection.gone or name not in connection.behind:
            return
        self._deliver_records(connection, name, records, through, durable)
        self.resume(connection, name)

    def _deliver_records(
        self,
        connection: Connection,
        name: str,
        records: list[StreamRecord],
        through: int,
        durable: int | None,
    ) -> None:
        """
        Deliver C{records} (a read of C{name} up to C{through}) to
        C{connection}; a durable reader only up to C{durable}, what was
        durable when the read began: a record read from the journal's
        memory then, whose batch failed since, was never written (the
        bound now would count it settled).
        """
        stream = self.streams[name]
        behind = connection.behind
        store = self._store
        assert store is not None
        # What the journal cannot serve among what the read covered: a gap
        # for each, in its place among the records.
        covered = records[-1].seq if records else through
        lost = deque(store.lost(name, behind[name], covered))
        if not records and not lost:
            # Retained but unreadable (a journal batch failed): skip the hole.
            _log.warn(
                "stream {stream!r}: records from {seq} could not be read; skipped",
                stream=name,
                seq=behind[name],
            )
            behind[name] = through + 1
            return
        matches = stream.readers.owner_matches
        session = connection.session
        for record in records:
            while lost and lost[0][0] <= record.seq:
                self._damaged(connection, name, *lost.popleft())
            if record.seq < behind[name]:
                continue
            if durable is not None and record.seq > durable:
                behind[name] = record.seq
                self._awaiting.setdefault(name, set()).add(connection)
                return
            own = record.sender != "" and record.sender == connection.address
            subject = record.subject
            if not own and (
                matches(connection, subject) or (subject == NOTICE and record.origin != "")
            ):
                if not connection.can_take():
                    behind[name] = record.seq
                    return
                if not session.deliver_stream(record):
                    behind[name] = record.seq
                    self._stalled.add(connection)
                    return
                connection.took()
                stream.delivered += 1
                self.delivered += 1
            behind[name] = record.seq + 1
        while lost:
            self._damaged(connection, name, *lost.popleft())

    def _failed(self, stream_last: Mapping[str, int]) -> None:
        """
        A batch failed (the store's watch): the records peer brokers had
        forwarded in it are not here; each origin is asked for them again.
        """
        for name, last in stream_last.items():
            forwarded = self._forwarded.get(name)
            failed: dict[str, list[int]] = {}
            while forwarded and forwarded[0][0] <= last:
                _, origin, origin_seq = forwarded.popleft()
                failed.setdefault(origin, []).append(origin_seq)
            for origin, origin_seqs in sorted(failed.items()):
                if self.on_forward_failed is not None:
                    self.on_forward_failed(name, origin, origin_seqs)

    def _durable_through(self, name: str) -> int:
        """The last number of C{name} known durable here."""
        assert self._store is not None
        return max(self._store.durable_seq(name), self._durable.get(name, 0))

    def _committed(self, stream_last: Mapping[str, int]) -> None:
        """A batch committed (the store's watch): peer brokers waiting for it read on."""
        for name, last in stream_last.items():
            if last > self._durable.get(name, 0):
                self._durable[name] = last
            forwarded = self._forwarded.get(name)
            while forwarded and forwarded[0][0] <= last:
                forwarded.popleft()
            waiting = self._awaiting.pop(name, None)
            for connection in waiting or ():
                if not connection.gone:
                    self.resume(connection, name)

    def _damaged(self, connection: Connection, name: str, missed: int, last: int) -> None:
        """Tell C{connection} of records C{missed}..C{last}, not served, unless it is past them."""
        behind = connection.behind
        if last < behind[name]:
            return
        self.gaps += 1
        connection.lost_to_damage(name, max(missed, behind[name]), last + 1)
        behind[name] = last + 1

    def _gap(self, connection: Connection, name: str, missed: int, available: int) -> None:
        self.gaps += 1
        connection.lost_to_retention(name, missed, available)

    def _replay_failed(self, failure: Failure, connection: Connection, name: str) -> None:
        """A read from the journal failed (or its records could not be sent): the reader is told."""
        connection.replaying.discard(name)
        _log.failure(
            "reading stream {stream!r} from the journal for {connection} failed",
            failure,
            stream=name,
            connection=connection,
        )
        if not connection.gone:
            connection.session.error(mlm.INTERNAL_ERROR, failed_read(name, failure))
