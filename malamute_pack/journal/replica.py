"""
The journal's replication hooks, for a broker of a primary/backup pair
(:mod:`malamute_pack.pair`): the position of each operation in the order
of writes (counted from 1 since the journal opened), the ``shipper`` that
sees every hand-over to the writer to send to the partner, and the hold
that keeps each batch's outcome (its callbacks, its stream records
becoming durable) until the partner says it has it too
(``replica_acked``). A batch whose outcome is refused that way (the
partner unreachable, the broker yielding) is on this disk all the same:
its error says where (``unconfirmed``), and ``confirm`` tells when the
partner has it after all, so that a retry waits for it instead of writing
it again. A batch the writer fails (a full disk) was shipped all the
same: its operations go to ``on_unwritten``, for the partner to remove
them too. It also times each batch from hand-over to commit
(``commit_latencies``, for the statistics).

Tests: ``tests/unit/test_journal_replica.py``.
"""

from __future__ import annotations

import copy
import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping

from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.writer import BatchOutcome, WriteOp

# What a pair's active hands its shipper: the position (in the order of
# writes, from 1) of the first operation, and the operations.
Shipper = Callable[[int, list[WriteOp]], None]
# Told whether a refused write was confirmed after all (None) or refused again.
Confirmed = Callable[[JournalError | None], None]


def _unconfirmed(error: JournalError, position: int) -> JournalError:
    """C{error} for the write at C{position}, which is on this disk (L{ReplicaHold.confirm})."""
    mine = copy.copy(error)
    mine.unconfirmed = position
    return mine


def _failed(outcome: BatchOutcome, error: JournalError, position: int) -> BatchOutcome:
    """
    C{outcome} (its last operation at C{position}) answered with C{error},
    unless it failed already: its records stay on disk here.
    """
    if outcome.error is not None:
        return outcome
    return dataclasses.replace(outcome, error=_unconfirmed(error, position))


class ReplicaHold:
    """
    Positions in the order of writes, and the outcomes held for the
    partner; ``finish`` gets each outcome once it is let go. ``seconds``
    is the reactor's clock.
    """

    def __init__(
        self,
        finish: Callable[[BatchOutcome], None],
        seconds: Callable[[], float],
        write_failed: Callable[[Mapping[str, int]], None] | None = None,
    ) -> None:
        self._finish = finish
        self._seconds = seconds
        # Told at once of a batch the writer failed, held or not.
        self._write_failed = write_failed
        self.shipper: Shipper | None = None
        # Told the operations of a batch the writer failed that were shipped.
        self.on_unwritten: Callable[[list[WriteOp]], None] | None = None
        # Waiting for the partner to have a refused write after all (confirm):
        # (its position, an order of arrival, the callback), a heap.
        self._confirms: list[tuple[int, int, Confirmed]] = []
        self._arrivals = itertools.count()
        self.reset()

    def reset(self) -> None:
        """
        Count from the start again (the journal opened): a write still
        waiting to be confirmed is not (its position counted from the old
        start; what the journal holds is restored from it).
        """
        confirms, self._confirms = self._confirms, []
        if confirms:
            error = JournalError("not acknowledged: the journal was opened again")
            error.reason = "not acknowledged: the journal was opened again"
            for _, _, done in confirms:
                done(error)
        # Operations handed to the writer and reported back, counted from 1
        # since open: positions the shipper and the partner's acks use.
        self.handed = 0
        self._reported = 0
        self._hold = False
        self._withheld: JournalError | None = None
        self._replica_position = 0
        # Outcomes held for the partner: (position of the batch's last op, outcome).
        self._held: deque[tuple[int, BatchOutcome]] = deque()
        # Per hand-over, the position of its last operation and when: how
        # long a batch took from hand-over to commit (commit_latencies).
        self._handed_at: deque[tuple[int, float]] = deque()
        # Seconds from hand-over to commit of the latest batches (statistics).
        self.commit_latencies: deque[float] = deque(maxlen=256)
        # The operations shipped and not yet reported, from position
        # _shipped_from on (kept while on_unwritten is set).
        self._shipped: deque[WriteOp] = deque()
        self._shipped_from = 1

    def handed_over(self, ops: list[WriteOp]) -> None:
        """``ops`` went to the writer: they take the next positions, and ship."""
        first = self.handed + 1
        self.handed += len(ops)
        self._handed_at.append((self.handed, self._seconds()))
        if self.shipper is not None:
            self.shipper(first, ops)
            if self.on_unwritten is not None:
                if not self._shipped:
                    self._shipped_from = first
                self._shipped.extend(ops)

    def batch_done(self, outcome: BatchOutcome) -> None:
        """The writer reports a batch: finished now, or held for the partner."""
        start = self._reported + 1
        self._reported += outcome.operations
        if self._shipped:
            self._reported_shipped(start, outcome.error is not None)
        if outcome.error is not None and self._write_failed is not None:
            self._write_failed(outcome.stream_last)
        handed_at = self._handed_at
        if handed_at:
            self.commit_latencies.append(self._seconds() - handed_at[0][1])
            while handed_at and handed_at[0][0] <= self._reported:
                handed_at.popleft()
        if self._withheld is not None and self._hold:
            self._finish(_failed(outcome, self._withheld, self._reported))
            return
        if self._hold and (self._held or self._replica_position < self._reported):
            self._held.append((self._reported, outcome))
            return
        self._finish(outcome)

    def _reported_shipped(self, start: int, failed: bool) -> None:
        """
        The batch of positions C{start}..C{self._reported} is reported: its
        shipped operations are let go, to L{on_unwritten} if it C{failed}.
        """
        shipped = self._shipped
        unwritten: list[WriteOp] = []
        while shipped and self._shipped_from <= self._reported:
            op = shipped.popleft()
            if failed and self._shipped_from >= start:
                unwritten.append(op)
            self._shipped_from += 1
        if unwritten and self.on_unwritten is not None:
            self.on_unwritten(unwritten)

    def withhold(self, error: JournalError) -> None:
        """
        Nothing held for the partner, nor anything reported from now on
        while outcomes wait for it, is acknowledged: each fails with
        ``error`` (the broker yields to its partner, or closes before the
        partner had it): a client told it failed tries again where it is
        served, while one told it was stored would count on what the
        serving broker may lack. (Alone, nothing waits: nothing changes.)
        """
        self._withheld = error
        self.refuse_held(error)

    def refuse_held(self, error: JournalError) -> None:
        """
        What waits for the partner now fails with ``error`` (later outcomes
        wait as before), and so does each write waiting to be confirmed.
        """
        held, self._held = self._held, deque()
        for position, outcome in held:
            self._finish(_failed(outcome, error, position))
        confirms, self._confirms = self._confirms, []
        for position, _, done in sorted(confirms):
            done(_unconfirmed(error, position))

    def confirm(self, position: int, done: Confirmed) -> None:
        """
        ``done(None)`` once the partner has the write at ``position`` (one
        whose outcome was refused, on this disk all the same), at once if
        it has or if nothing waits for it (alone); ``done(error)`` if it is
        refused again (its ``unconfirmed`` set again).
        """
        if self._withheld is not None and self._hold:
            done(_unconfirmed(self._withheld, position))
        elif not self._hold or position <= self._replica_position:
            done(None)
        else:
            heapq.heappush(self._confirms, (position, next(self._arrivals), done))

    def hold_for_replica(self, hold: bool) -> None:
        """
        With ``hold``, each batch's outcome waits until L{replica_acked}
        passes its last operation; without, whatever waits is let go at once.
        """
        self._hold = hold
        if not hold:
            self._release(self._reported)

    def replica_acked(self, position: int) -> None:
        """The partner has every operation up to ``position`` on its disk."""
        if position > self._replica_position:
            self._replica_position = position
            self._release(position)

    def _release(self, position: int) -> None:
        held = self._held
        while held and held[0][0] <= position:
            self._finish(held.popleft()[1])
        confirms = self._confirms
        while confirms and confirms[0][0] <= position:
            heapq.heappop(confirms)[2](None)
