"""
Retention applied: prunes the journal's writer runs in the order of writes
(:class:`~malamute_pack.journal.writer.Prune`), asked for by a
``LoopingCall`` every ``prune_interval_s`` (unless one is running) or by
whoever calls :meth:`Pruning.prune`. Each prune's outcome moves the
streams' first retained numbers on (:mod:`malamute_pack.journal.sequencing`)
and is counted; a failed one is reported as a journal error.

Tests: ``tests/unit/test_journal_pruning.py``, ``tests/unit/test_journal_retention.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure

from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.handover import HandOver
from malamute_pack.journal.sequencing import Sequencer
from malamute_pack.journal.writer import JournalWriter, Prune, PruneOutcome


class Pruning:
    """
    The prunes of one journal: handed over by ``hand`` to the writer that
    ``open_writer`` returns (or raises JournalError for a closed journal).
    """

    def __init__(
        self,
        reactor: IReactorTime,
        hand: HandOver,
        sequence: Sequencer,
        open_writer: Callable[[], JournalWriter],
    ) -> None:
        self._reactor = reactor
        self._hand = hand
        self._sequence = sequence
        self._open_writer = open_writer
        self._loop: LoopingCall | None = None
        self._pruning = False

    def start(self, interval: float) -> None:
        """Prune every ``interval`` seconds from now on."""
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self._reactor
        self._loop.start(interval, now=False)

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def prune(self, now: float | None = None) -> Deferred[int]:
        """
        Apply retention as of ``now`` (the reactor's time by default); fires
        with the number of stream records deleted, or fails with JournalError.
        Prunes asked for while one is under way run after it, in turn.
        """
        pruned: Deferred[int] = Deferred()

        def done(outcome: PruneOutcome) -> None:
            if outcome.error is not None:
                pruned.errback(outcome.error)
            else:
                pruned.callback(outcome.deleted)

        at = self._reactor.seconds() if now is None else now
        writer = self._open_writer()
        self._hand.direct(writer, Prune(at, done))
        return pruned

    def _tick(self) -> None:
        if self._pruning or self._hand.writer is None:
            return
        self._pruning = True

        def finished(result: object) -> object:
            self._pruning = False
            if isinstance(result, Failure) and isinstance(result.value, JournalError):
                return None  # already reported through on_error by done
            return result

        self.prune().addBoth(finished)

    def done(self, outcome: PruneOutcome) -> None:
        """The writer reports a pruning step: count it, move the first numbers on."""
        self._hand.counters.pruned += outcome.deleted
        self._sequence.pruned(outcome.first_seq)
        if outcome.error is not None:
            self._hand.report(outcome.error)
