"""
Sessions: how the broker model meets the parties connected to it.

A L{Session} stands for one connected party: an MLM client over ZeroMQ
today (L{malamute_pack.transport.mlm_session}); a peer broker, a pair
partner or a bridge tomorrow. The model never sees how a session reaches
its party: it answers and delivers by calling the session, and the session's
dialect decides the encoding (MLM v1, v2, a peer protocol) and the policy
(what a delivered letter leaves the broker holding, which commands exist).

A transport feeds the model through the L{Receiver} interface, which the
broker implements: decoded messages with the session they came from, the
input it could not decode, and the messages it rejected at the door.

Tests: ``tests/unit/test_broker_sessions.py`` (an in-memory session drives the
model), ``tests/unit/test_transport_sessions.py`` (the MLM sessions).
"""

from __future__ import annotations

import enum
from typing import Protocol

from malamute_pack.broker.letters import Letter
from malamute_pack.broker.receipts import Receipt
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import StreamRecord


class Hold(enum.Enum):
    """What the broker keeps of a letter once it is handed to a session."""

    # Done with at hand-over: it leaves the queue and the journal.
    NOTHING = "nothing"
    # Done with at hand-over, but remembered so that the recipient's CONFIRM
    # (by tracker) reaches the sender.
    FOR_CONFIRM = "for confirm"
    # Kept, and journaled, until the recipient answers it (DONE or CONFIRM);
    # back in its queue if the recipient is lost first.
    UNTIL_ANSWERED = "until answered"


class Session(Protocol):
    """
    One connected party, as the broker model sees it.

    @ivar user: the user its transport authenticated (PLAIN or CURVE), or
        None when it did not authenticate (a NULL endpoint): what the
        access policy and the ownership of addresses go by.
    """

    user: str | None

    # Policy (the session's dialect decides)

    def speaks(self, command: type[mlm.Message]) -> bool:
        """Whether C{command} is part of this session's protocol."""

    def hold(self, letter: Letter) -> Hold:
        """What handing C{letter} to this session leaves the broker holding."""

    # Lifecycle

    def attached(self) -> None:
        """The broker registered a connection for this session (it opened)."""

    def detached(self) -> None:
        """The broker forgot the session's connection (closed, expired, replaced)."""

    # Answers to commands

    def ok(self) -> None:
        """The last command succeeded."""

    def error(self, code: int, reason: str) -> None:
        """The last command (or the input) was refused."""

    def pong(self) -> None:
        """Answer a PING."""

    # Deliveries

    def deliver_stream(self, record: StreamRecord) -> bool:
        """
        A stream message for this reader. The same record object goes to
        every reader of one fan-out, so a session may reuse its encoding.

        @return: False if the party cannot take it now (what it has been
            sent is not drained yet): it was not sent, and the broker
            delivers it later (from the journal) or counts it as missed.
        """

    def deliver_letter(self, letter: Letter) -> bool:
        """
        A mailbox message or service request for this recipient.

        @return: False if the party cannot take it now: it was not sent,
            and the letter stays queued.
        """

    def gap(self, stream: str, missed: int, available: int) -> None:
        """Retention removed messages C{missed} to C{available - 1} before this reader got them."""

    def stored(self, receipt: Receipt) -> None:
        """The outcome of a letter this session sent (receipts come in send order)."""

    # Bulk reads and idempotent appends (a data pipeline's; version 2)

    def stream_status(self, stream: str, first: int, last: int, position: int) -> None:
        """Answer a stream query: first retained, last committed, and the position asked."""

    def deliver_chunk(self, stream: str, rows: list[ChunkRow]) -> bool:
        """
        Records of a range read, in order.

        @return: False if the party cannot take them now: they were not
            sent, and the broker reads them again later.
        """

    def range_end(self, stream: str, last: int) -> None:
        """A range read of C{stream} is complete up to C{last}."""

    def appended(
        self, stream: str, key: str, first: int, last: int, code: int, reason: str
    ) -> None:
        """The outcome of an append this session sent (C{first}..C{last} its records)."""

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        """The recipient of a tracked letter this session sent answered it (or it expired)."""

    def committed(self, stream: str, sequence: int, code: int, reason: str) -> None:
        """The outcome of a consumer's commit on C{stream} up to C{sequence}."""


class PartySession:
    """
    A base for the sessions of parties that are not clients (a peer broker
    of the pack, a multicast bridge): it speaks every command, takes
    nothing (each subclass says what it takes), and has nothing to say to
    the answers a client gets.
    """

    user: str | None = None

    def speaks(self, command: type[mlm.Message]) -> bool:
        return True

    def hold(self, letter: Letter) -> Hold:
        return Hold.NOTHING

    def attached(self) -> None:
        pass

    def detached(self) -> None:
        pass

    def ok(self) -> None:
        pass

    def error(self, code: int, reason: str) -> None:
        pass

    def pong(self) -> None:
        pass

    def deliver_stream(self, record: StreamRecord) -> bool:
        return True  # reads nothing: taken, and dropped

    def deliver_letter(self, letter: Letter) -> bool:
        return False

    def gap(self, stream: str, missed: int, available: int) -> None:
        pass

    def stored(self, receipt: Receipt) -> None:
        pass

    def stream_status(self, stream: str, first: int, last: int, position: int) -> None:
        pass

    def deliver_chunk(self, stream: str, rows: list[ChunkRow]) -> bool:
        return False

    def range_end(self, stream: str, last: int) -> None:
        pass

    def appended(
        self, stream: str, key: str, first: int, last: int, code: int, reason: str
    ) -> None:
        pass

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        pass

    def committed(self, stream: str, sequence: int, code: int, reason: str) -> None:
        pass


class Receiver(Protocol):
    """What a transport feeds: the broker, as its transports see it."""

    def receive(self, session: Session, message: mlm.Message) -> None:
        """One decoded message from C{session}."""

    def malformed(self, session: Session, reason: str) -> None:
        """Input from C{session} that did not decode."""

    def rejected(self, session: Session, message: mlm.Message, reason: str) -> None:
        """
        A message from C{session} that decoded but breaks the protocol's
        rules for its contents (a size limit, a string that is not UTF-8):
        refused for C{reason}, as the protocol answers that message.
        """

    def undelivered(self, session: Session, record: StreamRecord) -> None:
        """
        C{session} took C{record} (C{deliver_stream} said True) but its
        transport could not send it after all (the peer's queue filled
        before the transport's batch went out).
        """

    def unresponsive(self, session: Session, reason: str) -> None:
        """
        The transport gave C{session} up: it does not take what it is sent
        (not even the answers to its own commands) and its backlog passed
        its bound. The broker ends its connection, as if it had expired.
        """
