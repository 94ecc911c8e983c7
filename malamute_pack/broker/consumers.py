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

Positions unused for C{ttl} seconds are forgotten (and logged); nothing
else forgets one. New names are refused past three bounds: C{limit} in all,
C{per_user} for each user (the anonymous clients count as one user), and
C{per_connection} made by one connection in its life. A name belongs to the
user who made it, and a flood of names from one client or user can neither
push another's position out nor take its name over.

Tests: ``tests/unit/test_broker_consumers.py``, ``tests/system/test_consumers.py``.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.connection import MEMBER, REMOTE_MEMBER, TAKEN_OVER, Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.groups import Groups, check_join, check_owner, committed_answer
from malamute_pack.broker.limits import check_name
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import Streams
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import GROUP, ORIGINS, READER, ConsumerPosition, StreamRecord
from malamute_pack.store import DurableCallback, Store

_log = Logger()

# A consumer's key: (stream, kind, name).
Key = tuple[str, str, str]


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
    members: tuple[str, ...] = ()  # a group's members (their names), in the order they joined

    @property
    def lag(self) -> int:
        """Records written after its position."""
        return max(0, self.last - self.position)


class Consumers:
    """
    The consumers the broker remembers, their positions and who holds them.

    @ivar commits: commits received.
    @ivar takeovers: consumers taken over by another connection.
    @ivar forgotten: positions forgotten (unused for C{ttl}).
    @ivar refused_names: new names refused past a limit.
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
        per_user: int = 1_000,
        per_connection: int = 100,
    ) -> None:
        self._clock = clock
        self._store = store
        self._streams = streams
        self._limit = limit
        self._per_user = per_user
        self._per_connection = per_connection
        self._ttl = ttl
        self._max_name = max_name
        # Least recently used first.
        self._positions: OrderedDict[Key, ConsumerPosition] = OrderedDict()
        self._holders: dict[Key, Connection] = {}
        # Names remembered per owner ("" for the anonymous clients).
        self._owned: Counter[str] = Counter()
        # In a pack, what groups acknowledged in origin terms, by (stream, group).
        self.origins: dict[tuple[str, str], ConsumerPosition] = {}
        self.groups = Groups(
            clock, store, streams, stalled, self._save_position, group_lease, max_unacked_bytes
        )
        self.commits = 0
        self.takeovers = 0
        self.forgotten = 0
        self.refused_names = 0

    def __len__(self) -> int:
        return len(self._positions)

    def restore(self, positions: Iterable[ConsumerPosition]) -> None:
        """
        Take the positions a journal kept (least recently used first),
        replacing any: all of them, even past the limits (which bound new names).
        """
        positions = list(positions)
        self._positions = OrderedDict(
            ((p.stream, p.kind, p.name), p) for p in positions if p.kind != ORIGINS
        )
        self._owned = Counter(p.owner for p in self._positions.values())
        self.origins = {(p.stream, p.name): p for p in positions if p.kind == ORIGINS}

    # What the pack's groups acknowledged in origin terms (kept, not a consumer)

    def keep_origins(self, stream: str, group: str, reset: int, acked: bytes) -> None:
        """
        Keep in the journal what C{group} of C{stream} acknowledged in origin
        terms (L{malamute_pack.pack.groups}): a broker that becomes its home
        after a restart passes over it still. Not a consumer of anyone's.
        """
        position = ConsumerPosition(stream, ORIGINS, group, reset, acked, self._clock.seconds())
        self.origins[(stream, group)] = position
        if self._store is not None:
            self._store.save_consumer(position, None)

    def forget_origins(self, stream: str, group: str) -> None:
        position = self.origins.pop((stream, group), None)
        if position is not None and self._store is not None:
            self._store.forget_consumer(position)

    def _admit(self, connection: Connection, key: Key, user: str) -> None:
        """
        Refuse C{connection} (of C{user}) a new name C{key} past the limits:
        the connection's, the user's, then the broker's. Nothing is ever
        forgotten to make room.
        """
        stream, kind, name = key
        what = f"{'group' if kind == GROUP else 'consumer'} {name!r} of stream {stream!r}"
        if connection.new_consumers >= self._per_connection:
            reason = (
                f"too many consumers: this connection made {connection.new_consumers}"
                f" (malamute/limits/consumers-per-connection); {what} is not made"
            )
        elif self._owned[user] >= self._per_user:
            who = f"user {user!r}" if user else "the anonymous clients"
            reason = (
                f"too many consumers: {who} have {self._owned[user]}"
                f" (malamute/limits/consumers-per-user); {what} is not made"
            )
        elif len(self._positions) >= self._limit:
            reason = (
                f"too many consumers: the broker remembers {len(self._positions)}"
                f" (malamute/limits/consumers); {what} is not made"
            )
        else:
            return
        self.refused_names += 1
        _log.info("{connection}: {reason}", connection=connection, reason=reason)
        raise Refused(reason)

    def position(self, stream: str, name: str) -> ConsumerPosition | None:
        """The position of reader C{name} on C{stream}, if it is remembered."""
        return self._positions.get((stream, READER, name))

    # Reading as a consumer

    def consume(self, connection: Connection, message: mlm.StreamConsume) -> None:
        """
        Make C{connection} read C{message.stream} as consumer
        C{message.consumer}: from after its position (whence RESUME; from
        the earliest record retained for a consumer not known, told of a
        numbering started again if C{message.position}, the number after
        the last record the client was handed, is past the stream's), or
        from another whence, which resets its position there.
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
            known = self._positions.get(key)
            new = known is None and (stream, message.group) not in self.groups.groups
            if new:
                check_join(message)  # a bad join is refused for what it is, first
                self._admit(connection, key, user)
            self.groups.join(connection, message, known, user)
            self._tell_if_renumbered(connection, message)
            if new:
                connection.new_consumers += 1
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
        if known is None:
            self._admit(connection, key, user)
        owner = known.owner if known is not None else user
        if whence == mlm.RESUME:
            if known is None:
                self._tell_if_renumbered(connection, message)
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
        if known is None:
            connection.new_consumers += 1
        self._hold(connection, key)

    def _tell_if_renumbered(self, connection: Connection, message: mlm.StreamConsume) -> None:
        """
        A consumer resuming with the number after the last record its client
        was handed is told if the stream's numbering started again since
        (L{Streams.resume_point}: its position is from before).
        """
        if message.whence == mlm.RESUME and message.position:
            self._streams.resume_point(connection, message.stream, message.position)

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
        last = store.last_seq(stream)
        if wanted > last:
            # A number this stream never gave: the client's, from a
            # numbering since started again (a journal started afresh; sent
            # again after the reconnection), must not move the position
            # over the new numbering's records (found by the soak).
            session.committed(
                stream,
                wanted,
                mlm.FAILED,
                f"record {wanted} is past the last record of stream {stream!r} ({last}): "
                "not one this broker gave (its numbers may have started again)",
            )
            return
        key = (stream, READER, name)
        known = self._positions.get(key)
        # Clamped to what this connection was sent: a commit of a number it
        # was not sent yet passes over nothing it was not given.
        sent = self._streams.sent_through(connection, stream)
        seq = max(min(wanted, sent), known.seq if known is not None else 0)
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
        if key not in positions:
            self._owned[position.owner] += 1
        positions[key] = position
        positions.move_to_end(key)
        assert self._store is not None
        self._store.save_consumer(position, on_durable)

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
                _, kind, name = key
                _log.info(
                    "{kind} {name!r} of stream {stream!r} forgotten: unused for {ttl:g}s"
                    " (malamute/limits/consumer-ttl), its position was {seq}",
                    kind="group" if kind == GROUP else "consumer",
                    name=name,
                    stream=key[0],
                    ttl=self._ttl,
                    seq=positions[key].seq,
                )
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
        owned = self._owned
        owned[position.owner] -= 1
        if owned[position.owner] <= 0:
            del owned[position.owner]
        self.forgotten += 1
        if self._store is not None:
            self._store.forget_consumer(position)

    def pump(self, connection: Connection) -> None:
        """C{connection} may take more (credit, unstalled): its groups send it what waits."""
        if not connection.consuming:
            return
        # Each pumps only the memberships with records waiting for it.
        self.groups.pump_connection(connection)
        if self.groups.remote is not None:
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
        groups = self.groups.groups
        for key, p in sorted(self._positions.items()):
            holder = self._holders.get(key)
            holding = repr(holder) if holder is not None else None
            members: tuple[str, ...] = ()
            if p.kind == GROUP:
                group = groups.get((p.stream, p.name))
                if group is not None and group.members:
                    members = tuple(group.members)
                    holding = ", ".join(repr(m.connection) for m in group.members.values())
            last = self._streams.last_seq(p.stream)
            views.append(
                ConsumerView(
                    p.stream,
                    p.kind,
                    p.name,
                    p.seq,
                    last,
                    p.updated,
                    holding,
                    members,
                )
            )
        return views
