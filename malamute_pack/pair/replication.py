"""
Journal replication between the two brokers of a pair, with no sockets:
the active's L{ReplicationSource} ships every batch of journal writes to
its partner and catches a (re)joining partner up from its own journal;
the passive's L{Replica} applies what arrives to its journal and says how
far it has it on disk. Both speak through a C{send} callable (the pair
link, L{malamute_pack.pair.link}) in the messages of
L{malamute_pack.protocol.pair}.

The protocol:

1. The passive sends HELLO: the history (epoch) it follows, the last
   sequence number it holds per stream, its letters' ids. Its epoch is
   empty when it never finished a catch-up of its current history: it then
   starts again from nothing. A stream its journal lost records of (a
   damaged file, salvaged: L{Journal.losses}) it says it holds only up to
   before its first loss; it cuts that stream back there when the catch-up
   begins, and forgets the losses once it has caught up.
2. The active numbers a new link, hands its outbox to its writer, and from
   the next write on ships every batch (SHIP, numbered by position in the
   order of writes). Then, at exactly that point of the writes, it takes a
   snapshot (streams' first retained and last numbers, letters' ids), and
   sends CATCHUP_BEGIN (what the passive must cut: nothing when it follows
   this epoch; back to the takeover point when it led the epoch before;
   everything when the histories are unrelated; and, per stream, what
   comes before the first record the active retains, so that a stream
   deleted or pruned there meanwhile is gone here too), then ITEMS (at
   most L{ITEMS_WINDOW} unacknowledged): first the retention and the
   clients' security state in force, then the whole owners table in pages,
   then the records and letters the passive lacks; and CATCHUP_END.
3. The passive applies SHIPs and ITEMS as they come (what a SHIP changed
   while its older copy was still coming in ITEMS is not taken from the
   ITEMS: a letter removed, records deleted, an address's owner; an owners
   page removes the passive's owners of its range that the active does not
   have), ACKs the last position and ITEMS it has on disk, and once
   CATCHUP_END's position is on disk says CAUGHT_UP. From then on it is in
   sync: in ``sync`` mode the active's journal holds each batch's outcome
   (STORED, a stream record's durability) until its ACK.
4. A SHIP out of order (a message lost when the link broke) or a new link
   number in the active's heartbeat makes the passive say HELLO again.

Besides the journal's records and letters, the writes carry the owners of
addresses, an operator's stream deletes and retention changes, the
last-value streams (every catch-up sends them, and the passive rebuilds
their last values from what it then retains), and, after
each reload of the security files on the active, the clients' security
state (passwords, CURVE clients, access rules): the passive installs that
one in memory (L{Replica.on_security}), never on its disk; every catch-up
sends it again (L{ReplicationSource.security}).

Tests: ``tests/unit/test_pair_replication.py``.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

from twisted.internet.defer import Deferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from malamute_pack.broker.access import AccessPolicy, Glob, Right
from malamute_pack.journal.journal import Journal
from malamute_pack.journal.schema import QUEUED_LAST_ID
from malamute_pack.journal.writer import (
    CompactSet,
    ConsumerSave,
    OwnerClaim,
    PartnerNote,
    QueuedRemove,
    QueuedStore,
    RetentionSet,
    StreamAppend,
    StreamDelete,
    WriteOp,
)
from malamute_pack.protocol import pair as wire
from malamute_pack.protocol.records import QueuedRecord, StreamRow
from malamute_pack.transport.security import ClientSecurity

_log = Logger()

Send = Callable[[wire.PairMessage], bool]

# Catch-up messages in flight before the passive acknowledges them.
ITEMS_WINDOW: Final = 8
# Bytes shipped and not yet acknowledged beyond which the partner counts as
# too slow: the link ends (the active goes on alone) and the partner catches
# up from the journal, instead of the link's queues growing without bound.
MAX_LAG_BYTES: Final = 64 * 1024 * 1024
# What an operation costs on the link beyond its content.
_OP_OVERHEAD: Final = 128
# Records and letters per catch-up message.
ITEMS_ROWS: Final = 1000
ITEMS_LETTERS: Final = 200
ITEMS_OWNERS: Final = 500
# Addresses an owners page's delete keeps at most (its own and those SHIPs
# claimed meanwhile): past it, the page removes nothing (SQLite's bound on
# a statement's parameters).
_MOST_KEPT: Final = 30_000

# pair_state names.
EPOCH: Final = "epoch"
LEADER: Final = "leader"
PREVIOUS_EPOCH: Final = "previous_epoch"
TAKEOVER: Final = "takeover"
COMPLETE: Final = "complete"
# "0" from a takeover's start until the new active opens to its clients:
# a journal whose takeover was abandoned claims no history it never served.
SERVED: Final = "served"
# With SERVED "0" after a takeover's start: what the journal held before
# (its EPOCH, LEADER and PREVIOUS_EPOCH, as JSON), claimed again if the
# takeover was abandoned (L{claimed}).
BEFORE_TAKEOVER: Final = "before_takeover"
_CLAIMS: Final = (EPOCH, LEADER, PREVIOUS_EPOCH)

_SET_STATE: Final = (
    "INSERT INTO pair_state (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = excluded.value"
)
_SET_LAST: Final = (
    "INSERT INTO streams (stream, last_seq, message_count, total_bytes) VALUES (?, ?, 0, 0) "
    "ON CONFLICT (stream) DO UPDATE SET last_seq = max(last_seq, excluded.last_seq)"
)
_SET_LAST_ID: Final = (
    "INSERT INTO journal_counters (name, value) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET value = max(value, excluded.value)"
)
# A stream's totals less its records before a sequence number.
_BEFORE: Final = "FROM stream_messages WHERE stream = ? AND seq < ?"
_LESS_BEFORE: Final = (
    f"UPDATE streams SET message_count = max(0, message_count - (SELECT count(*) {_BEFORE})),"
    f" total_bytes = max(0, total_bytes - (SELECT coalesce(sum(bytes), 0) {_BEFORE}))"
    " WHERE stream = ?"
)


def set_state(values: dict[str, str]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that record C{values} in pair_state."""
    return [(_SET_STATE, (name, value)) for name, value in values.items()]


def before_takeover(state: Mapping[str, str]) -> str:
    """What L{claimed} restores of C{state} (a journal's before a takeover), as BEFORE_TAKEOVER."""
    return json.dumps({name: state.get(name, "") for name in _CLAIMS})


def claimed(state: Mapping[str, str]) -> dict[str, str]:
    """
    The history a journal's pair_state C{state} claims: as written, unless
    it holds a takeover abandoned before its broker served (SERVED "0"):
    then the history it held before (its epoch, leader and previous
    epoch), as if the takeover had never begun (found by the soak: a
    backup whose takeover was abandoned at once, its partner active, came
    back with the new epoch and as the leader, served as the primary, and
    what the partner acknowledged meanwhile was cut back).
    """
    claims = dict(state)
    before = claims.get(BEFORE_TAKEOVER)
    if claims.get(SERVED) == "0" and before:
        claims.update(json.loads(before))
        del claims[SERVED]
    return claims


@dataclass(slots=True)
class History:
    """
    What a journal knows of the history it holds: the epoch it follows or
    leads, the epoch before (the one its active took over from) and the
    takeover point (the last sequence number per stream and the last letter
    id it had from that epoch).
    """

    epoch: str = ""
    previous: str = ""
    streams: dict[str, int] = field(default_factory=dict)
    last_id: int = 0

    @classmethod
    def from_state(cls, state: dict[str, str]) -> History:
        takeover = json.loads(state.get(TAKEOVER, "{}"))
        return cls(
            state.get(EPOCH, ""),
            state.get(PREVIOUS_EPOCH, ""),
            {str(k): int(v) for k, v in takeover.get("streams", {}).items()},
            int(takeover.get("last_id", 0)),
        )

    def state(self, leader: str) -> dict[str, str]:
        takeover = {"streams": self.streams, "last_id": self.last_id}
        return {
            EPOCH: self.epoch,
            LEADER: leader,
            PREVIOUS_EPOCH: self.previous,
            TAKEOVER: json.dumps(takeover),
        }


def _changes(ops: Sequence[WriteOp]) -> list[wire.Change]:
    """The journal operations as the changes the link carries."""
    changes: list[wire.Change] = []
    for op in ops:
        kind = type(op)
        if kind is tuple:
            changes.append(op)  # type: ignore[arg-type]
        elif kind is QueuedStore:
            changes.append(op.record)  # type: ignore[union-attr]
        elif kind is QueuedRemove:
            changes.append(wire.Removed(op.record_id))  # type: ignore[union-attr]
        elif kind is StreamAppend:
            assert isinstance(op, StreamAppend)
            changes.append(wire.Appended(op.rows, op.key, op.forget))
        elif kind is OwnerClaim:
            assert isinstance(op, OwnerClaim)
            changes.append(wire.OwnerClaimed(op.address, op.user, op.claimed))
        elif kind is StreamDelete:
            assert isinstance(op, StreamDelete)
            changes.append(wire.StreamDeleted(op.stream, op.through))
        elif kind is ConsumerSave:
            assert isinstance(op, ConsumerSave)
            changes.append(wire.ConsumerChanged(op.position, op.forget))
        elif kind is RetentionSet:
            assert isinstance(op, RetentionSet)
            changes.append(wire.Retention(op.retention, dict(op.per_stream)))
        elif kind is CompactSet:
            assert isinstance(op, CompactSet)
            changes.append(wire.Compaction(sorted(op.streams), op.rebuild))
        else:
            assert isinstance(op, PartnerNote)
            changes.append(op.change)  # type: ignore[arg-type]
    return changes


def _size(op: WriteOp) -> int:
    """About what C{op} costs on the link, in bytes."""
    if isinstance(op, QueuedStore):
        return _OP_OVERHEAD + sum(len(frame) for frame in op.record.content)
    if isinstance(op, StreamAppend):
        return _OP_OVERHEAD * (1 + len(op.rows)) + op.bytes
    if isinstance(op, OwnerClaim):
        return _OP_OVERHEAD + len(op.address) + len(op.user)
    if isinstance(op, ConsumerSave):
        p = op.position
        return _OP_OVERHEAD + len(p.stream) + len(p.name) + len(p.acked)
    if isinstance(op, QueuedRemove | StreamDelete | RetentionSet | CompactSet | PartnerNote):
        return _OP_OVERHEAD
    return _OP_OVERHEAD + op[6]  # a stream row: its content's size


# A stream row's content size (its journal ``bytes`` field).
_ROW_SIZE: Final = itemgetter(6)


def _ignore(_: object) -> None:
    """A replica's writes have nobody to tell."""


def _operation(change: wire.Change) -> WriteOp | None:
    """
    The journal operation that applies C{change} (None for the changes a
    journal does not write: an owners page, the clients' security).
    """
    if type(change) is tuple:
        return change
    if isinstance(change, QueuedRecord):
        return QueuedStore(change, _ignore)
    if isinstance(change, wire.Removed):
        return QueuedRemove(change.record_id)
    if isinstance(change, wire.Appended):
        size = sum(map(_ROW_SIZE, change.rows))  # no Python code per record
        return StreamAppend(change.rows, change.key, change.forget, _ignore, size, follows=True)
    if isinstance(change, wire.AppendKey):
        return StreamAppend([], change.key, [], _ignore, 0, follows=True)
    if isinstance(change, wire.OwnerClaimed):
        return OwnerClaim(change.address, change.user, change.claimed)
    if isinstance(change, wire.StreamDeleted):
        return StreamDelete(change.stream, change.through)
    if isinstance(change, wire.Retention):
        return RetentionSet(change.default, dict(change.streams))
    if isinstance(change, wire.Compaction):
        return CompactSet(frozenset(change.streams), change.rebuild)
    if isinstance(change, wire.ConsumerChanged):
        return ConsumerSave(change.position, change.forget)
    return None


def _missing(first: int, last: int, held: Sequence[int]) -> Iterator[tuple[int, int]]:
    """The stretches of C{first}..C{last} that C{held} (sorted numbers) leaves out."""
    start = first
    for seq in held:
        if seq > start:
            yield (start, seq - 1)
        start = max(start, seq + 1)
    if start <= last:
        yield (start, last)


def unwritten(ops: list[WriteOp]) -> wire.Unwritten:
    """What C{ops}, shipped and then not written (their batch failed), put on a partner."""
    rows: list[tuple[str, int, int]] = []
    keys: list[tuple[str, str, int]] = []
    letters: list[int] = []

    def add(stream: str, seq: int) -> None:
        if rows and rows[-1][0] == stream and rows[-1][2] + 1 == seq:
            rows[-1] = (stream, rows[-1][1], seq)
        else:
            rows.append((stream, seq, seq))

    for op in ops:
        if type(op) is tuple:
            add(op[0], op[1])
        elif isinstance(op, StreamAppend):
            for row in op.rows:
                add(row[0], row[1])
            keys.append((op.key[0], op.key[1], op.key[2]))
        elif isinstance(op, QueuedStore):
            letters.append(op.record.id)
    return wire.Unwritten(rows, keys, letters)


# What removes an Unwritten's records (off their stream's totals), keys and letters.
_LESS_RANGE: Final = (
    "UPDATE streams SET"
    " message_count = max(0, message_count - (SELECT count(*) FROM stream_messages"
    " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3)),"
    " total_bytes = max(0, total_bytes - (SELECT coalesce(sum(bytes), 0) FROM stream_messages"
    " WHERE stream = ?1 AND seq BETWEEN ?2 AND ?3))"
    " WHERE stream = ?1"
)
_DELETE_RANGE: Final = "DELETE FROM stream_messages WHERE stream = ? AND seq BETWEEN ? AND ?"
_DELETE_KEY: Final = "DELETE FROM stream_appends WHERE stream = ? AND key = ? AND first_seq = ?"
_DELETE_LETTER: Final = "DELETE FROM queued_messages WHERE id = ?"


def unwrite_statements(change: wire.Unwritten) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements that take off a passive's journal what C{change} names."""
    statements: list[tuple[str, tuple[Any, ...]]] = []
    for stream, first, last in change.rows:
        statements += [(_LESS_RANGE, (stream, first, last)), (_DELETE_RANGE, (stream, first, last))]
    statements += [(_DELETE_KEY, key) for key in change.keys]
    statements += [(_DELETE_LETTER, (rid,)) for rid in change.letters]
    return statements


def security_change(state: ClientSecurity) -> wire.ClientSecurity:
    """The clients' security state as the link carries it."""
    return wire.ClientSecurity(
        None if state.passwords is None else dict(state.passwords),
        None if state.curve_keys is None else dict(state.curve_keys),
        {
            right.value: {user: [glob.text for glob in globs] for user, globs in by_user.items()}
            for right, by_user in state.policy.rules.items()
        },
    )


def security_state(change: wire.ClientSecurity) -> ClientSecurity:
    """
    The clients' security state C{change} carries.

    @raise ValueError: it names a right this broker does not know.
    """
    rules: dict[Right, dict[str, tuple[Glob, ...]]] = {}
    for name, by_user in change.rules.items():
        try:
            right = Right(name)
        except ValueError:
            raise ValueError(f"an access rule for an unknown right {name!r}") from None
        rules[right] = {user: tuple(map(Glob, globs)) for user, globs in by_user.items()}
    return ClientSecurity(change.passwords, change.curve_keys, AccessPolicy(rules))


@dataclass(slots=True)
class SourceStats:
    """The active's side of replication, for logs and stats."""

    catchups: int = 0
    shipped: int = 0  # operations shipped
    items_sent: int = 0
    in_sync_since: float | None = None
    resyncs: int = 0


class ReplicationSource:
    """
    The active's end: ships C{journal}'s writes through C{send} and catches
    a partner up. C{sync}: hold each write's outcome until the partner has
    it (once the partner is in sync).
    """

    def __init__(
        self,
        journal: Journal,
        send: Send,
        history: History,
        *,
        sync: bool = True,
        seconds: Callable[[], float] | None = None,
        max_lag_bytes: int = MAX_LAG_BYTES,
    ) -> None:
        self._journal = journal
        self.max_lag_bytes = max_lag_bytes
        # Shipped and not yet acknowledged: (position of a SHIP's last op, its bytes).
        self._unacked: deque[tuple[int, int]] = deque()
        self.unacked_bytes = 0
        self._send = send
        self.history = history
        self.sync = sync
        self._seconds = seconds or (lambda: 0.0)
        self.stats = SourceStats()
        self.link = 0  # 0: no partner following
        self._from = 0  # first position shipped on this link
        self._held_ships: list[wire.Ship] | None = None  # until CATCHUP_BEGIN is sent
        self.in_sync = False
        # Acknowledgements wait for the partner (sync, since it caught up),
        # until it is gone or joins again.
        self.holding = False
        self._items_sent = 0
        self._items_acked = 0
        self._items_waiting: Deferred[None] | None = None
        self.acked = 0
        # The incarnation (process) of the partner the link serves.
        self.partner_incarnation = ""
        # The clients' security state in force here (None: no client
        # authenticates), sent at each catch-up.
        self.security: Callable[[], wire.ClientSecurity | None] = lambda: None
        # What this journal lost to damage, asked of the partner once it is
        # in sync, one stretch at a time, a page at a time: (stream, first,
        # last), and where the next page starts.
        self._refills: deque[tuple[str, int, int]] = deque()
        self._refill_from = 0
        journal.shipper = self._ship
        journal.on_unwritten = self._unwritten

    def _unwritten(self, ops: list[WriteOp]) -> None:
        """
        C{ops} were shipped, and their batch failed here (a full disk): the
        partner removes them too, in the order of writes (found by the
        soak: the passive kept records and letters the active never had,
        and served them, beside their writers' retries, once it took over).
        """
        change = unwritten(ops)
        if change.rows or change.keys or change.letters:
            self._journal.pass_to_partner(change)

    # What the partner says.

    def receive(self, message: wire.PairMessage) -> None:
        """A message from the passive partner (the others are not for this end)."""
        if isinstance(message, wire.Hello):
            self.hello(message)
        elif isinstance(message, wire.Ack):
            self.ack(message)
        elif isinstance(message, wire.CaughtUp):
            self.caught_up(message)
        elif isinstance(message, wire.Refill):
            self.refilled(message)

    def hello(self, hello: wire.Hello) -> None:
        """
        A partner (re)joins: start a new link and catch it up. What waited
        for it goes (it is not in sync until caught up, so it cannot take over).
        """
        self._drop_link()
        self.holding = False
        self._journal.hold_for_replica(False)
        self.partner_incarnation = hello.incarnation
        self.stats.catchups += 1
        # Handing the outbox over (execute does, first) must ship nothing:
        # those writes are in the snapshot. The link starts after them.
        snapshot = self._journal.execute(
            [],
            [
                (
                    "SELECT s.stream, s.last_seq, (SELECT min(seq) FROM stream_messages m"
                    " WHERE m.stream = s.stream) FROM streams s",
                    (),
                ),
                ("SELECT id FROM queued_messages ORDER BY id", ()),
                ("SELECT value FROM journal_counters WHERE name = ?", (QUEUED_LAST_ID,)),
            ],
        )
        # Everything handed over so far is in the snapshot; what follows is shipped.
        self._from = self._journal.handed + 1
        base = self._from - 1
        link = self.link = random.getrandbits(63) | 1
        self._held_ships = []
        snapshot.addCallback(self._begin, hello, link, base)
        snapshot.addErrback(self._failed, link, "taking the snapshot for its catch-up")

    def ack(self, ack: wire.Ack) -> None:
        if ack.link != self.link or self.link == 0:
            return
        self.acked = max(self.acked, ack.position)
        self._forget_acked()
        if self.in_sync and self.sync:
            self._journal.replica_acked(ack.position)
        self._items_acked = max(self._items_acked, ack.items)
        waiting, self._items_waiting = self._items_waiting, None
        if waiting is not None:
            waiting.callback(None)

    def caught_up(self, message: wire.CaughtUp) -> None:
        if message.link != self.link or self.link == 0:
            return
        self.in_sync = True
        self.stats.in_sync_since = self._seconds()
        self.acked = max(self.acked, message.position)
        self._forget_acked()
        if self.sync:
            self._journal.replica_acked(message.position)
            self._journal.hold_for_replica(True)
            self.holding = True
        _log.info(
            "pair: the partner is in sync (replication {mode})",
            mode="sync" if self.sync else "async",
        )
        self._refills = deque(
            (stream, first, last)
            for stream, stretches in sorted(self._journal.loss_stretches().items())
            for first, last in stretches
        )
        self._refill_from = 0
        self._ask_refill()

    # Refilling what this journal lost to damage from the partner's copy.

    def _ask_refill(self) -> None:
        """Ask the partner for the next stretch this journal lost (or the rest of it)."""
        if not self._refills or not self.link:
            return
        stream, first, last = self._refills[0]
        if self._refill_from < first:
            self._refill_from = first
            _log.info(
                "pair: this journal lost records {first}-{last} of stream {stream!r} to"
                " damage: asking the partner for them",
                first=first,
                last=last,
                stream=stream,
            )
        self._send(wire.RefillAsk(self.link, stream, self._refill_from, last))

    def refilled(self, message: wire.Refill) -> None:
        """
        A page of the partner's records of a stretch this journal lost:
        written, and the losses it covers become what the partner lacked
        too; then the next page or stretch is asked for.
        """
        if message.link != self.link or not self.link or not self._refills:
            return
        stream, first, last = self._refills[0]
        start = self._refill_from
        if message.stream != stream or message.first != start or message.through < start:
            return  # an answer to an earlier ask
        through = min(message.through, last)
        rows = [
            change
            for change in message.changes
            if type(change) is tuple and change[0] == stream and start <= change[1] <= through
        ]
        still = list(_missing(start, through, [row[1] for row in rows]))
        link = self.link
        writing = self._journal.refill(stream, start, through, rows, still)
        # The next page once this one is written (each works out the losses left from the last).
        writing.addCallback(lambda _: self._ask_refill() if link == self.link else None)
        writing.addErrback(self._failed, link, "writing the records copied back")
        if through < last:
            self._refill_from = through + 1
        else:
            self._refills.popleft()
            self._refill_from = 0
            _log.info(
                "pair: of the records {first}-{last} of stream {stream!r} this journal lost,"
                " those the partner had are copied back (readers are told of a gap for the rest)",
                stream=stream,
                first=first,
                last=last,
            )

    def partner_gone(self, why: str = "") -> None:
        """
        The partner is gone (C{why}: it restarted, its port refuses, it was
        silent for alone-after): go on alone, acknowledging what it lacks.
        """
        if (self.link and self.in_sync) or self.holding:
            _log.warn(
                "pair: the partner is gone{why}; this broker goes on alone (not replicated)",
                why=f" ({why})" if why else "",
            )
        self._drop_link()
        self.holding = False
        self._journal.hold_for_replica(False)

    def _forget_acked(self) -> None:
        unacked = self._unacked
        while unacked and unacked[0][0] <= self.acked:
            self.unacked_bytes -= unacked.popleft()[1]

    def drop_link(self) -> None:
        """The partner no longer follows (it is active too): the link ends (L{_drop_link})."""
        self._drop_link()

    def _drop_link(self) -> None:
        """
        The link ends. What waits for the partner keeps waiting (in sync
        mode): only the partner gone (L{partner_gone}) or a new link
        (L{hello}: the partner, alive, catches up and cannot take over
        meanwhile) lets it go.
        """
        self._unacked.clear()
        self.unacked_bytes = 0
        self.link = 0
        self.in_sync = False
        self.stats.in_sync_since = None
        self._held_ships = None
        waiting, self._items_waiting = self._items_waiting, None
        if waiting is not None:
            waiting.callback(None)

    @property
    def lag(self) -> int:
        """Operations written here and not yet acknowledged by the partner."""
        return max(0, self._journal.handed - self.acked) if self.link else 0

    # Shipping.

    def _ship(self, first: int, ops: list[WriteOp]) -> None:
        if self.link == 0 or first < self._from:
            return
        ship = wire.Ship(self.link, first, _changes(ops))
        self.stats.shipped += len(ops)
        size = sum(_size(op) for op in ops)
        self._unacked.append((first + len(ops) - 1, size))
        self.unacked_bytes += size
        if self.unacked_bytes > self.max_lag_bytes:
            self._lost(f"it fell {self.unacked_bytes} bytes behind")
            return
        if self._held_ships is not None:
            self._held_ships.append(ship)
            return
        if not self._send(ship):
            self._lost("its link's queue is full")

    def _lost(self, why: str) -> None:
        _log.warn("pair: replication to the partner broke ({why}); it will catch up", why=why)
        self.stats.resyncs += 1
        self._drop_link()

    def _failed(self, failure: Failure, link: int, doing: str) -> None:
        _log.error("pair: {doing} failed: {error}", doing=doing, error=failure.value)
        if link == self.link:
            self._lost(doing)

    # Catch-up.

    def _begin(
        self, snapshot: list[list[tuple[Any, ...]]], hello: wire.Hello, link: int, base: int
    ) -> Deferred[None] | None:
        if link != self.link:
            return None
        lasts = {str(stream): int(last) for stream, last, _ in snapshot[0]}
        # The first record each stream retains (none: the one after its last),
        # or the first it lost to damage: the partner keeps what this journal
        # lost (it is asked for it once in sync), not only what it retains.
        lost = self._journal.losses()
        firsts = {
            str(stream): min(
                int(last) + 1 if first is None else int(first),
                lost.get(str(stream), int(last) + 1),
            )
            for stream, last, first in snapshot[0]
        }
        ids = [int(row[0]) for row in snapshot[1]]
        last_id = int(snapshot[2][0][0]) if snapshot[2] else 0
        if ids:
            last_id = max(last_id, ids[-1])
        history = self.history
        held = set(hello.letters)
        if hello.epoch and hello.epoch == history.epoch:
            mode, truncate, truncate_id = wire.INCREMENTAL, {}, 0
            starts = dict(hello.streams)
        elif hello.epoch and hello.epoch == history.previous:
            mode = wire.TRUNCATE
            truncate = {s: min(p, history.streams.get(s, 0)) for s, p in hello.streams.items()}
            truncate_id = history.last_id
            held = {i for i in held if i <= truncate_id}
            starts = truncate
        else:
            mode, truncate, truncate_id, starts = wire.FULL, {}, 0, {}
            held = set()
        active_ids = set(ids)
        delete = sorted(set(hello.letters) - active_ids) if mode != wire.FULL else []
        missing = [i for i in ids if i not in held]
        begin = wire.CatchupBegin(
            link, base, mode, history.epoch, truncate, truncate_id, lasts, last_id, delete, firsts
        )
        if not self._send(begin):
            self._lost("its link's queue is full")
            return None
        ships, self._held_ships = self._held_ships or [], None
        for ship in ships:
            if not self._send(ship):
                self._lost("its link's queue is full")
                return None
        self._items_sent = self._items_acked = 0
        starts = {s: max(starts.get(s, 0), firsts[s] - 1) for s in lasts}
        work = self._send_items(link, lasts, starts, missing)
        return work.addErrback(self._failed, link, "catching the partner up")

    async def _items(self, link: int, changes: list[wire.Change]) -> bool:
        """Send one ITEMS message once the window allows; False if the link is gone."""
        while self.link == link and self._items_sent - self._items_acked >= ITEMS_WINDOW:
            self._items_waiting = Deferred()
            await self._items_waiting
        if self.link != link:
            return False
        if not self._send(wire.Items(link, changes)):
            self._lost("its link's queue is full")
            return False
        self._items_sent += 1
        self.stats.items_sent += 1
        return True

    def _send_items(
        self, link: int, lasts: dict[str, int], starts: dict[str, int], missing: list[int]
    ) -> Deferred[None]:
        return Deferred.fromCoroutine(self._catch_up(link, lasts, starts, missing))

    async def _catch_up(
        self, link: int, lasts: dict[str, int], starts: dict[str, int], missing: list[int]
    ) -> None:
        journal = self._journal
        # What is in force now (later changes are shipped after this).
        config = journal.config
        state: list[wire.Change] = [
            wire.Retention(config.retention, dict(config.per_stream_retention)),
            # Rebuilt there from what it retains once cut back to this history.
            wire.Compaction(sorted(config.compacted), rebuild=True),
        ]
        security = self.security()
        if security is not None:
            state.append(security)
        if not await self._items(link, state):
            return
        after: str | None = None
        while True:
            owners = await journal.read_owners(after, ITEMS_OWNERS)
            final = len(owners) < ITEMS_OWNERS
            claims = [wire.OwnerClaimed(*owner) for owner in owners]
            if not await self._items(link, [wire.OwnersPage(after, final, claims)]):
                return
            if final:
                break
            after = owners[-1][0]
        # Consumer positions: a bounded table (malamute/limits/consumers), sent whole.
        consumers = await journal.read_consumers()
        for start in range(0, len(consumers), ITEMS_OWNERS):
            page = consumers[start : start + ITEMS_OWNERS]
            if not await self._items(link, [wire.ConsumerChanged(p) for p in page]):
                return
        for stream, last in lasts.items():
            position = starts.get(stream, 0) + 1
            keys = await journal.read_append_keys(stream, position, last)
            while position <= last:
                rows: list[StreamRow] = await journal.read_stream_rows(
                    stream, position, last, ITEMS_ROWS
                )
                if not rows:
                    break
                if not await self._items(link, list(rows)):
                    return
                position = rows[-1][1] + 1
            if keys and not await self._items(link, [wire.AppendKey(key) for key in keys]):
                return
        for start in range(0, len(missing), ITEMS_LETTERS):
            letters = await journal.read_queued(missing[start : start + ITEMS_LETTERS])
            if letters and not await self._items(link, list(letters)):
                return
        if self.link == link:
            self._send(wire.CatchupEnd(link, self._journal.handed))


@dataclass(slots=True)
class ReplicaStats:
    """The passive's side of replication, for logs and stats."""

    catchups: int = 0
    applied: int = 0  # operations applied from SHIPs
    items: int = 0
    gaps: int = 0


class Replica:
    """
    The passive's end: applies what the active sends to C{journal}, and
    answers through C{send}.
    """

    def __init__(
        self,
        journal: Journal,
        send: Send,
        incarnation: str,
        seconds: Callable[[], float],
        retry_after: float = 5.0,
    ) -> None:
        self._journal = journal
        self._send = send
        self._incarnation = incarnation
        self._seconds = seconds
        self._retry_after = retry_after
        self._asked_at: float | None = None
        self.stats = ReplicaStats()
        self.link = 0
        # Caught up: it holds everything the active wrote on this link.
        self.in_sync = False
        # The active's last heartbeat said it holds this replica in sync on
        # this link (it heard CAUGHT_UP): only then does it acknowledge
        # nothing without it, and only then may this broker take over
        # (L{may_take_over}).
        self.confirmed = False
        self.epoch = ""  # the history the active said it leads, at the last catch-up
        self._next = 0  # the position the next SHIP must start at
        self._catching_up = False
        # What SHIPs changed during a catch-up, not to be taken from ITEMS:
        # letters removed, records deleted (per stream, up to), owners,
        # consumers (stream, kind, name).
        self._removed: set[int] = set()
        self._deleted: dict[str, int] = {}
        self._claimed: set[str] = set()
        self._consumed: set[tuple[str, str, str]] = set()
        # The streams whose losses the catch-up under way fills again.
        self._refilling: list[str] = []
        self._items_applied = 0
        self._end: int | None = None  # CATCHUP_END's position, until caught up
        self._flushing = False
        self._dirty = False
        self._saying_hello = False
        self._stopped = False
        self._errors = journal.counters.errors
        # Installs the clients' security state the active sends (None: this
        # broker authenticates no client, and ignores it).
        self.on_security: Callable[[wire.ClientSecurity], None] | None = None
        self._security_ignored = False

    def stop(self) -> None:
        """Apply nothing more (this broker is taking over)."""
        self._stopped = True
        self.link = 0

    def hello(self) -> None:
        """Ask the active for a catch-up (on joining, and after a broken link)."""
        if self._saying_hello or self._stopped:
            return
        self._saying_hello = True
        self._asked_at = self._seconds()
        self.link = 0
        self.in_sync = self.confirmed = False
        self._catching_up = False
        self._end = None
        asked = self._journal.execute(
            [],
            [
                ("SELECT name, value FROM pair_state", ()),
                (
                    "SELECT s.stream, (SELECT max(seq) FROM stream_messages m "
                    "WHERE m.stream = s.stream) FROM streams s",
                    (),
                ),
                ("SELECT id FROM queued_messages ORDER BY id", ()),
                ("SELECT value FROM journal_counters WHERE name = ?", (QUEUED_LAST_ID,)),
            ],
        )
        asked.addCallback(self._say_hello)
        asked.addErrback(self._hello_failed)

    def _say_hello(self, rows: list[list[tuple[Any, ...]]]) -> None:
        self._saying_hello = False
        if self._stopped:
            return
        state = claimed(dict(rows[0]))
        epoch = state.get(EPOCH, "") if state.get(COMPLETE) == "1" else ""
        streams = {str(s): int(last) for s, last in rows[1] if last is not None}
        # A stream this journal lost records of (a salvage of a damaged
        # file): the active copies it again from before its first loss.
        for stream, first in self._journal.losses().items():
            if stream in streams:
                streams[stream] = min(streams[stream], first - 1)
        ids = [int(row[0]) for row in rows[2]]
        last_id = int(rows[3][0][0]) if rows[3] else 0
        self._send(wire.Hello(self._incarnation, epoch, last_id, streams, ids))

    def _hello_failed(self, failure: Failure) -> None:
        self._saying_hello = False
        _log.error("pair: reading this journal for the partner failed: {e}", e=failure.value)

    @property
    def may_take_over(self) -> bool:
        """
        Whether this replica holds everything the active acknowledged: it
        caught up, and the active said it knows (found by the soak: the
        CAUGHT_UP was held up by a cut link, the passive took over while the
        active, which never heard it, acknowledged without it, and what it
        acknowledged was lost when it yielded).
        """
        return self.in_sync and self.confirmed

    def heartbeat_link(self, link: int, now: float, holds_in_sync: bool) -> None:
        """
        The active's heartbeat names its link and whether it holds its
        partner in sync there (L{confirmed}): another link than this
        replica's means catch up again (unless a HELLO is recent enough to
        be still on its way).
        """
        self.confirmed = self.in_sync and self.link != 0 and link == self.link and holds_in_sync
        if self.link != 0 and link == self.link:
            return
        if self._asked_at is not None and now - self._asked_at < self._retry_after:
            return
        self.hello()

    def receive(self, message: wire.PairMessage) -> None:
        """A message from the active partner (the others are not for this end)."""
        if isinstance(message, wire.Ship):
            self.ship(message)
        elif isinstance(message, wire.Items):
            self.items(message)
        elif isinstance(message, wire.CatchupBegin):
            self.begin(message)
        elif isinstance(message, wire.CatchupEnd):
            self.end(message)
        elif isinstance(message, wire.RefillAsk):
            self.refill_asked(message)

    def begin(self, message: wire.CatchupBegin) -> None:
        if self._stopped:
            return
        journal = self._journal
        statements: list[tuple[str, tuple[Any, ...]]] = set_state({COMPLETE: "0"})
        # The catch-up sends every consumer position: the copy is exact.
        statements.append(("DELETE FROM stream_consumers", ()))
        if message.mode == wire.FULL:
            statements += [
                ("DELETE FROM stream_messages", ()),
                ("DELETE FROM stream_last_values", ()),
                ("DELETE FROM stream_appends", ()),
                ("DELETE FROM streams", ()),
                ("DELETE FROM queued_messages", ()),
            ]
        # Streams this journal lost records of: cut back to before the first
        # loss, and filled again from the active (as its HELLO said).
        cuts = dict(message.truncate)
        losses = journal.losses()
        if message.mode != wire.FULL:
            for stream, first in losses.items():
                cuts[stream] = min(cuts.get(stream, first - 1), first - 1)
        self._refilling = sorted(losses)
        for stream, last in cuts.items():
            statements += [
                ("DELETE FROM stream_messages WHERE stream = ? AND seq > ?", (stream, last)),
                ("DELETE FROM stream_appends WHERE stream = ? AND last_seq > ?", (stream, last)),
                (
                    "UPDATE streams SET last_seq = ?, "
                    "message_count = (SELECT count(*) FROM stream_messages WHERE stream = ?), "
                    "total_bytes = (SELECT coalesce(sum(bytes), 0) FROM stream_messages "
                    "WHERE stream = ?) WHERE stream = ?",
                    (last, stream, stream, stream),
                ),
            ]
            journal.truncated(stream, last)
        if message.mode == wire.TRUNCATE:
            statements.append(("DELETE FROM queued_messages WHERE id > ?", (message.truncate_id,)))
        statements += [
            ("DELETE FROM queued_messages WHERE id = ?", (rid,)) for rid in message.delete
        ]
        for stream, first in message.firsts.items():
            # Deleted or pruned on the active meanwhile: not kept here.
            statements += [
                (_LESS_BEFORE, (stream, first, stream, first, stream)),
                ("DELETE FROM stream_messages WHERE stream = ? AND seq < ?", (stream, first)),
            ]
            journal.forget_before(stream, first)
        statements += [(_SET_LAST, (stream, last)) for stream, last in message.counters.items()]
        statements.append((_SET_LAST_ID, (QUEUED_LAST_ID, message.last_id)))
        # This journal now follows the active's history: it leads none, and
        # took over from none.
        statements += set_state({EPOCH: message.epoch, LEADER: "", PREVIOUS_EPOCH: ""})
        journal.execute(statements).addErrback(self._hello_failed)
        journal.note_counters(message.counters, message.last_id)
        self.link = message.link
        self.epoch = message.epoch
        self._next = message.base + 1
        self._catching_up = True
        self._removed = set()
        self._deleted = {}
        self._claimed = set()
        self._consumed = set()
        self._items_applied = 0
        self._end = None
        self.stats.catchups += 1

    def ship(self, message: wire.Ship) -> None:
        if message.link != self.link or self.link == 0:
            return
        if message.first != self._next:
            self.stats.gaps += 1
            _log.warn(
                "pair: replication gap (expected position {want}, got {got}); catching up again",
                want=self._next,
                got=message.first,
            )
            self.hello()
            return
        ops: list[WriteOp] = []
        for change in message.changes:
            if type(change) is tuple:  # a stream record: most of them
                ops.append(change)
                continue
            op = _operation(change)
            if op is not None:
                ops.append(op)
            elif isinstance(change, wire.ClientSecurity):
                self._install(change)
            elif isinstance(change, wire.Unwritten):
                # In the order of writes: after what came before it.
                self._apply(ops)
                ops = []
                self._journal.execute(unwrite_statements(change)).addErrback(
                    lambda failure: _log.failure(
                        "pair: removing what the active did not write", failure
                    )
                )
        self._apply(ops)
        self._next += len(message.changes)
        self.stats.applied += len(message.changes)
        self._acknowledge()

    def _apply(self, ops: list[WriteOp]) -> None:
        """Write C{ops} a SHIP carried (noting, during a catch-up, what they change)."""
        if self._catching_up:
            for op in ops:
                if isinstance(op, QueuedRemove):
                    self._removed.add(op.record_id)
                elif isinstance(op, StreamDelete):
                    self._deleted[op.stream] = max(self._deleted.get(op.stream, 0), op.through)
                elif isinstance(op, OwnerClaim):
                    self._claimed.add(op.address)
                elif isinstance(op, ConsumerSave):
                    p = op.position
                    self._consumed.add((p.stream, p.kind, p.name))
        self._journal.apply(ops)

    def items(self, message: wire.Items) -> None:
        if message.link != self.link or self.link == 0:
            return
        ops: list[WriteOp] = []
        deleted = self._deleted
        for change in message.changes:
            if type(change) is tuple:
                if deleted and change[1] <= deleted.get(change[0], 0):
                    continue  # deleted by a SHIP since it was read
                ops.append(change)
            elif isinstance(change, QueuedRecord):
                if change.id not in self._removed:
                    ops.append(QueuedStore(change, _ignore))
            elif isinstance(change, wire.OwnersPage):
                ops += self._owners_page(change)
            elif isinstance(change, wire.ConsumerChanged):
                p = change.position
                if (p.stream, p.kind, p.name) not in self._consumed:
                    ops.append(ConsumerSave(p, change.forget))
            elif isinstance(change, wire.ClientSecurity):
                self._install(change)
            else:
                op = _operation(change)
                if op is not None:
                    ops.append(op)
        self._journal.apply(ops)
        self._items_applied += 1
        self.stats.items += 1
        self._acknowledge()

    def _owners_page(self, page: wire.OwnersPage) -> list[WriteOp]:
        """
        The claims of C{page} that no SHIP has changed since it was read,
        as operations; the passive's other owners in its range are
        removed (in the order of writes).
        """
        claimed = self._claimed
        upper = None if page.final or not page.claims else page.claims[-1].address
        kept = {claim.address for claim in page.claims}
        kept.update(
            address
            for address in claimed
            if (page.after is None or address > page.after) and (upper is None or address <= upper)
        )
        if len(kept) <= _MOST_KEPT:
            where = ["address NOT IN (" + ",".join("?" * len(kept)) + ")"]
            parameters: list[Any] = list(kept)
            if page.after is not None:
                where.append("address > ?")
                parameters.append(page.after)
            if upper is not None:
                where.append("address <= ?")
                parameters.append(upper)
            self._journal.execute(
                [(f"DELETE FROM address_owners WHERE {' AND '.join(where)}", tuple(parameters))]
            ).addErrback(self._page_failed)
        return [
            OwnerClaim(claim.address, claim.user, claim.claimed)
            for claim in page.claims
            if claim.address not in claimed
        ]

    def _forget_failed(self, failure: Failure) -> None:
        _log.error("pair: forgetting the losses filled again failed: {e}", e=failure.value)

    def _page_failed(self, failure: Failure) -> None:
        _log.error("pair: removing owners the active does not have failed: {e}", e=failure.value)

    def _install(self, change: wire.ClientSecurity) -> None:
        """Put the active's clients' security state in force here (in memory only)."""
        install = self.on_security
        if install is None:
            if not self._security_ignored:
                self._security_ignored = True
                _log.warn(
                    "pair: the active sends its clients' passwords, keys and access rules,"
                    " and no endpoint of this broker authenticates clients: ignored"
                )
            return
        try:
            install(change)
        except ValueError as e:
            _log.error("pair: the active's clients' security state is not installed: {e}", e=e)

    def refill_asked(self, message: wire.RefillAsk) -> None:
        """
        The active lost records to damage: send those of C{message}'s
        stretch this journal holds, a page at a time (once caught up, and
        only on this link).
        """
        if message.link != self.link or not self.link or not self.in_sync:
            return
        if message.first > message.last:
            return
        reading = self._journal.read_stream_rows(
            message.stream, message.first, message.last, ITEMS_ROWS
        )
        reading.addCallback(self._send_refill, message)
        reading.addErrback(self._hello_failed)

    def _send_refill(self, rows: list[StreamRow], asked: wire.RefillAsk) -> None:
        if asked.link != self.link:
            return
        # A full page ends at its last record; a short one covers the stretch.
        through = rows[-1][1] if len(rows) >= ITEMS_ROWS else asked.last
        self._send(
            wire.Refill(asked.link, asked.stream, asked.first, through, list[wire.Change](rows))
        )

    def end(self, message: wire.CatchupEnd) -> None:
        if message.link != self.link or self.link == 0:
            return
        self._end = message.position
        self._acknowledge()

    def _acknowledge(self) -> None:
        """Ack what is on disk: one flush at a time, the next for what came meanwhile."""
        if self._flushing:
            self._dirty = True
            return
        self._flushing = True
        self._dirty = False
        link, position, items = self.link, self._next - 1, self._items_applied
        end = self._end
        self._journal.flush().addCallback(lambda _: self._flushed(link, position, items, end))

    def _flushed(self, link: int, position: int, items: int, end: int | None) -> None:
        self._flushing = False
        if link != self.link:
            return
        errors = self._journal.counters.errors
        if errors != self._errors:
            self._errors = errors
            _log.error("pair: this journal failed to write what the active sent; catching up again")
            self.hello()
            return
        self._send(wire.Ack(link, position, items))
        if end is not None and self._catching_up:
            self._catching_up = False
            self._removed = set()
            self._deleted = {}
            self._claimed = set()
            self._consumed = set()
            self._journal.execute(set_state({COMPLETE: "1"})).addCallback(
                lambda _: self._caught_up(link, position)
            )
        if self._dirty:
            self._acknowledge()

    def _caught_up(self, link: int, position: int) -> None:
        if link != self.link:
            return
        self.in_sync = True
        self._end = None
        _log.info("pair: caught up with the active")
        refilled, self._refilling = self._refilling, []
        if refilled:
            # Filled again from the active: nothing of them is lost any more.
            self._journal.forget_losses(refilled).addErrback(self._forget_failed)
            _log.info(
                "pair: the records this journal lost (a damaged file, salvaged) were copied"
                " again from the active: {streams}",
                streams=", ".join(map(repr, refilled)),
            )
        self._send(wire.CaughtUp(link, position))
