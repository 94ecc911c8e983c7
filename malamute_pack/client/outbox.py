"""
What the client sends that expects no OK/ERROR: stream messages, letters,
requests, CONFIRMs, CREDITs aside (see L{malamute_pack.client.credit}) and
DONEs. Messages go out at once while the connection is usable and are
held (up to C{max_held}; more are dropped and counted) while it is not.

With protocol version 2 each MAILBOX_SEND and SERVICE_SEND is answered by
a STORED, in the order sent; the outbox keeps those sends in a FIFO and
hands each its answer. When the broker forgets us (ERROR 500) the sends it
never acknowledged are sent again after the replay, before the ones held
meanwhile (at least once: the recipient may get such a message twice).

Tests: ``tests/unit/test_client_outbox.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from twisted.logger import Logger

from malamute_pack.client.errors import ClientError, MalamuteError, MessageDroppedError
from malamute_pack.protocol import mlm

_log = Logger()

# Called once with the id of a stored message, or the error that refused or lost it.
StoredCallback = Callable[[int | ClientError], None]


@dataclass(eq=False, slots=True)
class StoredSend:
    """A MAILBOX_SEND or SERVICE_SEND (version 2) that waits for its STORED."""

    frames: list[bytes]
    stored: StoredCallback


Outgoing = list[bytes] | StoredSend


class Outbox:
    """
    The messages of one client on their way to the broker.

    @ivar dropped: messages dropped because C{max_held} were already held.
    """

    def __init__(self, send_frames: Callable[[list[bytes]], None], max_held: int) -> None:
        self._send_frames = send_frames
        self.max_held = max_held
        self.dropped = 0
        self._held: deque[Outgoing] = deque()
        # Sends on the wire waiting for their STORED, in the order sent.
        self._unstored: deque[StoredSend] = deque()

    @property
    def awaiting_stored(self) -> bool:
        """Whether a send on the wire still waits for its STORED."""
        return bool(self._unstored)

    @property
    def pending_stored(self) -> int:
        """Sends waiting for their STORED, held ones included."""
        return len(self._unstored) + sum(isinstance(m, StoredSend) for m in self._held)

    def post(self, message: Outgoing, usable: bool, state: str) -> None:
        """
        Send C{message} now if the connection is C{usable}, else hold it
        (C{state} names why, for the log and a dropped send's error).
        """
        if usable:
            self._transmit(message)
        elif len(self._held) < self.max_held:
            self._held.append(message)
        else:
            self._drop(message, state)

    def flush(self) -> None:
        """The connection is usable again: send what was held, in order."""
        held = self._held
        transmit = self._transmit
        while held:
            transmit(held.popleft())

    def stored(self, message: mlm.Stored) -> bool:
        """
        Give the oldest send on the wire its STORED; False if none waited
        (a late answer to a send made before the broker forgot us: it is
        being sent again, and will get its own STORED).
        """
        if not self._unstored:
            _log.info("STORED with no send waiting for it ignored (id {id})", id=message.id)
            return False
        send = self._unstored.popleft()
        if message.status_code == mlm.SUCCESS:
            send.stored(message.id)
        else:
            send.stored(MalamuteError(message.status_code, message.status_reason))
        return True

    def resend_unstored(self) -> None:
        """The broker forgot us: what it never acknowledged goes again, first."""
        self._held.extendleft(reversed(self._unstored))
        self._unstored.clear()

    def drop_all(self, error: ClientError) -> None:
        """The client closed: drop what is held; every send waiting fails with C{error}."""
        unstored = [*self._unstored, *(m for m in self._held if isinstance(m, StoredSend))]
        self._unstored.clear()
        self._held.clear()
        for send in unstored:
            send.stored(error)

    def _transmit(self, message: Outgoing) -> None:
        if isinstance(message, StoredSend):
            self._unstored.append(message)
            self._send_frames(message.frames)
        else:
            self._send_frames(message)

    def _drop(self, message: Outgoing, state: str) -> None:
        self.dropped += 1
        if isinstance(message, StoredSend):
            message.stored(
                MessageDroppedError(f"more than {self.max_held} messages held while {state}")
            )
        if self.dropped == 1 or self.dropped % 1000 == 0:
            _log.warn(
                "{count} messages dropped: more than {limit} held while {state}",
                count=self.dropped,
                limit=self.max_held,
                state=state,
            )
