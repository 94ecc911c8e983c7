"""
Consumer groups whose members are on several brokers of a pack
(docs/pack.md, "Consumer groups in a pack").

Each group (a stream and a group name) has one home: of this broker and
its peers, the one whose rendezvous weight for the group is highest, so
every broker that sees the same pack picks the same home without asking.
The group lives there as on a single broker (L{malamute_pack.broker.groups}):
its reader, its position and who holds which subject. A client of another
broker that joins it is a member there through its broker:

- on the member's broker, a L{Membership} passes the client's commits and
  departure to the home and gives the client the records the home assigns
  it (at most L{WINDOW} waiting here: the home sends more as the client
  takes them);
- on the home, a L{RemoteMember} session is that client, as a connection
  of the home's model: the group hands it records and answers its commits
  as it does a local client's.

When the brokers of the pack change, every broker moves the memberships
whose group has another home now (its own clients', and its local groups'
members) to the new home. Each broker numbers its copy of a stream its own
way, so a home also keeps its group's position in origin terms, the same
on every broker: per origin broker, the highest origin sequence number at
or below which every record of the group is acknowledged. It tells the
pack once a second when that changed (GROUP_POSITION); every broker keeps
the latest it heard, in memory and in its journal (once a second, as a
position of kind C{origins}: restarted, a broker still knows it), and a
new home resumes the group from its
own saved position (or its copy's earliest record) passing over every
record those say was acknowledged. Records acknowledged past that point at the old home
may be delivered again; none is skipped.

Socket-free: messages go through each peer's L{PeerOutbox}.

Tests: ``tests/unit/test_pack_groups.py``, ``tests/system/test_pack_groups.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.errors import Refused
from malamute_pack.broker.groups import Group
from malamute_pack.broker.limits import check_name
from malamute_pack.broker.log_limit import LogLimit
from malamute_pack.broker.session import PartySession
from malamute_pack.pack.outbox import PeerOutbox
from malamute_pack.pack.peer_broker import PeerBroker, count_refusal
from malamute_pack.protocol import mlm, packlink
from malamute_pack.protocol.records import StreamRecord

_log = Logger()

# Records a home may send a member on another broker before that member's
# client took them (what waits on the member's broker, per member).
WINDOW = 1024
# The member's broker gives the home credit back in steps of this many.
_REGRANT = WINDOW // 4

# How often a home tells the pack what its groups acknowledged (when it changed).
SHIP_INTERVAL = 1.0
# What is kept of what groups acknowledged, in (origin, number) entries of all
# groups (about 100 bytes each): past that the least recently changed group's
# is forgotten (a new home of it then delivers more again, never less).
MAX_VECTOR_ENTRIES = 100_000

# A member across the pack: (its broker's or its home's origin id, stream, group, member).
Key = tuple[str, str, str, str]


def home_weight(broker_id: str, stream: str, group: str) -> bytes:
    """The rendezvous weight of broker C{broker_id} to be the home of C{group} of C{stream}."""
    text = f"{broker_id}\x00{stream}\x00{group}".encode()
    return hashlib.blake2b(text, digest_size=8).digest()


@dataclass
class Acknowledged:
    """
    What a group acknowledged in origin terms: per origin broker, the
    highest origin sequence number at or below which every record of the
    group is acknowledged, since the group was last reset (at C{reset}, µs
    since the epoch; 0: never).
    """

    reset: int
    vector: dict[str, int]


@dataclass(eq=False)
class Membership:
    """A client here that is a member of a group whose home is a peer."""

    connection: Connection
    stream: str
    group: str
    member: str
    pattern: str
    home: str  # the home's origin id
    # Records the home sent, waiting for the client's credit, and their content's bytes.
    waiting: deque[StreamRecord] = field(default_factory=deque)
    waiting_bytes: int = 0
    taken: int = 0  # records the client took since credit was last given back

    @property
    def key(self) -> Key:
        return (self.home, self.stream, self.group, self.member)


class RemoteMember(PartySession):
    """
    On a group's home, a member whose client is on another broker: what
    the group hands it goes to that broker (GROUP_RECORD), and so does the
    answer to its commits (GROUP_COMMITTED).
    """

    def __init__(
        self, outbox: PeerOutbox, peer: str, stream: str, group: str, member: str, user: str
    ) -> None:
        self._outbox = outbox
        self.peer = peer
        self.stream = stream
        self.group = group
        self.member = member
        self.user = user
        self.connection: Connection | None = None

    def __repr__(self) -> str:
        return f"<member {self.member!r} of group {self.group!r} on {self.peer}>"

    def deliver_stream(self, record: StreamRecord) -> bool:
        frames = packlink.encode_group_record(
            record.stream,
            self.group,
            self.member,
            record.seq,
            int(record.timestamp * 1_000_000),
            record.sender,
            record.subject,
            record.content,
        )
        return self._outbox.deliver(frames)

    def committed(self, stream: str, sequence: int, code: int, reason: str) -> None:
        message = packlink.GroupCommitted(
            stream, self.group, self.member, sequence, code, mlm.fit_string(reason)
        )
        self._outbox.send(packlink.encode(message))


@dataclass
class GroupCounters:
    """What the pack's groups have counted."""

    hosted: int = 0  # members of other brokers that joined a group here
    joined_elsewhere: int = 0  # clients here that joined a group homed on a peer
    moved: int = 0  # memberships moved to a new home (the pack changed)
    stale: int = 0  # records or answers for a membership that is gone
    refused: int = 0  # joins the home refused


class PackGroups:
    """
    The consumer groups of a pack as this broker takes part in them: the
    L{RemoteGroups} of its model (its clients in groups homed on peers) and
    the home of the groups homed here, for the peers' clients.
    """

    def __init__(
        self,
        broker: Broker,
        clock: IReactorTime,
        broker_id: str,
        peers: Mapping[str, PeerBroker],
        believe_users: bool,
        coverage: Callable[[str, str, int], bool] = lambda stream, origin, after: True,
    ) -> None:
        """
        @param broker_id: this broker's origin id (what its peers call it).
        @param peers: the peer brokers of the pack now, by origin id (the
            pack keeps it in step as they join and leave).
        @param believe_users: whether the user a peer says its client is
            is believed (a CURVE pack whose clients authenticate); else a
            peer's client is anonymous here.
        @param coverage: whether this broker's copy of a stream holds every
            record of an origin past a number (L{RemoteGroups.covers}).
        """
        self._broker = broker
        self._clock = clock
        self.broker_id = broker_id
        self._peers = peers
        self._believe_users = believe_users
        self._coverage = coverage
        # This broker's clients in groups homed on peers.
        self._memberships: dict[tuple[Connection, str], Membership] = {}
        self._by_key: dict[Key, Membership] = {}
        # Per client, its memberships with records waiting for its credit.
        self._waiting: dict[Connection, set[Membership]] = {}
        # The peers' clients in groups homed here, by (peer, stream, group, member).
        self._hosted: dict[Key, RemoteMember] = {}
        # Per group, what was acknowledged in origin terms (this broker under its id).
        self._vectors: OrderedDict[tuple[str, str], Acknowledged] = OrderedDict()
        self._entries = 0  # (origin, number) entries in all of them
        self._changed: set[tuple[str, str]] = set()
        # Changed since last written to the journal (L{keep}).
        self._unkept: set[tuple[str, str]] = set()
        self._shipper = LoopingCall(self.ship)
        self._shipper.clock = clock
        self.counters = GroupCounters()
        self._log_limit = LogLimit(clock, _log)
        self._stopped = True

    def start(self) -> None:
        self._stopped = False
        # What the journal kept of what groups acknowledged (a restart here,
        # or of every broker that heard it, must not make a new home deliver
        # it all again).
        for (stream, group), kept in list(self._broker.consumers.origins.items()):
            try:
                vector = {str(k): int(v) for k, v in json.loads(kept.acked).items()}
            except (ValueError, TypeError, AttributeError):
                continue
            self._merge((stream, group), kept.seq, vector)
        self._broker.consumers.groups.remote = self
        self._shipper.start(SHIP_INTERVAL, now=False)

    def stop(self) -> None:
        self._stopped = True
        if self._shipper.running:
            self._shipper.stop()
        groups = self._broker.consumers.groups
        if groups.remote is self:
            groups.remote = None
        for key in list(self._hosted):
            self._unhost(key)

    def home_of(self, stream: str, group: str) -> PeerBroker | None:
        """The home of C{group} of C{stream}: a peer, or None for this broker."""
        best: PeerBroker | None = None
        weight = home_weight(self.broker_id, stream, group)
        for peer in self._peers.values():
            w = home_weight(peer.origin, stream, group)
            if w > weight:
                best, weight = peer, w
        return best

    def __len__(self) -> int:
        return len(self._memberships)

    # The model's RemoteGroups: this broker's clients in groups homed on peers

    def join(self, connection: Connection, message: mlm.StreamConsume, user: str) -> bool:
        home = self.home_of(message.stream, message.group)
        if home is None:
            return False
        membership = Membership(
            connection,
            message.stream,
            message.group,
            message.consumer,
            message.pattern,
            home.origin,
        )
        previous = self._by_key.get(membership.key)
        if previous is not None:
            self._drop(previous)  # another client here joined as this member
        self._memberships[(connection, message.stream)] = membership
        self._by_key[membership.key] = membership
        self.counters.joined_elsewhere += 1
        self._send_join(home, membership, message.whence, message.position, user)
        return True

    def _send_join(
        self, home: PeerBroker, membership: Membership, whence: int, position: int, user: str
    ) -> None:
        send = home.outbox.send
        m = membership
        send(
            packlink.encode(
                packlink.GroupJoin(m.stream, m.group, m.member, m.pattern, whence, position, user)
            )
        )
        send(packlink.encode(packlink.GroupCredit(m.stream, m.group, m.member, WINDOW)))

    def commit(self, connection: Connection, message: mlm.StreamCommit) -> None:
        membership = self._memberships.get((connection, message.stream))
        home = self._peers.get(membership.home) if membership is not None else None
        if membership is None or home is None:
            connection.session.committed(
                message.stream,
                message.sequence,
                mlm.FAILED,
                "no longer a member of the group (its home ended the membership, or is"
                " unreachable)",
            )
            return
        home.outbox.send(
            packlink.encode(
                packlink.GroupCommit(
                    membership.stream, membership.group, membership.member, message.sequence
                )
            )
        )

    def leave(self, connection: Connection, stream: str) -> None:
        membership = self._memberships.get((connection, stream))
        if membership is None:
            return
        self._drop(membership)
        home = self._peers.get(membership.home)
        if home is not None:
            m = membership
            home.outbox.send(packlink.encode(packlink.GroupLeave(m.stream, m.group, m.member)))

    def _drop(self, membership: Membership) -> None:
        """Forget C{membership} (its client's consuming entry stays: its commits fail)."""
        self._memberships.pop((membership.connection, membership.stream), None)
        if self._by_key.get(membership.key) is membership:
            del self._by_key[membership.key]
        membership.waiting.clear()
        membership.waiting_bytes = 0
        self._not_waiting(membership)

    def _waits(self, membership: Membership) -> None:
        """Records wait at C{membership} for its client's credit."""
        waiting = self._waiting.get(membership.connection)
        if waiting is None:
            self._waiting[membership.connection] = {membership}
        else:
            waiting.add(membership)

    def _not_waiting(self, membership: Membership) -> None:
        waiting = self._waiting.get(membership.connection)
        if waiting is not None:
            waiting.discard(membership)
            if not waiting:
                del self._waiting[membership.connection]

    def pump(self, connection: Connection) -> None:
        """Its memberships with records waiting (only those) give them while it can take."""
        waiting = self._waiting.get(connection)
        if waiting:
            for membership in list(waiting):
                self._pump(membership)

    def _pump(self, membership: Membership) -> None:
        """Give the client what waits for it while it can take it; the home hears."""
        connection = membership.connection
        waiting = membership.waiting
        deliver = connection.session.deliver_stream
        while waiting and connection.can_take():
            if not deliver(waiting[0]):
                self._broker.stalled.add(connection)
                break
            record = waiting.popleft()
            membership.waiting_bytes -= sum(map(len, record.content))
            connection.took()
            membership.taken += 1
        if not waiting:
            self._not_waiting(membership)
        if membership.taken >= _REGRANT:
            home = self._peers.get(membership.home)
            if home is not None:
                m = membership
                home.outbox.send(
                    packlink.encode(packlink.GroupCredit(m.stream, m.group, m.member, m.taken))
                )
            membership.taken = 0

    def undelivered(self, connection: Connection, record: StreamRecord) -> bool:
        membership = self._memberships.get((connection, record.stream))
        if membership is None:
            return False
        membership.waiting.appendleft(record)
        membership.waiting_bytes += sum(map(len, record.content))
        self._waits(membership)
        membership.taken -= 1
        if connection.credit is not None:
            connection.credit += 1
        self._broker.stalled.add(connection)
        return True

    def ended(self, connection: Connection, stream: str, reason: str) -> None:
        session = connection.session
        if not isinstance(session, RemoteMember):
            return
        key = (session.peer, session.stream, session.group, session.member)
        if self._hosted.get(key) is not session:
            return
        peer = self._peers.get(session.peer)
        if peer is not None:
            message = packlink.GroupEnded(
                session.stream, session.group, session.member, mlm.FAILED, reason
            )
            peer.outbox.send(packlink.encode(message))
        # Out of the model once the group is done with it (it is in the middle of it now).
        del self._hosted[key]
        self._clock.callLater(0, self._broker.detach_remote, session)

    # Positions in origin terms

    @property
    def remembered(self) -> int:
        """(origin, number) entries kept of what groups acknowledged."""
        return self._entries

    def acknowledged(self, stream: str, group: str) -> dict[str, int] | None:
        known = self._vectors.get((stream, group))
        if known is None:
            return None
        me = self.broker_id
        return {("" if origin == me else origin): seq for origin, seq in known.vector.items()}

    def covers(self, stream: str, origin: str, after: int) -> bool:
        return self._coverage(stream, origin, after)

    def saved(self, group: Group) -> None:
        key = (group.stream, group.name)
        me = self.broker_id
        vector = {(origin or me): seq for origin, seq in group.vector.items()}
        known = self._vectors.get(key)
        if self._merge(key, known.reset if known is not None else 0, vector):
            self._changed.add(key)

    def reset(self, group: Group) -> None:
        key = (group.stream, group.name)
        self._merge(key, int(self._clock.seconds() * 1_000_000), {})
        self._changed.add(key)

    def _merge(self, key: tuple[str, str], reset: int, vector: dict[str, int]) -> bool:
        """
        Take what C{vector} says was acknowledged (since the group's reset
        at C{reset}) into what is known of the group; whether that changed
        it. A later reset replaces what was known; an earlier one is stale.
        """
        vectors = self._vectors
        known = vectors.get(key)
        if known is None or reset > known.reset:
            if known is not None:
                self._entries -= len(known.vector)
            vectors[key] = known = Acknowledged(reset, {})
            more = True
        elif reset < known.reset:
            return False
        else:
            more = False
        own = known.vector
        before = len(own)
        for origin, seq in vector.items():
            if seq > own.get(origin, 0):
                own[origin] = seq
                more = True
        self._entries += len(own) - before
        if more:
            vectors.move_to_end(key)
            self._unkept.add(key)
            while self._entries > MAX_VECTOR_ENTRIES and len(vectors) > 1:
                old, forgotten = vectors.popitem(last=False)
                self._entries -= len(forgotten.vector)
                self._unkept.discard(old)
                self._broker.consumers.forget_origins(*old)
        return more

    def keep(self) -> None:
        """Write what changed of what groups acknowledged to the journal (once a second)."""
        unkept, self._unkept = self._unkept, set()
        consumers = self._broker.consumers
        for key in unkept:
            known = self._vectors.get(key)
            if known is not None:
                consumers.keep_origins(*key, known.reset, json.dumps(known.vector).encode())

    def _message(self, key: tuple[str, str], known: Acknowledged) -> list[bytes]:
        vector = packlink.encode_vector(known.vector)
        return packlink.encode(packlink.GroupPosition(key[0], key[1], known.reset, vector))

    def ship(self) -> None:
        """
        Tell every peer what changed in what the groups homed here
        acknowledged; keep what changed of every group's in the journal.
        """
        self.keep()
        changed, self._changed = self._changed, set()
        peers = list(self._peers.values())
        if not peers:
            return
        for key in changed:
            known = self._vectors.get(key)
            if known is None:
                continue
            frames = self._message(key, known)
            for peer in peers:
                peer.outbox.send(frames)

    def tell(self, peer: PeerBroker) -> None:
        """Tell C{peer}, which just joined, what every group known here acknowledged."""
        for key, known in self._vectors.items():
            peer.outbox.send(self._message(key, known))

    def _position(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupPosition)
        broker = self._broker
        check_name("stream name", message.stream, broker.limits.max_address)
        check_name("group name", message.group, broker.limits.max_address)
        try:
            vector = packlink.decode_vector(message.content)
        except packlink.MalformedLink as e:
            raise Refused(str(e)) from e
        key = (message.stream, message.group)
        if not self._merge(key, message.reset, vector):
            return
        group = broker.consumers.groups.groups.get(key)
        if group is not None and group.taken is not None:
            translated = self.acknowledged(*key)
            assert translated is not None
            group.learn(translated)

    # What peers send

    def receive(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        """Apply one GROUP_* message from C{peer}; a refusal is logged and counted."""
        handler = self._handlers.get(type(message))
        if handler is None:
            return
        try:
            handler(self, peer, message)
        except Refused as e:
            count_refusal(self.counters, self._log_limit, peer, message, e)

    # ... as the home of a group

    def _join(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupJoin)
        broker = self._broker
        check_name("stream name", message.stream, broker.limits.max_address)
        key = (peer.origin, message.stream, message.group, message.member)
        if key in self._hosted:
            self._unhost(key)  # the peer's member joined again (another client of it)
        limit = broker.limits.max_subscriptions * 16
        if sum(1 for k in self._hosted if k[0] == peer.origin) >= limit:
            reason = f"too many group members from one peer: the limit is {limit}"
            self._refuse(peer, message, mlm.FAILED, reason)
            return
        user = message.user if self._believe_users else ""
        session = RemoteMember(
            peer.outbox, peer.origin, message.stream, message.group, message.member, user
        )
        connection = broker.attach_remote(session)
        assert connection is not None
        session.connection = connection
        connection.credit = 0  # what the member's broker gives (GROUP_CREDIT)
        consume = mlm.StreamConsume(
            message.stream,
            message.pattern,
            message.member,
            message.group,
            message.whence,
            message.position,
        )
        try:
            broker.consumers.consume(connection, consume)
        except Refused as e:
            broker.detach_remote(session)
            self._refuse(peer, message, e.code, str(e))
            return
        self._hosted[key] = session
        self.counters.hosted += 1

    def _refuse(
        self, peer: PeerBroker, message: packlink.GroupJoin, code: int, reason: str
    ) -> None:
        """The join is refused: C{peer}'s member ends (GROUP_ENDED), and it is counted."""
        self.counters.refused += 1
        ended = packlink.GroupEnded(
            message.stream, message.group, message.member, code, mlm.fit_string(reason)
        )
        peer.outbox.send(packlink.encode(ended))

    def _hosted_for(
        self, peer: PeerBroker, stream: str, group: str, member: str
    ) -> RemoteMember | None:
        session = self._hosted.get((peer.origin, stream, group, member))
        if session is None or session.connection is None or session.connection.gone:
            self.counters.stale += 1
            return None
        return session

    def _credit(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupCredit)
        session = self._hosted_for(peer, message.stream, message.group, message.member)
        if session is None:
            return
        connection = session.connection
        assert connection is not None
        # Never more than a window in flight, whatever the peer says.
        connection.credit = min(WINDOW, (connection.credit or 0) + message.credit)
        self._broker.consumers.pump(connection)

    def _commit(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupCommit)
        session = self._hosted_for(peer, message.stream, message.group, message.member)
        if session is None:
            answer = packlink.GroupCommitted(
                message.stream,
                message.group,
                message.member,
                message.sequence,
                mlm.FAILED,
                "no longer a member of the group (its lease expired, or it was taken over)",
            )
            peer.outbox.send(packlink.encode(answer))
            return
        assert session.connection is not None
        commit = mlm.StreamCommit(message.stream, message.sequence)
        self._broker.consumers.commit(session.connection, commit)

    def _leave(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupLeave)
        key = (peer.origin, message.stream, message.group, message.member)
        if key in self._hosted:
            self._unhost(key)

    def _unhost(self, key: Key) -> None:
        """A peer's member leaves its group here: what it held goes to the others."""
        session = self._hosted.pop(key)
        self._broker.detach_remote(session)

    # ... as the broker of a member

    def _membership(
        self, peer: PeerBroker, stream: str, group: str, member: str
    ) -> Membership | None:
        membership = self._by_key.get((peer.origin, stream, group, member))
        if membership is None or membership.connection.gone:
            self.counters.stale += 1
            return None
        return membership

    def _record(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupRecord)
        peer.check_size(message)
        membership = self._membership(peer, message.stream, message.group, message.member)
        if membership is None:
            return  # it left: the home gives the record to another member
        # The home sends a window of records, at most a member's unacknowledged
        # bytes of them (one always fits): more is a home that misbehaves.
        if len(membership.waiting) >= WINDOW:
            raise Refused(f"more records than the window of {WINDOW} for one member")
        size = sum(map(len, message.content))
        limit = self._broker.limits.group_unacked_bytes
        if membership.waiting and membership.waiting_bytes + size > limit:
            raise Refused(f"more than {limit} bytes of records waiting for one member")
        membership.waiting_bytes += size
        membership.waiting.append(
            StreamRecord(
                message.stream,
                message.sequence,
                message.timestamp / 1_000_000,
                message.sender,
                message.subject,
                message.content,
            )
        )
        self._waits(membership)
        self._pump(membership)

    def _committed(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupCommitted)
        membership = self._membership(peer, message.stream, message.group, message.member)
        if membership is not None:
            membership.connection.session.committed(
                message.stream, message.sequence, message.code, message.reason
            )

    def _ended(self, peer: PeerBroker, message: packlink.LinkMessage) -> None:
        assert isinstance(message, packlink.GroupEnded)
        membership = self._membership(peer, message.stream, message.group, message.member)
        if membership is None:
            return
        self._drop(membership)
        _log.info(
            "{client}: member {member!r} of group {group!r} of stream {stream!r} ended by its"
            " home {home}: {reason}",
            client=membership.connection,
            member=message.member,
            group=message.group,
            stream=message.stream,
            home=peer.name,
            reason=message.reason,
        )
        membership.connection.session.error(
            message.code, mlm.fit_string(f"group {message.group!r}: {message.reason}")
        )

    _handlers: dict[
        type[packlink.LinkMessage], Callable[[PackGroups, PeerBroker, packlink.LinkMessage], None]
    ]

    # The pack changes

    def peer_reset(self, peer: PeerBroker) -> None:
        """
        C{peer} (re)starts telling its state (SYNC: it restarted, or found
        this broker again): its members here are gone, and the memberships
        here homed on it join it again.
        """
        self._unhost_peer(peer.origin)
        for membership in [m for m in self._memberships.values() if m.home == peer.origin]:
            membership.waiting.clear()  # the home assigns them again
            membership.waiting_bytes = 0
            self._not_waiting(membership)
            membership.taken = 0
            self._send_join(
                peer, membership, mlm.RESUME, 0, membership.connection.session.user or ""
            )

    def peer_gone(self, origin: str) -> None:
        """Peer C{origin} left the pack: its members here leave their groups."""
        self._unhost_peer(origin)

    def _unhost_peer(self, origin: str) -> None:
        for key in [k for k in self._hosted if k[0] == origin]:
            self._unhost(key)

    def rehome(self) -> None:
        """
        The brokers of the pack changed: memberships whose group has
        another home now move there (joining with RESUME).
        """
        if self._stopped:
            return
        consumers = self._broker.consumers
        moves: list[tuple[Connection, str, str, str, str]] = []
        for membership in list(self._memberships.values()):
            home = self.home_of(membership.stream, membership.group)
            if home is not None and home.origin == membership.home:
                continue
            m = membership
            consumers.cancelled(m.connection, m.stream)
            moves.append((m.connection, m.stream, m.group, m.member, m.pattern))
        consumers = self._broker.consumers
        for group in list(consumers.groups.groups.values()):
            if self.home_of(group.stream, group.name) is None:
                continue
            for member in list(group.members.values()):
                if not member.connection.remote:
                    consumers.cancelled(member.connection, group.stream)
                    moves.append(
                        (member.connection, group.stream, group.name, member.name, group.pattern)
                    )
        for connection, stream, group_name, member_name, pattern in moves:
            if connection.gone:
                continue
            self.counters.moved += 1
            try:
                consumers.consume(
                    connection,
                    mlm.StreamConsume(stream, pattern, member_name, group_name, mlm.RESUME),
                )
            except Refused as e:
                connection.session.error(e.code, mlm.fit_string(str(e)))


PackGroups._handlers = {
    packlink.GroupJoin: PackGroups._join,
    packlink.GroupCredit: PackGroups._credit,
    packlink.GroupCommit: PackGroups._commit,
    packlink.GroupLeave: PackGroups._leave,
    packlink.GroupRecord: PackGroups._record,
    packlink.GroupCommitted: PackGroups._committed,
    packlink.GroupEnded: PackGroups._ended,
    packlink.GroupPosition: PackGroups._position,
}
