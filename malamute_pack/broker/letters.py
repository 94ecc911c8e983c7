"""
Letters: mailbox messages and service requests while the broker holds them,
and the bounded queues that keep them (a mailbox and a service queue are the
same structure with different limits).

Tests: ``tests/unit/test_broker_letters.py``.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from malamute_pack.broker.connection import Connection
    from malamute_pack.broker.session import Session


class LetterState(enum.Enum):
    QUEUED = "queued"  # waiting in a mailbox or service queue
    HELD = "held"  # delivered, waiting for the recipient's answer (DONE or CONFIRM)
    DONE = "done"  # delivered and finished, or expired


class Kind(enum.Enum):
    MAILBOX = "mailbox"
    SERVICE = "service"


@dataclass(eq=False, slots=True)
class Letter:
    """
    One mailbox message or service request.

    @ivar id: its number, from the journal when there is one; stable
        across restarts, and what a version 2 recipient answers DONE with.
    @ivar sender: the sender's address ("" for an anonymous client).
    @ivar origin: the session it came from, to reach an anonymous sender
        (None for a letter recovered from the journal).
    @ivar address: the mailbox owner or the service name.
    @ivar deadline: when it expires undelivered (clock seconds), or None.
    @ivar holder: the connection that holds it, while one does.
    @ivar lease_until: while a worker holds it, when it goes back to its
        queue if still held (clock seconds), or None (no lease).
    """

    id: int
    kind: Kind
    sender: str
    address: str
    subject: str
    tracker: str
    content: Sequence[bytes]
    deadline: float | None = None
    origin: Session | None = field(default=None, repr=False)
    size: int = 0
    state: LetterState = LetterState.QUEUED
    queue: LetterQueue | None = field(default=None, repr=False)
    # Whether losing its recipient (expiry, disconnect) puts it back in its
    # queue: it is held until answered (Hold.UNTIL_ANSWERED).
    requeue_on_loss: bool = False
    holder: Connection | None = field(default=None, repr=False)
    # Bytes it counts against the broker's letter budget until done with.
    charged: int = 0
    lease_until: float | None = None
    # A service request a peer broker handed over: given only to local
    # workers (one hop), and this is called once it is done with here.
    relay: Callable[[Letter], None] | None = field(default=None, repr=False)
    # The pack peer that handed it over (its broker id) and its id there.
    relay_key: tuple[str, int] | None = None
    # When the broker took it (clock seconds): the age of the oldest letter.
    created: float = 0.0
    # Whether the journal has it (or will, at the end of this turn): a
    # letter delivered and done with as it arrives never goes there.
    journaled: bool = False

    def __post_init__(self) -> None:
        self.size = sum(map(len, self.content))


class QueueFull(Exception):
    """The queue's count or byte bound would be exceeded."""


class LetterQueue:
    """
    A first-in first-out queue of letters bounded by count and bytes.

    Letters leave from the front when delivered, or from anywhere when they
    expire; C{requeue} puts a letter back at the front.
    """

    def __init__(self, name: str, max_messages: int, max_bytes: int) -> None:
        self.name = name
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self._letters: deque[Letter] = deque()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._letters)

    def __iter__(self) -> Iterator[Letter]:
        return iter(self._letters)

    def _check_room(self, letter: Letter) -> None:
        if len(self._letters) >= self.max_messages:
            raise QueueFull(f"{self.name} holds {len(self._letters)} messages, its limit")
        if self.bytes + letter.size > self.max_bytes:
            raise QueueFull(f"{self.name} would exceed its limit of {self.max_bytes} bytes")

    def append(self, letter: Letter, bounded: bool = True) -> None:
        """
        Add C{letter} at the back.

        @param bounded: refuse if that would exceed a bound (letters
            recovered from the journal at startup are taken regardless).
        @raise QueueFull: if that would exceed a bound.
        """
        if bounded:
            self._check_room(letter)
        self._add(letter)
        self._letters.append(letter)

    def requeue(self, letter: Letter) -> None:
        """Put C{letter} back at the front; bounds do not refuse a return."""
        self._add(letter)
        self._letters.appendleft(letter)

    def _add(self, letter: Letter) -> None:
        letter.state = LetterState.QUEUED
        letter.queue = self
        self.bytes += letter.size

    def first(self) -> Letter | None:
        return self._letters[0] if self._letters else None

    def remove(self, letter: Letter) -> None:
        """Take C{letter} out, wherever it is."""
        if self._letters and self._letters[0] is letter:
            self._letters.popleft()
        else:
            self._letters.remove(letter)
        self.bytes -= letter.size
        letter.queue = None
