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
    (State.CONNECTED, mlm.StreamCancel): (("cancel_reader", "reply_ok"), State.CONNECTED),
    (State.CONNECTED, mlm.StreamSend): (("write_to_stream",), State.CONNECTED),
    (State.CONNECTED, mlm.MailboxSend): (("write_to_mailbox",), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceSend): (("write_to_service",), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceOffer): (
        ("store_offer", "reply_ok", "dispatch_offered"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.Credit): (
        ("credit", "deliver_mail", "dispatch_offered"),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.Confirm): (("confirm",), State.CONNECTED),
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
        stream it writes to: prepared once, used for every message.
    @ivar reading: stream name to the patterns it reads with.
    @ivar offers: service name to the patterns it serves.
    @ivar held: tracked letters delivered to it and not yet confirmed.
    @ivar last_dispatch: when it last got a service request (dispatch count),
        so the least recently served worker gets the next one.
    """

    route: bytes
    address: str
    last_seen: float
    state: State = State.CONNECTED
    credit: int | None = None
    writer: Stream | None = None
    deliver_prefix: bytes = b""
    reading: dict[str, set[str]] = field(default_factory=dict)
    offers: dict[str, set[str]] = field(default_factory=dict)
    held: dict[str, deque[Letter]] = field(default_factory=dict)
    last_dispatch: int = 0
    dropped: int = 0
    malformed: int = 0

    def can_take(self) -> bool:
        """Whether one more message may be sent to it now."""
        return self.credit is None or self.credit > 0

    def subscriptions(self) -> int:
        return sum(map(len, self.reading.values())) + sum(map(len, self.offers.values()))

    def hold(self, letter: Letter) -> None:
        self.held.setdefault(letter.tracker, deque()).append(letter)

    def release(self, tracker: str) -> Letter | None:
        """The oldest held letter with C{tracker}, now released, if any."""
        letters = self.held.get(tracker)
        if not letters:
            return None
        letter = letters.popleft()
        if not letters:
            del self.held[tracker]
        return letter

    def __repr__(self) -> str:
        return f"<Client {self.address or '(anonymous)'} {self.route.hex()}>"
