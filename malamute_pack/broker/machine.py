"""
The broker's per-session state machine, as a table in the manner of the C
broker's ``mlm_server.xml``: for each (state, event), the actions to run, in
order, and the next state.

A session with no connection is in START: the broker stores nothing for it,
so a party that never opens costs nothing. CONNECTION_OPEN registers a
connection (CONNECTED); closing, expiry, a takeover of the address, a new
OPEN on the same session or a protocol violation end it (GONE: a connection
in GONE is out of the registry and is kept only by stale references, such
as a journal read still under way for it).

Events are the MLM message classes (what a session received) and the
internal events below. An action that refuses (raises
L{malamute_pack.broker.errors.Refused}) stops the row: the later actions do
not run and the state does not change. The broker binds every L{Action} to
its method once, and checks at import that each has one.

Tests: ``tests/unit/test_broker_machine.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, NamedTuple

from malamute_pack.protocol import mlm


class State(enum.Enum):
    START = "start"  # no connection: only CONNECTION_OPEN is valid
    CONNECTED = "connected"
    GONE = "gone"  # ended; out of the registry

    # Members are singletons: hash them by identity, in C (Enum's own
    # __hash__ is Python code, and a state is hashed for every message).
    __hash__ = object.__hash__


# Internal events: what happens to a session besides the messages it sends.


@dataclass(frozen=True, slots=True)
class Expired:
    """The session was silent for longer than the heartbeat timeout."""


@dataclass(frozen=True, slots=True)
class TakenOver:
    """Another session opened with this connection's address."""


@dataclass(frozen=True, slots=True)
class Replaced:
    """The same session opened again (with another address or version)."""


@dataclass(frozen=True, slots=True)
class Malformed:
    """The session sent input that does not decode."""

    reason: str


@dataclass(frozen=True, slots=True)
class Rejected:
    """
    The session sent C{message}, which its transport rejected at the door
    (it breaks a size limit, or a name in it is not valid UTF-8) for
    C{reason}.
    """

    message: mlm.Message
    reason: str


@dataclass(frozen=True, slots=True)
class Unresponsive:
    """The transport gave the session up: it does not read what it is sent."""

    reason: str


class AnyOther:
    """The key of a state's row for every event without a row of its own."""


InternalEvent = Expired | TakenOver | Replaced | Malformed | Rejected | Unresponsive
EXPIRED: Final = Expired()
TAKEN_OVER: Final = TakenOver()
REPLACED: Final = Replaced()

# What a row is keyed by: the type of the event.
EventType = type[mlm.Message] | type[InternalEvent] | type[AnyOther]


class Action(enum.Enum):
    """The broker's actions; each value names a method C{action_<value>}."""

    REGISTER = "register"
    DEREGISTER = "deregister"
    REPLY_OK = "reply_ok"
    REPLY_PONG = "reply_pong"
    REPLY_INVALID = "reply_invalid"
    REPLY_MALFORMED = "reply_malformed"
    REFUSE_REJECTED = "refuse_rejected"
    REQUIRE_DIALECT = "require_dialect"
    DELIVER_MAIL = "deliver_mail"
    STORE_WRITER = "store_writer"
    STORE_READER = "store_reader"
    STORE_READER_FROM = "store_reader_from"
    RESUME_STREAMS = "resume_streams"
    CANCEL_READER = "cancel_reader"
    WRITE_TO_STREAM = "write_to_stream"
    WRITE_TO_MAILBOX = "write_to_mailbox"
    WRITE_TO_SERVICE = "write_to_service"
    STORE_OFFER = "store_offer"
    DISPATCH_OFFERED = "dispatch_offered"
    CREDIT = "credit"
    CONFIRM = "confirm"
    DONE = "done"
    QUERY_STREAM = "query_stream"
    STORE_RANGE_READER = "store_range_reader"
    APPEND_TO_STREAM = "append_to_stream"
    CONSUME = "consume"
    COMMIT = "commit"


class Row(NamedTuple):
    actions: tuple[Action, ...]
    next: State


_A = Action
_OPEN = Row((_A.REGISTER, _A.REPLY_OK, _A.DELIVER_MAIL), State.CONNECTED)
_END = Row((_A.DEREGISTER,), State.GONE)

MACHINE: Final[dict[tuple[State, EventType], Row]] = {
    (State.START, mlm.ConnectionOpen): _OPEN,
    (State.START, Malformed): Row((_A.REPLY_MALFORMED,), State.START),
    (State.START, Rejected): Row((_A.REFUSE_REJECTED,), State.START),
    (State.START, Unresponsive): Row((), State.START),
    # ERROR 500 to a stranger, so a libmlm client opens again after a restart.
    (State.START, AnyOther): Row((_A.REPLY_INVALID,), State.START),
    # An OPEN on an open session replaces its connection (new address or version).
    (State.CONNECTED, mlm.ConnectionOpen): _OPEN,
    (State.CONNECTED, mlm.ConnectionPing): Row((_A.REPLY_PONG,), State.CONNECTED),
    (State.CONNECTED, mlm.ConnectionPong): Row((), State.CONNECTED),
    (State.CONNECTED, mlm.ConnectionClose): Row((_A.REPLY_OK, _A.DEREGISTER), State.GONE),
    (State.CONNECTED, mlm.StreamWrite): Row((_A.STORE_WRITER, _A.REPLY_OK), State.CONNECTED),
    (State.CONNECTED, mlm.StreamRead): Row((_A.STORE_READER, _A.REPLY_OK), State.CONNECTED),
    (State.CONNECTED, mlm.StreamReadFrom): Row(
        (_A.REQUIRE_DIALECT, _A.STORE_READER_FROM, _A.REPLY_OK, _A.RESUME_STREAMS),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.StreamCancel): Row((_A.CANCEL_READER, _A.REPLY_OK), State.CONNECTED),
    (State.CONNECTED, mlm.StreamSend): Row((_A.WRITE_TO_STREAM,), State.CONNECTED),
    (State.CONNECTED, mlm.MailboxSend): Row((_A.WRITE_TO_MAILBOX,), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceSend): Row((_A.WRITE_TO_SERVICE,), State.CONNECTED),
    (State.CONNECTED, mlm.ServiceOffer): Row(
        (_A.STORE_OFFER, _A.REPLY_OK, _A.DISPATCH_OFFERED), State.CONNECTED
    ),
    (State.CONNECTED, mlm.Credit): Row(
        (_A.CREDIT, _A.DELIVER_MAIL, _A.DISPATCH_OFFERED, _A.RESUME_STREAMS), State.CONNECTED
    ),
    (State.CONNECTED, mlm.Confirm): Row((_A.CONFIRM,), State.CONNECTED),
    (State.CONNECTED, mlm.Done): Row((_A.REQUIRE_DIALECT, _A.DONE), State.CONNECTED),
    # Bulk reads and idempotent appends (a data pipeline's).
    (State.CONNECTED, mlm.StreamQuery): Row((_A.REQUIRE_DIALECT, _A.QUERY_STREAM), State.CONNECTED),
    (State.CONNECTED, mlm.StreamReadRange): Row(
        (_A.REQUIRE_DIALECT, _A.STORE_RANGE_READER, _A.REPLY_OK, _A.RESUME_STREAMS),
        State.CONNECTED,
    ),
    (State.CONNECTED, mlm.StreamAppend): Row(
        (_A.REQUIRE_DIALECT, _A.APPEND_TO_STREAM), State.CONNECTED
    ),
    # Consumers the broker remembers.
    (State.CONNECTED, mlm.StreamConsume): Row(
        (_A.REQUIRE_DIALECT, _A.CONSUME, _A.REPLY_OK, _A.RESUME_STREAMS), State.CONNECTED
    ),
    (State.CONNECTED, mlm.StreamCommit): Row((_A.REQUIRE_DIALECT, _A.COMMIT), State.CONNECTED),
    (State.CONNECTED, Expired): _END,
    (State.CONNECTED, Unresponsive): _END,
    (State.CONNECTED, TakenOver): _END,
    (State.CONNECTED, Replaced): _END,
    (State.CONNECTED, Malformed): Row((_A.REPLY_MALFORMED, _A.DEREGISTER), State.GONE),
    (State.CONNECTED, Rejected): Row((_A.REFUSE_REJECTED,), State.CONNECTED),
    # Messages only a broker sends (deliveries, OK, ERROR) are violations.
    (State.CONNECTED, AnyOther): Row((_A.REPLY_INVALID, _A.DEREGISTER), State.GONE),
}


def row(state: State, event: EventType) -> Row:
    """The row for C{event} in C{state}: its own, or the state's row for any other."""
    found = MACHINE.get((state, event))
    if found is None:
        found = MACHINE[(state, AnyOther)]
    return found
