"""
One connected client as the broker sees it, and the explicit per-client state
machine: for each (state, event) the actions the broker runs and the next
state, as in the C broker's ``mlm_server.xml``.

A routing id the broker has no client for is in the START state: it is not
stored, so a peer that never opens costs nothing. Events are message classes
of L{malamute_pack.protocol.mlm} plus the internal L{Event} values.

Tests: ``tests/test_broker_client.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from malamute_pack.protocol import mlm

if TYPE_CHECKING:
    from malamute_pack.broker.letters import Letter
    from malamute_pack.broker.streams import Stream


class State(enum.Enum):
    START = "start"  # not (or no longer) known: only CONNECTION_OPEN is valid
    CONNECTED = "connected"
    GONE = "gone"  # closed, expired or taken over; kept only by stale references


class Event(enum.Enum):
    EXPIRED = "expired"  # silent for longer than the heartbeat timeout
    TAKEN_OVER = "taken over"  # another client opened with the same address
    ANY = "*"  # any message without a row of its own in this state


# Action names are methods of the broker called ``action_<name>``.
Transition = tuple[tuple[str, ...], State]

MACHINE: Final[dict[tuple[State, type[mlm.Message] | Event], Transition]] = {
    (State.START, mlm.ConnectionOpen): (("register", "reply_ok", "deliver_mail"), State.CONNECTED),
    (State.START, Event.ANY): (("command_invalid",), State.START),
    # An OPEN on an open connection re-registers (the client changed address).
    (State.CONNECTED, mlm.ConnectionOpen): (
        ("deregister", "register", "reply_ok", "deliver_mail"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.ConnectionPing): (("reply_pong",), State.CONNECTED),
    (State.CONNECTED, mlm.ConnectionPong): ((), State.CONNECTED),
    (State.CONNECTED, mlm.ConnectionClose): (("reply_ok", "deregister"), State.GONE),
    (State.CONNECTED, mlm.StreamWrite): (("store_writer", "reply_ok"), State.CONNECTED),
    (State.CONNECTED, mlm.StreamRead): (("store_reader", "reply_ok"), State.CONNECTED),
    (State.CONNECTED, mlm.StreamReadFrom): (
        ("store_reader_from", "reply_ok", "resume_streams"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.StreamCancel): (("cancel_reader", "reply_ok"), State.CONNECTED),
    (State.CONNECTED, mlm.StreamSend): (("write_to_stream",), State.CONNECTED),
    (State.CONNECTED, mlm.MailboxSend): (("write_to_mailbox",), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceSend): (("write_to_service",), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceOffer): (
        ("store_offer", "reply_ok", "dispatch_offered"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.Credit): (
        ("credit", "deliver_mail", "dispatch_offered", "resume_streams"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.Confirm): (("confirm",), State.CONNECTED),
    (State.CONNECTED, mlm.Done): (("done",), State.CONNECTED),
    (State.CONNECTED, Event.EXPIRED): (("deregister",), State.GONE),
    (State.CONNECTED, Event.TAKEN_OVER): (("deregister",), State.GONE),
    # Messages only a broker sends (deliveries, OK, ERROR) are violations.
    (State.CONNECTED, Event.ANY): (("command_invalid", "deregister"), State.GONE),
}


def transition(state: State, event: type[mlm.Message] | Event) -> Transition:
    """The actions and next state for C{event} in C{state}."""
    found = MACHINE.get((state, event))
    if found is None:
        found = MACHINE.get((state, Event.ANY), ((), state))
    return found


@dataclass(slots=True)
class PendingAck:
    """A STORED owed to a version 2 sender; C{code} is None until settled."""

    tracker: str
    id: int = 0
    code: int | None = None
    reason: str = ""


@dataclass(eq=False, slots=True)
class Client:
    """
    A client with an open connection.

    @ivar route: its ZeroMQ routing id.
    @ivar address: its address; "" for an anonymous client (no mailbox).
    @ivar credit: None until it first sends CREDIT (unlimited, as v1 clients
        expect); afterwards how many more messages it may be sent.
    @ivar writer: the stream it publishes to, if any.
    @ivar deliver_prefix: STREAM_DELIVER header up to the subject, for the
        stream it writes to: prepared once, used for every message (and
        C{record_prefix} the same for STREAM_RECORD).
    @ivar reading: stream name to the patterns it reads with.
    @ivar offers: service name to the patterns it serves.
    @ivar version: the protocol version it opened with (2: docs/protocol.md).
    @ivar behind: stream name to the next sequence number to send it from
        the journal (it ran out of credit, or asked for a position); absent
        while it reads live.
    @ivar replaying: streams with a journal read under way for it.
    @ivar held: letters delivered to it and not done with yet, by letter id.
    @ivar acks: STORED answers owed to it, in the order of its sends.
    @ivar last_dispatch: when it last got a service request (dispatch count),
        so the least recently served worker gets the next one.
    """

    route: bytes
    address: str
    last_seen: float
    version: int = 1
    state: State = State.CONNECTED
    credit: int | None = None
    writer: Stream | None = None
    deliver_prefix: bytes = b""
    record_prefix: bytes = b""
    reading: dict[str, set[str]] = field(default_factory=dict)
    offers: dict[str, set[str]] = field(default_factory=dict)
    behind: dict[str, int] = field(default_factory=dict)
    replaying: set[str] = field(default_factory=set)
    held: dict[int, Letter] = field(default_factory=dict)
    acks: deque[PendingAck] = field(default_factory=deque)
    last_dispatch: int = 0
    dropped: int = 0
    malformed: int = 0

    def can_take(self) -> bool:
        """Whether one more message may be sent to it now."""
        return self.credit is None or self.credit > 0

    def subscriptions(self) -> int:
        return sum(map(len, self.reading.values())) + sum(map(len, self.offers.values()))

    def release(self, tracker: str) -> Letter | None:
        """The oldest held letter with C{tracker}, now released, if any."""
        for letter in self.held.values():
            if letter.tracker == tracker:
                del self.held[letter.id]
                return letter
        return None

    def __repr__(self) -> str:
        return f"<Client {self.address or '(anonymous)'} {self.route.hex()}>"
