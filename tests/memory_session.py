"""
An in-memory session: a second kind of L{Session}, beside the MLM sessions
of the transport, that records what the broker model says to it as plain
Python values instead of encoding anything. Its policy is whatever the test
gives it. The model drives it exactly as it drives an MLM client, which is
what shows that a new kind of party (a peer broker, a pair partner, a
bridge) needs no change to the post office or the streams.

Tests: used by ``tests/unit/test_broker_sessions.py`` and
``tests/unit/test_broker_machine.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from malamute_pack.broker.letters import Letter
from malamute_pack.broker.receipts import Receipt
from malamute_pack.broker.session import Hold
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import ChunkRow
from malamute_pack.protocol.records import StreamRecord


@dataclass(frozen=True, slots=True)
class Said:
    """One thing the broker said to a session: what, and with which values."""

    what: str
    values: tuple[object, ...] = ()


@dataclass(eq=False)
class InMemorySession:
    """
    A session that keeps everything the broker calls it with, in order.

    @ivar policy: what a delivered letter leaves the broker holding.
    @ivar commands: the commands it speaks (None: all of them).
    @ivar said: what the broker said, oldest first.
    @ivar records: the stream records delivered (the very objects).
    @ivar letters: the letters delivered.
    @ivar receipts: the receipts settled for its letters.
    @ivar attachments: +1 per attached(), -1 per detached(), in order.
    @ivar full: while True, deliveries are refused (the party does not drain).
    @ivar user: the user it authenticated as (None: not authenticated).
    """

    name: str
    policy: Callable[[Letter], Hold] = lambda letter: Hold.UNTIL_ANSWERED
    commands: frozenset[type[mlm.Message]] | None = None
    said: list[Said] = field(default_factory=list)
    records: list[StreamRecord] = field(default_factory=list)
    letters: list[Letter] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    attachments: list[int] = field(default_factory=list)
    full: bool = False
    user: str | None = None

    def __repr__(self) -> str:
        return f"<in-memory session {self.name}>"

    def take(self) -> list[Said]:
        """What was said since the last take."""
        said, self.said = self.said, []
        return said

    # Policy

    def speaks(self, command: type[mlm.Message]) -> bool:
        return self.commands is None or command in self.commands

    def hold(self, letter: Letter) -> Hold:
        return self.policy(letter)

    # Lifecycle

    def attached(self) -> None:
        self.attachments.append(1)

    def detached(self) -> None:
        self.attachments.append(-1)

    # Answers and deliveries

    def ok(self) -> None:
        self.said.append(Said("ok"))

    def error(self, code: int, reason: str) -> None:
        self.said.append(Said("error", (code, reason)))

    def pong(self) -> None:
        self.said.append(Said("pong"))

    def deliver_stream(self, record: StreamRecord) -> bool:
        if self.full:
            return False
        self.records.append(record)
        self.said.append(Said("stream", (record.stream, record.seq, record.subject)))
        return True

    def deliver_letter(self, letter: Letter) -> bool:
        if self.full:
            return False
        self.letters.append(letter)
        self.said.append(Said("letter", (letter.kind.value, letter.address, letter.subject)))
        return True

    def gap(self, stream: str, missed: int, available: int) -> None:
        self.said.append(Said("gap", (stream, missed, available)))

    def stored(self, receipt: Receipt) -> None:
        self.receipts.append(receipt)
        self.said.append(Said("stored", (receipt.id, receipt.tracker, receipt.code)))

    def confirm(self, tracker: str, code: int, reason: str) -> None:
        self.said.append(Said("confirm", (tracker, code, reason)))

    def stream_status(self, stream: str, first: int, last: int, position: int) -> None:
        self.said.append(Said("status", (stream, first, last, position)))

    def deliver_chunk(self, stream: str, rows: list[ChunkRow]) -> bool:
        if self.full:
            return False
        self.said.append(Said("chunk", (stream, tuple(row.seq for row in rows))))
        return True

    def range_end(self, stream: str, last: int) -> None:
        self.said.append(Said("end", (stream, last)))

    def appended(
        self, stream: str, key: str, first: int, last: int, code: int, reason: str
    ) -> None:
        self.said.append(Said("appended", (stream, key, first, last, code)))

    def committed(self, stream: str, sequence: int, code: int, reason: str) -> None:
        self.said.append(Said("committed", (stream, sequence, code, reason)))
