"""
The settings the broker accepted (producer stream, consumer patterns and
removals, worker offers), kept for replay when the broker forgets us, and
the replay plan: every setting again, in order, a stream on which a record
was already handed over resuming right after it (STREAM_READ_FROM
RESUME, every pattern from the same position) so that nothing written
meanwhile is missed and nothing is delivered twice; a durable consumer
resuming from the position the broker keeps for it (STREAM_CONSUME RESUME).
Both say the number after the last record handed over: a broker whose
journal was made afresh, numbering the stream again, tells the client so
(a STREAM_GAP whose available is below its missed) instead of having it
drop the new records as repeats.
A reading from a last-value stream's last values resumes after the last
record handed over too (its snapshot comes in sequence order, then the
live records: what follows that record is the rest of the snapshot and
what was written since, each once, the snapshot not sent again), and asks
for last values again when nothing was handed over.

Tests: ``tests/unit/test_client_subscriptions.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from malamute_pack.client.dedupe import SeenSequences
from malamute_pack.protocol import mlm

# Commands whose acceptance is recorded for replay.
Setting = (
    mlm.StreamWrite
    | mlm.StreamRead
    | mlm.StreamReadFrom
    | mlm.StreamConsume
    | mlm.StreamCancel
    | mlm.ServiceOffer
)
SETTINGS: tuple[type[Setting], ...] = (
    mlm.StreamWrite,
    mlm.StreamRead,
    mlm.StreamReadFrom,
    mlm.StreamConsume,
    mlm.StreamCancel,
    mlm.ServiceOffer,
)
_Reader = mlm.StreamRead | mlm.StreamReadFrom | mlm.StreamConsume


class ReplayStep(NamedTuple):
    """
    One command of a replay; C{fallback} is what to send instead if the
    broker refuses it (a resume refused by a broker without a journal:
    subscribe as the application first did).
    """

    setting: Setting
    fallback: Setting | None = None


class Subscriptions:
    """
    The recorded settings of one client.

    @param sequences: what the inbox handed over of each stream; read for
        resume positions, and a stream is forgotten there when the
        application stops reading it.
    """

    def __init__(self, sequences: SeenSequences) -> None:
        self._sequences = sequences
        self._settings: list[Setting] = []

    @property
    def settings(self) -> tuple[Setting, ...]:
        """The recorded settings, in the order a reconnection replays them."""
        return tuple(self._settings)

    def record(self, setting: Setting) -> None:
        """Remember an accepted setting for replay, dropping what it supersedes."""
        kept = self._settings
        if isinstance(setting, mlm.StreamWrite):
            kept = [s for s in kept if not isinstance(s, mlm.StreamWrite)]
        elif isinstance(setting, mlm.StreamCancel):
            self._sequences.forget(setting.stream)
            kept = [
                s
                for s in kept
                if not (isinstance(s, _Reader | mlm.StreamCancel) and s.stream == setting.stream)
            ]
        elif isinstance(setting, _Reader):
            if setting in kept:
                return
            # A pattern read again from another position replaces the old reading.
            kept = [
                s
                for s in kept
                if not (
                    isinstance(s, _Reader)
                    and (s.stream, s.pattern) == (setting.stream, setting.pattern)
                )
            ]
        elif setting in kept:
            return
        kept.append(setting)
        self._settings = kept

    def replay_plan(self) -> list[ReplayStep]:
        """
        The settings to send again: a stream with a record seen resumes right
        after it, every pattern from that same position.
        """
        plan = []
        for setting in self._settings:
            if not isinstance(setting, _Reader):
                plan.append(ReplayStep(setting))
                continue
            last = self._sequences.last(setting.stream)
            if isinstance(setting, mlm.StreamConsume):
                # The broker keeps a consumer's position: resume from it (the
                # inbox drops what was already handed over). Ours says where
                # we were, so that a broker that numbers the stream again
                # tells us.
                plan.append(ReplayStep(_resumed(setting, last)))
                continue
            if last is None:
                plan.append(ReplayStep(setting))
            else:
                resume = mlm.StreamReadFrom(setting.stream, setting.pattern, mlm.RESUME, last + 1)
                plan.append(ReplayStep(resume, fallback=setting))
        return plan


def _resumed(consume: mlm.StreamConsume, last: int | None) -> mlm.StreamConsume:
    """
    C{consume} resuming from the consumer's position, saying the number
    after the last record handed over (0: none).
    """
    return mlm.StreamConsume(
        consume.stream,
        consume.pattern,
        consume.consumer,
        consume.group,
        mlm.RESUME,
        0 if last is None else last + 1,
    )
