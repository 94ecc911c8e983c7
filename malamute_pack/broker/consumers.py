"""
Durable named readers: consumers whose position the broker keeps
(STREAM_CONSUME, STREAM_COMMIT; docs/protocol.md "Consumers the broker
remembers").

A consumer is a name on a stream. Its position is the last record it
acknowledged, kept in memory in least-recently-used order and in the
journal (L{Store.save_consumer}), so that it survives the connection, the
process, a broker restart and a pair's fail-over. One connection holds a
consumer at a time; a later one takes it over. Reading itself is the
streams' (L{Streams.read_from}): a consumer reads from the record after its
position and then live, as any reader from a sequence number does.

Positions unused for C{ttl} seconds are forgotten, and at most C{limit} are
kept: the least recently used goes first.

Tests: ``tests/unit/test_broker_consumers.py``, ``tests/system/test_consumers.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.groups import Groups, check_join, check_owner, committed_answer
from malamute_pack.broker.limits import check_name
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import Streams
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import GROUP, READER, ConsumerPosition, StreamRecord
from malamute_pack.store import DurableCallback, Store

_log = Logger()

# A consumer's key: (stream, kind, name).
Key = tuple[str, str, str]

# What a connection's consuming entry holds once another took the consumer over.
TAKEN_OVER = ""
# What it holds for a member of a group (no reader's name has a NUL).
MEMBER = "\x00group"
# What it holds for a member of a group whose home is another broker of a pack.
REMOTE_MEMBER = "\x00remote"


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """One consumer as the management API lists it."""

    stream: str
    kind: str
    name: str
    position: int
    last: int
    updated: float
    holder: str | None  # the connection reading as it (its repr), None when none

    @property
    def lag(self) -> int:
        """Records written after its position."""
        return max(0, self.last - self.position)


class Consumers:
    """
    The consumers the broker remembers, their positions and who holds them.

    @ivar commits: commits received.
    @ivar takeovers: consumers taken over by another connection.
    @ivar forgotten: positions forgotten (unused for C{ttl}, or past C{limit}).
    """

    def __init__(
        self,
        clock: IReactorTime,
        store: Store | None,
        streams: Streams,
        stalled: Stalled,
        limit: int,
        ttl: float,
        max_name: int = 255,
        group_lease: float = 30.0,
        max_unacked_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._clock = clock
        self._store = store
        self._streams = streams
        self._limit = limit
        self._ttl = ttl
        self._max_name = max_name
        # Least recently used first.
        self._positions: OrderedDict[Key, ConsumerPosition] = OrderedDict()
        self._holders: dict[Key, Connection] = {}
        self.groups = Groups(
            clock, store, streams, stalled, self._save_position, group_lease, max_unacked_bytes
        )
        self.commits = 0
        self.takeovers = 0
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._positions)

    def restore(self, positions: Iterable[ConsumerPosition]) -> None:
        """Take the positions a journal kept (least recently used first), replacing any."""
        self._positions = OrderedDict(((p.stream, p.kind, p.name), p) for p in positions)

    def position(self, stream: str, name: str) -> ConsumerPosition | None:
        """The position of reader C{name} on C{stream}, if it is remembered."""
        return self._positions.get((stream, READER, name))

    # Reading as a consumer

    def consume(self, connection: Connection, message: mlm.StreamConsume) -> None:
        """
        Make C{connection} read C{message.stream} as consumer
        C{message.consumer}: from after its position (whence RESUME; from
        the earliest record retained for a consumer not known), or from
        another whence, which resets its position there.
        """
        stream, name, whence = message.stream, message.consumer, message.whence
        check_name("consumer name", name, self._max_name)
        store = self._store
        if store is None:
            raise Refused("not implemented: consumers need the journal", mlm.NOT_IMPLEMENTED)
        if whence == mlm.LAST_VALUES:
            raise Refused("invalid position: a consumer cannot start from last values")
        consuming = connection.consuming
        current = consuming.get(stream) if consuming else None
        user = connection.session.user or ""
        if message.group:
            if current == REMOTE_MEMBER:
                raise Refused(f"already consuming stream {stream!r} in a group")
            if current is not None and not self.groups.joined(connection, stream):
                raise Refused(f"already consuming stream {stream!r} as {current!r}")
            check_name("group name", message.group, self._max_name)
            remote = self.groups.remote
            if current is None and remote is not None and not connection.remote:
                check_join(message)
                if remote.join(connection, message, user):
                    if connection.consuming is None:
                        connection.consuming = {}
                    connection.consuming[stream] = REMOTE_MEMBER
                    return
            key = (stream, GROUP, message.group)
            self.groups.join(connection, message, self._positions.get(key), user)
            if connection.consuming is None:
                connection.consuming = {}
            connection.consuming[stream] = MEMBER
            return
        if current in (MEMBER, REMOTE_MEMBER):
            raise Refused(f"already consuming stream {stream!r} in a group")
        if current and current != name:
            raise Refused(f"already consuming stream {stream!r} as {current!r}")
        key = (stream, READER, name)
        known = self._positions.get(key)
        check_owner(known, user, f"consumer {name!r} of stream {stream!r}")
        owner = known.owner if known is not None else user
        if whence == mlm.RESUME:
            if known is None:
                seq = store.first_seq(stream) - 1
                self._streams.read_from(connection, stream, message.pattern, mlm.EARLIEST, 0)
            else:
                seq = known.seq
                self._streams.read_from(
                    connection, stream, message.pattern, mlm.SEQUENCE, known.seq + 1
                )
            self._save(key, seq, owner)
        else:
            self._streams.read_from(connection, stream, message.pattern, whence, message.position)
            self._reset(key, whence, message.position, store, owner)
        self._hold(connection, key)

    def _reset(self, key: Key, whence: int, position: int, store: Store, owner: str) -> None:
        """Move the consumer's position to just before C{whence}/C{position}."""
        stream = key[0]
        if whence == mlm.LATEST:
            self._save(key, store.last_seq(stream), owner)
        elif whence == mlm.EARLIEST:
            self._save(key, store.first_seq(stream) - 1, owner)
        elif whence == mlm.SEQUENCE:
            self._save(key, max(1, position) - 1, owner)
        else:  # TIME: the same lookup the read makes
            store.seq_at_time(stream, position / 1000.0).addCallbacks(
                lambda seq: self._save(key, seq - 1, owner),
                lambda failure: _log.failure(
                    "consumer {name!r} of {stream!r}: its position was not reset",
                    failure,
                    name=key[2],
                    stream=stream,
                ),
            )

    def _hold(self, connection: Connection, key: Key) -> None:
        holder = self._holders.get(key)
        stream, _, name = key
        if holder is not None and holder is not connection and not holder.gone:
            _log.info(
                "consumer {name!r} of stream {stream!r}: {new} takes it over from {old}",
                name=name,
                stream=stream,
                new=connection,
                old=holder,
            )
            self.takeovers += 1
            self._streams.cancel(holder, stream)
            if holder.consuming is not None:
                holder.consuming[stream] = TAKEN_OVER
        self._holders[key] = connection
        if connection.consuming is None:
            connection.consuming = {}
        connection.consuming[stream] = name

    # Acknowledgements

    def commit(self, connection: Connection, message: mlm.StreamCommit) -> None:
        """
        Acknowledge every record of C{message.stream} up to
        C{message.sequence} for C{connection}'s consumer; its session gets
        STREAM_COMMITTED once that is durable (or the refusal).
        """
        self.commits += 1
        stream, wanted = message.stream, message.sequence
        session = connection.session
        consuming = connection.consuming
        name = consuming.get(stream) if consuming else None
        store = self._store
        if name is None or store is None:
            session.committed(stream, wanted, mlm.FAILED, f"not a consumer of stream {stream!r}")
            return
        if name == MEMBER:
            if self.groups.joined(connection, stream):
                self.groups.commit(connection, message)
            else:
                session.committed(
                    stream,
                    wanted,
                    mlm.FAILED,
                    "no longer a member of the group (its lease expired, or it was taken over)",
                )
            return
        if name == REMOTE_MEMBER:
            if self.groups.remote is None:  # the pack stopped
                session.committed(stream, wanted, mlm.FAILED, "the pack is stopped")
            else:
                self.groups.remote.commit(connection, message)
            return
        if name == TAKEN_OVER:
            session.committed(
                stream, wanted, mlm.FAILED, "consumer taken over by another connection"
            )
            return
        key = (stream, READER, name)
        known = self._positions.get(key)
        seq = max(min(wanted, store.last_seq(stream)), known.seq if known is not None else 0)
        owner = known.owner if known is not None else connection.session.user or ""
        self._save(key, seq, owner, committed_answer(connection, stream, seq))

    def _save(
        self, key: Key, seq: int, owner: str, on_durable: DurableCallback | None = None
    ) -> None:
        stream, kind, name = key
        position = ConsumerPosition(stream, kind, name, seq, b"", self._clock.seconds(), owner)
        self._save_position(position, on_durable)

    def _save_position(
        self, position: ConsumerPosition, on_durable: DurableCallback | None = None
    ) -> None:
        key = (position.stream, position.kind, position.name)
        positions = self._positions
        positions[key] = position
        positions.move_to_end(key)
        assert self._store is not None
        self._store.save_consumer(position, on_durable)
        while len(positions) > self._limit:
            self._forget(next(iter(positions)))

    # Connections going

    def cancelled(self, connection: Connection, stream: str) -> None:
        """C{connection} stopped reading C{stream}: it holds its consumer there no more."""
        consuming = connection.consuming
        if not consuming:
            return
        name = consuming.pop(stream, None)
        if name == MEMBER:
            self.groups.leave(connection, stream)
        elif name == REMOTE_MEMBER:
            if self.groups.remote is not None:
                self.groups.remote.leave(connection, stream)
        elif name:
            key = (stream, READER, name)
            if self._holders.get(key) is connection:
                del self._holders[key]

    def forget_connection(self, connection: Connection) -> None:
        """C{connection} is gone: it holds no consumer any more."""
        consuming = connection.consuming
        if not consuming:
            return
        if MEMBER in consuming.values():
            self.groups.forget_connection(connection)
        for stream in list(consuming):
            self.cancelled(connection, stream)
        connection.consuming = None

    # Forgetting

    def sweep(self) -> None:
        """
        Give back the records of group members past their lease; forget the
        positions unused for longer than the time to live (not held now).
        """
        self.groups.sweep()
        limit = self._clock.seconds() - self._ttl
        positions = self._positions
        for key in list(positions):
            if positions[key].updated >= limit:
                break  # least recently used first: the rest are younger
            if not self._in_use(key):
                self._forget(key)

    def _in_use(self, key: Key) -> bool:
        """Whether a connection reads as consumer C{key} now (a reader, or a group's member)."""
        if key[1] == GROUP:
            group = self.groups.groups.get((key[0], key[2]))
            return group is not None and bool(group.members)
        return key in self._holders

    def _forget(self, key: Key) -> None:
        position = self._positions.pop(key)
        self._holders.pop(key, None)
        self.forgotten += 1
        if self._store is not None:
            self._store.forget_consumer(position)

    def pump(self, connection: Connection) -> None:
        """C{connection} may take more (credit, unstalled): its groups send it what waits."""
        consuming = connection.consuming
        if not consuming:
            return
        names = consuming.values()
        if MEMBER in names:
            self.groups.pump_connection(connection)
        if REMOTE_MEMBER in names and self.groups.remote is not None:
            self.groups.remote.pump(connection)

    def undelivered(self, connection: Connection, record: StreamRecord) -> bool:
        """A group's record sent to C{connection} did not go: first in line again."""
        consuming = connection.consuming
        name = consuming.get(record.stream) if consuming is not None else None
        if name == MEMBER:
            return self.groups.undelivered(connection, record)
        if name == REMOTE_MEMBER and self.groups.remote is not None:
            return self.groups.remote.undelivered(connection, record)
        return False

    # Listing

    def views(self) -> list[ConsumerView]:
        """Every consumer remembered, by stream and name."""
        views = []
        for key, p in sorted(self._positions.items()):
            holder = self._holders.get(key)
            last = self._streams.last_seq(p.stream)
            views.append(
                ConsumerView(
                    p.stream,
                    p.kind,
                    p.name,
                    p.seq,
                    last,
                    p.updated,
                    repr(holder) if holder is not None else None,
                )
            )
        return views
