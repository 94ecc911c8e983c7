"""
Consumer groups: readers that join a stream under one group name share its
records, each record to exactly one member, in order per subject
(STREAM_CONSUME with a group; docs/protocol.md "Consumer groups").

A group reads the stream as one reader of the streams
(L{Streams.read_from}) through its own L{GroupSession}: live records and
records read back from the journal reach it in sequence order, and
whatever it cannot take now (its members' queues are full) it reads again
later from the journal, as any reader that falls behind. It hands each
record to a member: the member already holding records of that subject
(so a subject's records are never handled by two members at once), else
the member the subject's rendezvous hash picks. A member that joins takes
over, from the others, the records waiting to be sent of the subjects it
wins that nobody is handling (none sent and unacknowledged), and the
others as soon as their member has acknowledged what it was sent of them:
a backlog is shared with new members. A member gets what it was assigned
while it has credit; it acknowledges with STREAM_COMMIT (every record it
was sent up to a sequence number; a sequence number it was never sent,
above the group's position, is refused). A member that leaves (closes,
cancels, expires) or keeps records assigned to it, sent or not, without
acknowledging any for the lease gives its records back to the group, which
assigns them again in sequence order before any later record of their
subjects: a member that stops granting credit cannot stall its group.

The group's durable position is the sequence number below which every
record was acknowledged (or was not the group's) and the records
acknowledged past it (a roaring bitmap), saved on each commit
(L{Store.save_consumer}, kind C{group}); a group whose members are all gone
resumes from there, the unacknowledged records delivered again.

In a pack a group has one home broker (L{malamute_pack.pack.groups}): the
model asks its L{RemoteGroups} whether a joining client's group lives on
another broker, and hands it what such a member sends; at the home, a
member on another broker is a connection like any other.

Tests: ``tests/unit/test_broker_groups.py``.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from pyroaring import BitMap64
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from malamute_pack.broker.access import NOT_ALLOWED
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.session import PartySession
from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import Streams, check_pattern
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import GROUP, ConsumerPosition, StreamRecord
from malamute_pack.store import DurableCallback, Store, StoreError

_log = Logger()

# A member's queue of records assigned and not sent yet (it has no credit),
# in records and content bytes (one record always fits): when one is full,
# the group takes nothing more and reads it again later.
MAX_PENDING = 256
MAX_PENDING_BYTES = 4 * 1024 * 1024


# Records taken past the floor whose origin numbers a group keeps in a pack:
# past that the oldest are forgotten (the position in origin terms then lags,
# which can only make another home deliver more again, never skip).
MAX_TAKEN = 65_536

# How far below the position a member's own acknowledgements are remembered
# (sequence numbers; at most two roaring containers, 16 KiB, per member): a
# commit sent again (after a reconnection) of one of them is answered as
# done; of a record another member acknowledged, refused.
ACK_MEMORY = 65_536

# The whence a member may join with: its group's position, or a reset.
_RESETS = frozenset({mlm.RESUME, mlm.LATEST, mlm.EARLIEST, mlm.SEQUENCE})


def _weight(member: str, subject: str) -> bytes:
    """The rendezvous weight of C{member} for C{subject}."""
    return hashlib.blake2b(f"{member}\x00{subject}".encode(), digest_size=8).digest()


def check_join(message: mlm.StreamConsume) -> None:
    """Refuse a join with a bad pattern or a position a group cannot start from."""
    check_pattern(message.pattern)
    if message.whence not in _RESETS:
        raise Refused(
            "invalid position: a group starts from its position, or resets to"
            " latest, earliest or a sequence number"
        )


class RemoteGroups(Protocol):
    """
    The groups whose home is another broker of a pack, as the model sees
    them (L{malamute_pack.pack.groups.PackGroups}; None outside a pack).
    """

    def join(self, connection: Connection, message: mlm.StreamConsume, user: str) -> bool:
        """Join C{connection} to its group at the group's home if that is elsewhere; False: here."""

    def commit(self, connection: Connection, message: mlm.StreamCommit) -> None:
        """A member here whose group lives elsewhere acknowledges."""

    def leave(self, connection: Connection, stream: str) -> None:
        """A member here whose group lives elsewhere left it."""

    def pump(self, connection: Connection) -> None:
        """A member here whose group lives elsewhere may take more."""

    def undelivered(self, connection: Connection, record: StreamRecord) -> bool:
        """A record for a member here whose group lives elsewhere did not go: again first."""

    def ended(self, connection: Connection, stream: str, reason: str) -> None:
        """A member of a group here (another broker's client) lost its place: it hears."""

    def acknowledged(self, stream: str, group: str) -> dict[str, int] | None:
        """What other homes of the group acknowledged, per origin ("" for this broker)."""

    def covers(self, stream: str, origin: str, after: int) -> bool:
        """
        Whether this broker's copy of C{stream} holds every record of
        C{origin} (a peer's id) numbered past C{after} there (a copy
        started afresh may lack a peer's older records).
        """

    def saved(self, group: Group) -> None:
        """The position of C{group} (its home is here) was saved: the pack hears it."""

    def reset(self, group: Group) -> None:
        """C{group} (its home is here) was reset: what it acknowledged before counts no more."""


def check_owner(known: ConsumerPosition | None, user: str, what: str) -> None:
    """Refuse (403) C{user} a consumer another user owns (C{known}'s owner)."""
    if known is not None and known.owner and known.owner != user:
        raise Refused(f"not allowed: {what} belongs to another user", NOT_ALLOWED)


def committed_answer(connection: Connection, stream: str, sequence: int) -> DurableCallback:
    """What tells C{connection} its commit up to C{sequence} is durable, or failed."""
    session = connection.session

    def durable(error: StoreError | None) -> None:
        if connection.gone:
            return
        if error is None:
            session.committed(stream, sequence, mlm.SUCCESS, "")
        else:
            session.committed(stream, sequence, mlm.FAILED, error.reason)

    return durable


# A record a member holds, with its content's size in bytes.
Held = tuple[StreamRecord, int]


@dataclass(eq=False)
class Member:
    """
    One member of a group: its connection, what it waits to be sent
    (C{pending}, in the order assigned) and what it was sent and has not
    acknowledged (C{unacked}, by sequence number in the order sent).
    """

    name: str
    connection: Connection
    stream: str
    pending: deque[Held] = field(default_factory=deque)
    pending_bytes: int = 0
    unacked: dict[int, Held] = field(default_factory=dict)
    unacked_bytes: int = 0
    # Since when it holds records (assigned, sent or not) without having
    # acknowledged any: its lease counts from there (None: it holds none).
    holding_since: float | None = None

    def holds(self) -> int:
        return len(self.pending) + len(self.unacked)


class Group:
    """
    One group on one stream: its members, who holds which subject, and its
    position.
    """

    def __init__(self, groups: Groups, stream: str, name: str, pattern: str, owner: str) -> None:
        self.stream = stream
        self.name = name
        self.pattern = pattern
        self.owner = owner  # the user who may join it ("" for anyone)
        self._groups = groups
        self.members: dict[str, Member] = {}
        # Per subject, the member holding records of it and how many.
        self.holders: dict[str, list[Any]] = {}  # [Member, int]
        self.assigned = BitMap64()  # records assigned and not acknowledged
        self.acked = BitMap64()  # records acknowledged past the position
        # Per member name, the records it acknowledged, past the position and
        # up to ACK_MEMORY below it (a commit of one again is answered as
        # done; of any other, refused: found by the soak, a record given back
        # and acknowledged by another member was answered 200 to the member
        # it was taken from, so two members had it acknowledged).
        self.acked_by: dict[str, BitMap64] = {}
        # What was acknowledged at or below this number before this broker
        # knew who acknowledged it (the group restored from its position,
        # reset, or started): a commit of it is answered as done.
        self.known_from = 0
        # Subjects waiting at a member that is not the one their hash picks
        # (they were being handled when a member joined): they move once
        # their member has acknowledged what it was sent of them.
        self.unsettled: set[str] = set()
        self.seen = 0  # the last record the group took
        # It reads records once durable: a record whose write fails never
        # reaches a member (its retry, at a new number, would reach another).
        self.reader = Connection(GroupSession(self), "", 0.0, internal=True, durable=True)
        self.reading = False
        # In a pack, the position also in origin terms (portable to another
        # home): per origin ("" for this broker), the highest origin
        # sequence number of a record acknowledged at or below the floor
        # (vector), records taken past the floor with their origin number
        # (taken), and what another home acknowledged (skip), passed over.
        self.vector: dict[str, int] = {}
        self.taken: deque[tuple[int, str, int]] | None = None
        self.skip: dict[str, int] | None = None
        # Whether this home's copy holds every record of a peer origin past
        # what other homes acknowledged when the group came here (None:
        # not in a pack): only then does its vector for that origin move
        # past that (else the next home would pass over records this one
        # never had: found by the soak, a home on a journal started afresh).
        self.covers: Callable[[str, int], bool] | None = None
        self._from: dict[str, int] = {}
        self._covered: dict[str, bool] = {}

    def track_origins(self, acknowledged: dict[str, int] | None) -> None:
        """
        Keep the position in origin terms too, from C{acknowledged} (what
        another home of the group acknowledged, per origin): those records
        are passed over.
        """
        self.taken = deque()
        self._from = dict(acknowledged or {})
        self._covered = {}
        if acknowledged:
            self.learn(acknowledged)

    def _covers(self, origin: str) -> bool:
        """Whether this home's vector for C{origin} may move past what it learned."""
        covered = self._covered.get(origin)
        if covered is None:
            covers = self.covers
            covered = not origin or covers is None or covers(origin, self._from.get(origin, 0))
            self._covered[origin] = covered
        return covered

    def learn(self, acknowledged: dict[str, int]) -> None:
        """Records acknowledged at another home of the group (per origin) are passed over."""
        skip = self.skip if self.skip is not None else {}
        vector = self.vector
        for origin, seq in acknowledged.items():
            if seq > skip.get(origin, 0):
                skip[origin] = seq
            if seq > vector.get(origin, 0):
                vector[origin] = seq
        self.skip = skip

    @property
    def floor(self) -> int:
        """Every record up to this one is acknowledged (or not the group's)."""
        assigned = self.assigned
        return min(assigned.min() - 1, self.seen) if assigned else self.seen

    def position(self, updated: float) -> ConsumerPosition:
        floor = self.floor
        acked = self.acked
        if acked and acked.min() <= floor:
            acked.remove_range(0, floor + 1)
        forget = floor + 1 - ACK_MEMORY
        if forget > 0:
            by = self.acked_by
            for name, mine in list(by.items()):
                if mine.min() < forget:
                    mine.remove_range(0, forget)
                    if not mine:
                        del by[name]
        data = acked.serialize() if acked else b""
        taken = self.taken
        if taken:
            vector = self.vector
            while taken and taken[0][0] <= floor:
                _, origin, origin_seq = taken.popleft()
                if origin_seq > vector.get(origin, 0) and self._covers(origin):
                    vector[origin] = origin_seq
        return ConsumerPosition(self.stream, GROUP, self.name, floor, data, updated, self.owner)

    def restore(self, position: ConsumerPosition) -> None:
        self.seen = self.known_from = position.seq
        self.acked = BitMap64.deserialize(position.acked) if position.acked else BitMap64()

    # Taking records (the group's reader)

    def take(self, record: StreamRecord) -> bool:
        """
        Assign C{record} to a member; False if the member it goes to has no
        room (the group reads it again later).
        """
        seq = record.seq
        if seq <= self.seen or seq in self.acked:
            return True  # acknowledged before (a resume from the position)
        skip = self.skip
        if skip is not None:
            origin = record.origin
            if (record.origin_seq if origin else seq) <= skip.get(origin, 0):
                self.seen = seq  # acknowledged at another home
                return True
        holder = self.holders.get(record.subject)
        member: Member | None = holder[0] if holder is not None else self._choose(record.subject)
        if member is None:
            return False
        pending = member.pending
        if pending and (len(pending) >= MAX_PENDING or member.pending_bytes >= MAX_PENDING_BYTES):
            return False
        self._assign(member, record, sum(map(len, record.content)))
        self.seen = seq
        taken = self.taken
        if taken is not None:
            taken.append((seq, record.origin, record.origin_seq or seq))
            if len(taken) > MAX_TAKEN:
                taken.popleft()
        self._groups.pump(member)
        return True

    def _choose(self, subject: str) -> Member | None:
        members = self.members
        if not members:
            return None
        return max(members.values(), key=lambda m: _weight(m.name, subject))

    def _assign(self, member: Member, record: StreamRecord, size: int) -> None:
        self._groups.waiting(member, (record, size))
        self.assigned.add(record.seq)
        holder = self.holders.get(record.subject)
        if holder is None:
            self.holders[record.subject] = [member, 1]
        else:
            holder[1] += 1

    def _release(self, record: StreamRecord) -> None:
        holder = self.holders[record.subject]
        if holder[1] > 1:
            holder[1] -= 1
        else:
            del self.holders[record.subject]

    # Members

    def leave(self, member: Member) -> None:
        """C{member} is gone: its records, sent or not, are assigned again in order."""
        del self.members[member.name]
        held = sorted([*member.unacked.values(), *member.pending], key=lambda h: h[0].seq)
        member.unacked.clear()
        member.pending.clear()
        member.unacked_bytes = member.pending_bytes = 0
        member.holding_since = None
        self._groups.not_waiting(member)
        for record, _ in held:
            self._release(record)
        if not self.members:
            return  # still assigned: the position stays before them
        for record, size in held:
            holder = self.holders.get(record.subject)
            target = holder[0] if holder is not None else self._choose(record.subject)
            assert target is not None
            self._assign(target, record, size)
        for other in list(self.members.values()):
            self._groups.pump(other)

    def rebalance(self, member: Member, subjects: set[str] | None = None) -> list[Member]:
        """
        Move what waits at C{member} to be sent (of C{subjects}, or of every
        subject) to the member its subject's hash picks now, where C{member}
        is handling none of that subject (none sent and unacknowledged): a
        subject changes hands only between its records. Subjects still
        being handled stay, noted as unsettled. The members given records.
        """
        pending = member.pending
        if not pending:
            return []
        in_flight = {record.subject for record, _ in member.unacked.values()}
        unsettled = self.unsettled
        targets: dict[str, Member] = {}
        stay: deque[Held] = deque()
        moved: list[tuple[Member, Held]] = []
        for held in pending:
            subject = held[0].subject
            if subjects is not None and subject not in subjects:
                stay.append(held)
                continue
            target = targets.get(subject)
            if target is None:
                target = targets[subject] = self._choose(subject) or member
            if target is member:
                unsettled.discard(subject)
                stay.append(held)
            elif subject in in_flight:
                unsettled.add(subject)
                stay.append(held)
            else:
                unsettled.discard(subject)
                moved.append((target, held))
        if not moved:
            return []
        member.pending = stay
        member.pending_bytes = sum(size for _, size in stay)
        if not member.holds():
            member.holding_since = None
        given: list[Member] = []
        for target, held in moved:
            self.holders[held[0].subject][0] = target
            self._groups.waiting(target, held)
            if target not in given:
                given.append(target)
        return given

    def acknowledged_by(self, member: Member, seq: int) -> bool:
        """
        Whether C{member} acknowledged C{seq} (a commit of it again is done):
        it did, as remembered; or it is older than this broker's memory of
        who did (L{known_from}, L{ACK_MEMORY}); or, in a pack, it is below
        the position (a group there is at least once across homes, and
        records another home acknowledged are passed over unremembered).
        """
        mine = self.acked_by.get(member.name)
        if mine is not None and seq in mine:
            return True
        floor = self.floor
        if seq > floor:
            return False
        return self.taken is not None or seq <= self.known_from or seq <= floor - ACK_MEMORY

    def acknowledge(self, member: Member, upto: int) -> None:
        """
        C{member} processed record C{upto} and every record it was sent
        before it (in the order sent, which is the order it received them:
        a record given back by another member may come after later ones).
        """
        unacked = member.unacked
        if upto not in unacked:
            return  # acknowledged already, or never sent to it
        done = []
        for seq in unacked:
            done.append(seq)
            if seq == upto:
                break
        release = self._release
        freed = 0
        for seq in done:
            record, size = unacked.pop(seq)
            freed += size
            release(record)
        member.unacked_bytes -= freed
        acked = BitMap64(done)
        self.assigned -= acked
        self.acked |= acked
        mine = self.acked_by.get(member.name)
        if mine is None:
            self.acked_by[member.name] = acked
        else:
            mine |= acked
        # It acknowledged: its lease starts again (or it holds nothing now).
        member.holding_since = self._groups.now() if member.holds() else None


class GroupSession(PartySession):
    """The session of a group's reader: what the stream delivers, the group assigns."""

    def __init__(self, group: Group) -> None:
        self.group = group

    def deliver_stream(self, record: StreamRecord) -> bool:
        return self.group.take(record)

    def __repr__(self) -> str:
        return f"<group {self.group.name!r} of stream {self.group.stream!r}>"


class Groups:
    """
    Every consumer group of the broker.

    @ivar expired: members whose lease expired (records given back).
    """

    def __init__(
        self,
        clock: IReactorTime,
        store: Store | None,
        streams: Streams,
        stalled: Stalled,
        save: Callable[[ConsumerPosition, DurableCallback | None], None],
        lease: float,
        max_unacked_bytes: int,
    ) -> None:
        self._clock = clock
        self._store = store
        self._streams = streams
        self._stalled = stalled
        self._save = save
        self._lease = lease
        self._max_unacked_bytes = max_unacked_bytes
        self.groups: dict[tuple[str, str], Group] = {}
        # Where groups homed on another broker of a pack are joined (a pack's).
        self.remote: RemoteGroups | None = None
        # A connection's membership per stream.
        self._members: dict[tuple[Connection, str], tuple[Group, Member]] = {}
        # Per connection, its members with records waiting to be sent: what
        # its credit pumps (not every membership it has).
        self._waiting: dict[Connection, set[Member]] = {}
        self.expired = 0

    def now(self) -> float:
        return self._clock.seconds()

    def waiting(self, member: Member, held: Held, first: bool = False) -> None:
        """C{held} waits to be sent to C{member} (at the end, or C{first} in line)."""
        if first:
            member.pending.appendleft(held)
        else:
            member.pending.append(held)
        member.pending_bytes += held[1]
        if member.holding_since is None:
            member.holding_since = self.now()  # its lease counts from the assignment
        connection = member.connection
        waiting = self._waiting.get(connection)
        if waiting is None:
            self._waiting[connection] = {member}
        else:
            waiting.add(member)

    def waiting_members(self) -> int:
        """Memberships with records waiting for their connection's credit (all connections)."""
        return sum(map(len, self._waiting.values()))

    def not_waiting(self, member: Member) -> None:
        """Nothing waits to be sent to C{member} any more."""
        waiting = self._waiting.get(member.connection)
        if waiting is not None:
            waiting.discard(member)
            if not waiting:
                del self._waiting[member.connection]

    def joined(self, connection: Connection, stream: str) -> bool:
        return (connection, stream) in self._members

    def join(
        self,
        connection: Connection,
        message: mlm.StreamConsume,
        known: ConsumerPosition | None,
        user: str,
    ) -> None:
        """
        Make C{connection} (authenticated as C{user}, "" for none) member
        C{message.consumer} of group C{message.group} on C{message.stream}.
        """
        stream, name = message.stream, message.group
        store = self._store
        assert store is not None
        if (connection, stream) in self._members:
            raise Refused(f"already consuming stream {stream!r}")
        # Refused before anything changes.
        check_join(message)
        group = self.groups.get((stream, name))
        what = f"group {name!r} of stream {stream!r}"
        if group is None:
            check_owner(known, user, what)
            owner = known.owner if known is not None else user
            group = Group(self, stream, name, message.pattern, owner)
            self.groups[(stream, name)] = group
            if known is not None:
                group.restore(known)
            else:
                group.seen = group.known_from = store.first_seq(stream) - 1
            if self.remote is not None:
                group.covers = partial(self.remote.covers, stream)
                group.track_origins(self.remote.acknowledged(stream, name))
        elif group.owner and group.owner != user:
            raise Refused(f"not allowed: {what} belongs to another user", NOT_ALLOWED)
        elif group.pattern != message.pattern:
            raise Refused(
                f"group {name!r} of stream {stream!r} reads {group.pattern!r}, not"
                f" {message.pattern!r}"
            )
        if not group.members and message.whence != mlm.RESUME:
            self._reset(group, message.whence, message.position, store)
        previous = group.members.get(message.consumer)
        if previous is not None:
            self._leave(previous.connection, stream)
            self._ended(previous.connection, stream, "another connection joined as this member")
            # Its only member gone, the group was let go: it is this one still.
            self.groups[(stream, name)] = group
        member = Member(message.consumer, connection, stream)
        group.members[member.name] = member
        self._members[(connection, stream)] = (group, member)
        # A backlog waiting at the others is shared: the subjects it wins go
        # to it (sent once it is answered: the state table pumps after OK).
        for other in list(group.members.values()):
            if other is not member:
                group.rebalance(other)
        if not group.reading:
            group.reading = True
            reader = group.reader
            reader.stalled = False
            if message.whence == mlm.LATEST:
                # Reset to the latest: live from now, as a reader from the
                # latest (the same as from the next number here; in a pack,
                # no history asked of the peers).
                self._streams.read_from(reader, stream, group.pattern, mlm.LATEST, 0)
            else:
                self._streams.read_from(reader, stream, group.pattern, mlm.SEQUENCE, group.seen + 1)
            self._streams.resume(reader, stream)
        self.save(group)

    def _reset(self, group: Group, whence: int, position: int, store: Store) -> None:
        stream = group.stream
        group.acked = BitMap64()
        group.acked_by = {}
        if group.taken is not None and self.remote is not None:
            # What was acknowledged anywhere before counts no more.
            group.track_origins(None)
            group.vector = {}
            group.skip = None
            self.remote.reset(group)
        if whence == mlm.LATEST:
            group.seen = store.last_seq(stream)
        elif whence == mlm.EARLIEST:
            group.seen = store.first_seq(stream) - 1
        else:
            group.seen = max(1, position) - 1
        group.known_from = group.seen

    def leave(self, connection: Connection, stream: str) -> None:
        """C{connection} stopped reading C{stream}: it leaves its group there."""
        self._leave(connection, stream)

    def _leave(self, connection: Connection, stream: str) -> None:
        found = self._members.pop((connection, stream), None)
        if found is None:
            return
        group, member = found
        group.leave(member)
        if not group.members:
            # Nobody to hand records to: stop reading, and read again from
            # the position when a member comes (the unacknowledged again).
            group.reading = False
            group.seen = group.floor
            group.assigned = BitMap64()
            group.holders.clear()
            group.unsettled.clear()
            self._streams.cancel(group.reader, stream)
            # Its position is kept (the consumers'); the group is made again on a join.
            del self.groups[(stream, group.name)]
        self.save(group)
        self._resume(group)

    def forget_connection(self, connection: Connection) -> None:
        for stream in list(connection.consuming or ()):
            self._leave(connection, stream)

    def commit(self, connection: Connection, message: mlm.StreamCommit) -> None:
        """
        A member acknowledges record C{message.sequence} and those it was
        sent before it. A record it was never sent, or not acknowledged by
        it before (L{Group.acknowledged_by}), is refused: 300.
        """
        stream, upto = message.stream, message.sequence
        group, member = self._members[(connection, stream)]
        if upto in member.unacked:
            group.acknowledge(member, upto)
        elif not group.acknowledged_by(member, upto):
            connection.session.committed(
                stream,
                upto,
                mlm.FAILED,
                f"record {upto} of stream {stream!r} was not delivered to member"
                f" {member.name!r} of group {group.name!r} (or it was given back)",
            )
            return
        self.save(group, committed_answer(connection, stream, upto))
        if group.unsettled and member.pending:
            for target in group.rebalance(member, set(group.unsettled)):
                self.pump(target)
        self.pump(member)
        self._resume(group)

    def save(self, group: Group, on_durable: DurableCallback | None = None) -> None:
        self._save(group.position(self.now()), on_durable)
        if group.taken is not None and self.remote is not None:
            self.remote.saved(group)

    # Delivery to members

    def pump(self, member: Member) -> None:
        """Send C{member} what it was assigned while it can take it."""
        connection = member.connection
        pending = member.pending
        unacked = member.unacked
        deliver = connection.session.deliver_stream
        limit = self._max_unacked_bytes
        while pending and connection.can_take() and member.unacked_bytes <= limit:
            held = pending[0]
            record, size = held
            if not deliver(record):
                self._stalled.add(connection)
                break
            pending.popleft()
            connection.took()
            member.pending_bytes -= size
            unacked[record.seq] = held
            member.unacked_bytes += size
        if not pending:
            self.not_waiting(member)

    def pump_connection(self, connection: Connection) -> None:
        """
        C{connection} may take more (credit, unstalled): pump its
        memberships that have records waiting (only those: a connection in
        many groups pays per membership that changed, not per membership).
        """
        waiting = self._waiting.get(connection)
        if not waiting:
            return
        for member in list(waiting):
            found = self._members.get((connection, member.stream))
            if found is None or found[1] is not member:
                self.not_waiting(member)
                continue
            self.pump(member)
            self._resume(found[0])

    def undelivered(self, connection: Connection, record: StreamRecord) -> bool:
        """
        C{record}, sent to member C{connection}, could not go after all: it
        is first in line again. False if it was not a group's record.
        """
        found = self._members.get((connection, record.stream))
        if found is None or record.seq not in found[1].unacked:
            return False
        member = found[1]
        held = member.unacked.pop(record.seq)
        member.unacked_bytes -= held[1]
        self.waiting(member, held, first=True)
        if connection.credit is not None:
            connection.credit += 1
        self._stalled.add(connection)
        return True

    def _resume(self, group: Group) -> None:
        """The group may take records again: read on from where it fell behind."""
        if group.reading and group.reader.behind:
            self._streams.resume(group.reader, group.stream)

    # Leases

    def sweep(self) -> None:
        """Give back the records of members holding one unacknowledged past the lease."""
        if self._lease <= 0:
            return
        limit = self.now() - self._lease
        for (connection, stream), (group, member) in list(self._members.items()):
            since = member.holding_since
            if since is not None and since < limit and len(group.members) > 1:
                _log.info(
                    "group {group!r} of stream {stream!r}: member {member!r} held a record"
                    " unacknowledged past its lease of {lease:g}s; its records go to the others",
                    group=group.name,
                    stream=stream,
                    member=member.name,
                    lease=self._lease,
                )
                self.expired += 1
                self._leave(connection, stream)
                self._ended(connection, stream, "its lease expired")

    def _ended(self, connection: Connection, stream: str, reason: str) -> None:
        """C{connection} lost its place in a group unasked: a remote member's broker hears."""
        if connection.remote and self.remote is not None:
            self.remote.ended(connection, stream, reason)
