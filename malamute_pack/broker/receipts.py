"""
Receipts: what the broker owes the sender of each letter (a MAILBOX_SEND or
SERVICE_SEND) once it knows the letter's fate, in the order the letters were
sent, whatever order the journal settles them in.

Every letter a connection sends gets a L{Receipt} when it arrives; the
receipt is settled when the letter is refused (at once) or journaled (later,
by the journal's group commit). Settled receipts at the head of the queue go
to the sender's session (L{Session.stored}); the session's dialect decides
what a receipt becomes on the wire (a STORED for protocol version 2, a
CONFIRM for a refused tracked letter in version 1, or nothing).

Tests: ``tests/unit/test_broker_receipts.py``, ``tests/unit/test_broker_idle_memory.py``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from malamute_pack.protocol import mlm


@dataclass(eq=False, slots=True)
class Receipt:
    """
    The outcome of one letter, owed to its sender.

    @ivar tracker: the sender's tracker for the letter ("" for none).
    @ivar id: the letter's id once stored (0 if refused).
    @ivar code: a protocol status code once settled (200 stored, 300
        refused or lost); None until then.
    """

    tracker: str
    id: int = 0
    code: int | None = None
    reason: str = ""

    @property
    def refused(self) -> bool:
        return self.code is not None and self.code != mlm.SUCCESS


class Receipts:
    """
    A connection's receipts, oldest first. Their queue is made for the first
    letter and dropped once it is empty: a connection with no letter in
    flight (an idle client) holds none (a deque takes 760 bytes, empty or not).
    """

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: deque[Receipt] | None = None

    def __len__(self) -> int:
        return 0 if self._waiting is None else len(self._waiting)

    def expect(self, tracker: str) -> Receipt:
        """Reserve the receipt for a letter just sent, behind those sent before it."""
        receipt = Receipt(tracker)
        if self._waiting is None:
            self._waiting = deque((receipt,))
        else:
            self._waiting.append(receipt)
        return receipt

    def settled(self, tracker: str, letter_id: int, code: int, reason: str) -> list[Receipt]:
        """
        A receipt settled as it is made (its letter refused, or done with,
        as it arrived), behind those sent before it; the settled receipts
        now at the head, in send order (itself alone when none waits: no
        queue is made for it).
        """
        receipt = Receipt(tracker, letter_id, code, reason)
        waiting = self._waiting
        if waiting is None:
            return [receipt]
        waiting.append(receipt)  # behind an older one still unsettled
        return []

    def settle(self, receipt: Receipt, letter_id: int, code: int, reason: str) -> list[Receipt]:
        """
        Settle C{receipt}; the settled receipts now at the head, in send
        order, which leave the queue (none while an older one is unsettled).
        """
        receipt.id, receipt.code, receipt.reason = letter_id, code, reason
        waiting = self._waiting
        ready: list[Receipt] = []
        if waiting is None:
            return ready  # cleared: the connection is gone
        while waiting and waiting[0].code is not None:
            ready.append(waiting.popleft())
        if not waiting:
            self._waiting = None
        return ready

    def clear(self) -> None:
        """Forget every receipt (the connection is gone: nobody to tell)."""
        self._waiting = None
