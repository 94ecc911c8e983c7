"""
What the journal's writer-thread tests share (``tests/unit/test_journal_isolation.py``,
``tests/unit/test_journal_inserts.py``): L{WriterCase}, a L{JournalWriter}
started alone on a connection the test controls, whose statements it sees;
and L{ids_before}, where a journal's letter ids start.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import ClassVar, cast

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFromThreads
from twisted.trial.unittest import TestCase

from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.schema import QUEUED_LAST_ID, migrate
from malamute_pack.journal.writer import (
    Barrier,
    BatchOutcome,
    JournalWriter,
    PruneOutcome,
    Resume,
    Stop,
    WriteOp,
)
from tests.unit.test_journal_journal import new_path


class WriterCase(TestCase):
    """A writer thread on a fresh journal file, with C{config}; stopped after the test."""

    config: ClassVar[JournalConfig]

    def setUp(self) -> None:
        self.path = new_path(self)
        self.path.parent.mkdir()
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        migrate(self.conn)
        self.statements: list[str] = []
        self.conn.set_trace_callback(self.statements.append)
        self.batches: list[BatchOutcome] = []
        self.prunes: list[PruneOutcome] = []
        self.writer = JournalWriter(
            self.conn,
            self.path,
            self.config,
            cast(IReactorFromThreads, reactor).callFromThread,
            self.reported,
            self.prunes.append,
        )
        self.writer.start()
        self.stopped: Deferred[None] | None = None

    def reported(self, outcome: BatchOutcome) -> None:
        """A batch's outcome, heard as the journal hears it: a failure lets the writer go on."""
        self.batches.append(outcome)
        if outcome.error is not None:
            self.writer.submit(Resume())

    def stop(self) -> Deferred[None]:
        """Stop the writer (once)."""
        if self.stopped is None:
            stopped = self.stopped = Deferred()
            self.writer.submit(Stop(lambda: stopped.callback(None)))
        return self.stopped

    def tearDown(self) -> Deferred[None]:  # type: ignore[override]
        return self.stop()

    def write(self, *ops: WriteOp) -> Deferred[None]:
        """Hand C{ops} over as one batch; fires once it has been written."""
        self.statements.clear()
        done: Deferred[None] = Deferred()
        self.writer.submit(list(ops))
        self.writer.submit(Barrier(lambda: done.callback(None)))
        return done


def ids_before(path: Path) -> int:
    """
    The last letter id the journal at C{path} has saved: a new journal's
    first letter gets the next one (its ids start past its creation time).
    """
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute(
            "SELECT value FROM journal_counters WHERE name = ?", (QUEUED_LAST_ID,)
        ).fetchone()
    return int(row[0]) if row else 0
