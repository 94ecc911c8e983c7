"""
A connection: what the broker keeps for one session between its
CONNECTION_OPEN and its end (close, expiry, takeover, violation): address,
credit, what it writes and reads, what it serves, the letters it holds and
the receipts it is owed.

Tests: ``tests/unit/test_broker_model.py``, ``tests/unit/test_broker_sessions.py``,
``tests/unit/test_broker_idle_memory.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from twisted.logger import Logger

from malamute_pack.broker.machine import State
from malamute_pack.broker.receipts import Receipts

if TYPE_CHECKING:
    from malamute_pack.broker.letters import Letter
    from malamute_pack.broker.ranges import RangeRead
    from malamute_pack.broker.session import Session
    from malamute_pack.broker.stream import Stream

_log = Logger()

# What a connection's consuming entry holds, beside a reader's name (names
# never hold a NUL: L{malamute_pack.broker.limits.check_name}):
TAKEN_OVER = ""  # another connection took its consumer over
MEMBER = "\x00group"  # a member of a group homed here
REMOTE_MEMBER = "\x00remote"  # a member of a group homed on another broker of a pack
_MEMBERSHIPS = (MEMBER, REMOTE_MEMBER)


@dataclass(eq=False, slots=True)
class Connection:
    """
    One open session's state in the model.

    @ivar session: where its answers and deliveries go.
    @ivar address: its address; "" for an anonymous client (no mailbox).
    @ivar credit: None until it first sends CREDIT (unlimited, as libmlm
        clients expect); afterwards how many more messages it may be sent.
    @ivar writer: the stream it publishes to, if any.
    @ivar reading: stream name to the patterns it reads with.
    @ivar offers: service name to the patterns it serves.
    @ivar behind: stream name to the next sequence number to send it from
        the journal (it ran out of credit, or asked for a position); absent
        while it reads live.
    @ivar replaying: streams with a journal read under way for it.
    @ivar held: letters delivered to it and not answered yet, by letter id.
    @ivar receipts: the outcomes owed to it for the letters it sent.
    @ivar last_dispatch: when it last got a service request (dispatch count),
        so the least recently served worker gets the next one.
    @ivar stalled: its session could not take the last delivery: nothing
        more is pushed at it until it is retried (L{Stalled}).
    @ivar remote: it stands for a peer broker of the pack, or for an address
        or a service held there (L{malamute_pack.pack}), not for a client
        of this broker: it is never announced to peers, takes only what was
        first written here, and gets service requests only when no local
        worker can.
    @ivar internal: it stands for a part of this broker's process (a
        multicast bridge, L{malamute_pack.multicast}): a local reader or
        writer whose patterns the pack announces, never expired for silence.
    @ivar durable: it reads only records durable here, as a peer broker
        does (a consumer group's reader: a record whose write then fails,
        written again by its writer's retry, must not be handed to one
        member and then, at its new number, to another).
    @ivar history: the streams it asked to read from a position (earliest,
        a sequence number or a time): records a peer replays from its
        history reach it live; a reader from the latest never gets them.
    @ivar ranges: its range reads under way (STREAM_READ_RANGE), by stream.
    @ivar consuming: stream name to the consumer it reads that stream as
        (STREAM_CONSUME; L{TAKEN_OVER} once another connection took it
        over, L{MEMBER} or L{REMOTE_MEMBER} for a group's member); None
        until it consumes (L{malamute_pack.broker.consumers}).
    @ivar new_consumers: consumer and group names it made (its limit is
        C{consumers_per_connection}).
    """

    session: Session
    address: str
    last_seen: float
    state: State = State.CONNECTED
    credit: int | None = None
    writer: Stream | None = None
    reading: dict[str, set[str]] = field(default_factory=dict)
    _offers: dict[str, set[str]] | None = field(default=None, init=False, repr=False)
    behind: dict[str, int] = field(default_factory=dict)
    _replaying: set[str] | None = field(default=None, init=False, repr=False)
    _held: dict[int, Letter] | None = field(default=None, init=False, repr=False)
    receipts: Receipts = field(default_factory=Receipts)
    last_dispatch: int = 0
    dropped: int = 0
    stalled: bool = False
    remote: bool = False
    internal: bool = False
    durable: bool = False
    _history: set[str] | None = field(default=None, init=False, repr=False)
    _ranges: dict[str, RangeRead] | None = field(default=None, init=False, repr=False)
    consuming: dict[str, str] | None = None
    new_consumers: int = 0
    # When it opened (clock seconds; the management API shows its age).
    opened: float = 0.0

    def __post_init__(self) -> None:
        if not self.opened:
            self.opened = self.last_seen

    # offers, replaying, held, history and ranges are made on first use: most
    # connections never need them, and an idle client should cost little
    # (an empty set takes 216 bytes, an empty dict 64).

    @property
    def offers(self) -> dict[str, set[str]]:
        if self._offers is None:
            self._offers = {}
        return self._offers

    @property
    def replaying(self) -> set[str]:
        if self._replaying is None:
            self._replaying = set()
        return self._replaying

    @property
    def held(self) -> dict[int, Letter]:
        if self._held is None:
            self._held = {}
        return self._held

    def held_count(self) -> int:
        """How many letters it holds (asking makes no table)."""
        return len(self._held) if self._held else 0

    @property
    def history(self) -> set[str]:
        if self._history is None:
            self._history = set()
        return self._history

    @property
    def ranges(self) -> dict[str, RangeRead]:
        if self._ranges is None:
            self._ranges = {}
        return self._ranges

    @property
    def gone(self) -> bool:
        return self.state is State.GONE

    def can_take(self) -> bool:
        """Whether one more message may be sent to it now."""
        return not self.stalled and (self.credit is None or self.credit > 0)

    def took(self) -> None:
        """It was sent one message: that uses one credit, if it uses credit."""
        if self.credit is not None:
            self.credit -= 1

    def subscriptions(self) -> int:
        """Its stream patterns, service offers and group memberships."""
        offers = self._offers
        consuming = self.consuming
        return (
            sum(map(len, self.reading.values()))
            + (sum(map(len, offers.values())) if offers else 0)
            + (sum(1 for c in consuming.values() if c in _MEMBERSHIPS) if consuming else 0)
        )

    def release(self, tracker: str) -> Letter | None:
        """The oldest held letter with C{tracker}, now released, if any."""
        for letter in self.held.values():
            if letter.tracker == tracker:
                del self.held[letter.id]
                return letter
        return None

    def lost_to_retention(self, stream: str, missed: int, available: int) -> None:
        """
        Records C{missed} up to C{available} - 1 of C{stream}, which it
        wanted, are gone (retention): logged, and its session is told.
        """
        _log.info(
            "{connection} lost records {missed}-{last} of stream {stream!r} to retention",
            connection=self,
            missed=missed,
            last=available - 1,
            stream=stream,
        )
        self.session.gap(stream, missed, available)

    def lost_to_damage(self, stream: str, missed: int, available: int) -> None:
        """
        Records C{missed} up to C{available} - 1 of C{stream}, which it
        wanted, cannot be served: the journal found them damaged (or lost
        them with a damaged file). Logged, and its session is told of a gap
        (the protocol's STREAM_GAP has no reason: this line has it).
        """
        _log.info(
            "{connection} is told of a gap: records {missed}-{last} of stream {stream!r}"
            " are damaged in the journal and are not served",
            connection=self,
            missed=missed,
            last=available - 1,
            stream=stream,
        )
        self.session.gap(stream, missed, available)

    def __repr__(self) -> str:
        return f"<Connection {self.address or '(anonymous)'} {self.session!r}>"
