"""
The journal's reader thread: reads of committed records (the queries of
:mod:`malamute_pack.journal.reads`) run there, on a connection of their
own, while the writer thread writes (WAL lets them), and each fires a
Deferred in the reactor thread. What SQLite fails with comes back as a
JournalError, whose ``reason`` says the read failed and why (for the
reader's answer).

Tests: ``tests/unit/test_journal_reader.py``.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.scan import describe

P = ParamSpec("P")
T = TypeVar("T")


def _daemon_thread(*args: Any, **kwargs: Any) -> threading.Thread:
    """The reader pool's threads (L{ThreadPool.threadFactory}), daemon ones."""
    return threading.Thread(*args, daemon=True, **kwargs)


class ReaderThread:
    """
    One thread reading the journal at ``path`` on the connection it is
    started with; ``reactor`` hears of each read's end.
    """

    def __init__(self, path: Path, reactor: IReactorFromThreads) -> None:
        self._path = path
        self._reactor = reactor
        self._conn: sqlite3.Connection | None = None
        self._pool: ThreadPool | None = None
        self.pending = 0
        """Reads asked for and not yet answered."""

    @property
    def running(self) -> bool:
        return self._pool is not None

    def start(self, conn: sqlite3.Connection) -> None:
        """Read on ``conn`` from now on, in a thread of its own."""
        self._conn = conn
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="journal-reader")
        # Daemon, as the writer's: a reader left running (a close the reactor
        # did not see through) must not keep the process from exiting.
        self._pool.threadFactory = _daemon_thread  # type: ignore[assignment]
        self._pool.start()

    def read(
        self,
        query: Callable[Concatenate[sqlite3.Connection, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Deferred[T]:
        """``query(connection, *args)`` on the reader thread; its result, or a JournalError."""
        pool, conn = self._pool, self._conn
        if pool is None or conn is None:
            raise JournalError(f"journal {self._path} is not open")
        reading: Deferred[T] = deferToThreadPool(self._reactor, pool, query, conn, *args, **kwargs)
        self.pending += 1
        reading.addBoth(self._answered)
        return reading.addErrback(self._wrap_failure)

    def _answered(self, result: object) -> object:
        self.pending -= 1
        return result

    def _wrap_failure(self, failure: Failure) -> Failure:
        exc = failure.value
        if isinstance(exc, sqlite3.Error | ValueError | OverflowError):
            error = JournalError.wrap(exc, self._path, "reading")
            # For the reader's answer: no path, the cause first.
            error.reason = f"the journal read failed: {describe(exc)}"
            raise error from exc
        return failure

    def stop(self) -> Deferred[None]:
        """Close the connection on the thread, then stop the thread."""
        conn, pool = self._conn, self._pool
        self._conn = self._pool = None
        if conn is None or pool is None:
            return succeed(None)
        closed: Deferred[None] = deferToThreadPool(self._reactor, pool, conn.close)

        def stop_pool(result: object) -> object:
            pool.stop()
            return result

        return closed.addBoth(stop_pool)
