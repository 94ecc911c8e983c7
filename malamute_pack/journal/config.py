"""
The journal's settings: group commit, SQLite durability per kind of record,
retention and pruning, and the last-value streams (compacted by subject).

Tests: ``tests/unit/test_journal_journal.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from malamute_pack.journal.retention import DEFAULT_RETENTION
from malamute_pack.protocol.records import RetentionPolicy

# SQLite's PRAGMA synchronous levels, weakest first.
SYNCHRONOUS_LEVELS: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
# When the journal file is checked for damage as it opens
# (malamute_pack.journal.checking): never, after an unclean stop, always.
CHECKS_AT_OPEN: Final = ("never", "crash", "always")


@dataclass(frozen=True)
class JournalConfig:
    """
    ``commit_interval_s`` is the longest a write waits for more writes to
    share its transaction, ``commit_max_batch`` the most records in one.
    Stream records are written with ``stream_synchronous``; mailbox and
    service records with ``queue_synchronous``, and a batch holding both
    uses the stronger. ``prune_chunk_rows`` caps the records one pruning
    transaction deletes. ``crash_skip`` is how far sequence numbers and
    letter ids jump after a crash, past any handed out but never committed.
    ``compacted`` names the last-value streams (compacted by subject: the
    journal keeps each subject's latest record, docs/protocol.md), each
    keeping at most ``last_value_subjects`` subjects. A batch of
    ``insert_process_rows`` stream records or more (and nothing else) is
    written by the writer's insert process, outside the broker's GIL
    (:mod:`malamute_pack.journal.inserts`; 0: never). ``check_at_open``
    says when the file's pages and records are checked for damage as it
    opens (:mod:`malamute_pack.journal.checking`): ``crash`` (after an
    unclean stop, the default), ``always`` or ``never``.
    """

    commit_interval_s: float = 0.005
    commit_max_batch: int = 1000
    stream_synchronous: str = "NORMAL"
    queue_synchronous: str = "FULL"
    retention: RetentionPolicy = DEFAULT_RETENTION
    per_stream_retention: Mapping[str, RetentionPolicy] = field(default_factory=dict)
    prune_interval_s: float = 5.0
    prune_chunk_rows: int = 10_000
    crash_skip: int = 1_000_000
    compacted: frozenset[str] = frozenset()
    last_value_subjects: int = 1_000_000
    insert_process_rows: int = 200
    check_at_open: str = "crash"

    def __post_init__(self) -> None:
        for name in ("stream_synchronous", "queue_synchronous"):
            value = getattr(self, name)
            if value not in SYNCHRONOUS_LEVELS:
                levels = ", ".join(SYNCHRONOUS_LEVELS)
                raise ValueError(f"{name} must be one of {levels}: {value!r}")
        if self.commit_max_batch < 1:
            raise ValueError(f"commit_max_batch must be at least 1: {self.commit_max_batch}")
        if self.commit_interval_s < 0:
            raise ValueError(f"commit_interval_s must not be negative: {self.commit_interval_s}")
        if self.prune_interval_s <= 0:
            raise ValueError(f"prune_interval_s must be positive: {self.prune_interval_s}")
        if self.crash_skip < 1:
            raise ValueError(f"crash_skip must be at least 1: {self.crash_skip}")
        if self.prune_chunk_rows < 1:
            raise ValueError(f"prune_chunk_rows must be at least 1: {self.prune_chunk_rows}")
        if self.last_value_subjects < 1:
            raise ValueError(f"last_value_subjects must be at least 1: {self.last_value_subjects}")
        if self.check_at_open not in CHECKS_AT_OPEN:
            checks = ", ".join(CHECKS_AT_OPEN)
            raise ValueError(f"check_at_open must be one of {checks}: {self.check_at_open!r}")
        if self.insert_process_rows < 0:
            raise ValueError(
                f"insert_process_rows must not be negative: {self.insert_process_rows}"
            )

    def retention_for(self, stream: str) -> RetentionPolicy:
        """The retention policy that applies to ``stream``."""
        return self.per_stream_retention.get(stream, self.retention)
