"""
The owners of addresses in the journal (the ``address_owners`` table,
:mod:`malamute_pack.journal.schema`): read once when the broker starts,
and each new claim written as it is made, so that an address stays its
owner's across restarts (:class:`malamute_pack.broker.access.Owners`).

Claims are rare (the first open of an address by a user), so they do not
go through the journal's group-commit writer: they are written on a
thread of their own, on a connection of their own to the same database
(WAL mode lets it share the file with the journal's writer and reader;
SQLite serialises the writes), each claim in its own transaction with
``synchronous = FULL``. The reactor never waits for it. A claim made in
the last moments before a crash (before its commit) may be lost; the
address is then free again after the restart.

Tests: ``tests/test_journal_owners.py``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, cast

from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReactorFromThreads, IReactorTime
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from malamute_pack.journal.errors import JournalError

_log = Logger()

_INSERT: Final = (
    "INSERT INTO address_owners (address, user, claimed) VALUES (?, ?, ?) "
    "ON CONFLICT (address) DO NOTHING"
)


class OwnerJournal:
    """
    The ``address_owners`` table of the (migrated) journal at C{path}.

    @ivar saved: claims written.
    @ivar failed: claims that could not be written (logged).
    """

    def __init__(self, path: Path, reactor: IReactorTime) -> None:
        """C{reactor} must provide C{IReactorFromThreads} too, as the journal's."""
        self._path = Path(path)
        self._reactor = cast(IReactorFromThreads, reactor)
        self._conn: sqlite3.Connection | None = None
        self._pool: ThreadPool | None = None
        self.saved = 0
        self.failed = 0

    def open(self) -> dict[str, str]:
        """Open the table and read every claim (blocks: call it once, at startup)."""
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("PRAGMA synchronous = FULL")
                owners = dict(conn.execute("SELECT address, user FROM address_owners"))
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as e:
            raise JournalError.wrap(e, self._path, "reading the owners of addresses") from e
        self._conn = conn
        self._pool = ThreadPool(minthreads=1, maxthreads=1, name="journal-owners")
        self._pool.start()
        return owners

    def save_owner(self, address: str, user: str) -> None:
        """Write the claim soon, on the owners' thread; a failure is logged."""
        pool = self._pool
        if pool is None:
            self.failed += 1
            _log.error("owner of {address!r} not saved: the journal is closed", address=address)
            return
        saving = deferToThreadPool(self._reactor, pool, self._insert, address, user, time.time())
        saving.addCallbacks(self._saved, self._not_saved, errbackArgs=(address,))

    # Runs on the owners' thread.
    def _insert(self, address: str, user: str, claimed: float) -> None:
        assert self._conn is not None
        self._conn.execute(_INSERT, (address, user, claimed))

    def _saved(self, _: None) -> None:
        self.saved += 1

    def _not_saved(self, failure: Failure, address: str) -> None:
        self.failed += 1
        _log.error(
            "owner of {address!r} not saved in the journal (it is free again after a"
            " restart): {error}",
            address=address,
            error=failure.getErrorMessage(),
        )

    def flush(self) -> Deferred[None]:
        """Fires once every claim made so far is written (or failed)."""
        pool = self._pool
        if pool is None:
            return succeed(None)
        # One thread: a task queued now runs after every earlier one.
        return deferToThreadPool(self._reactor, pool, lambda: None)

    def close(self) -> Deferred[None]:
        """Write what is queued, then close the connection and stop the thread."""
        pool, conn = self._pool, self._conn
        if pool is None or conn is None:
            return succeed(None)
        self._pool = None
        closed = deferToThreadPool(self._reactor, pool, conn.close)

        def stop(result: object) -> object:
            pool.stop()
            self._conn = None
            return result

        return closed.addBoth(stop)


class OwnerJournalService(Service):
    """
    Opens the owners' table once the journal has opened (start it after
    the journal's service) and hands the claims to C{loaded}; records new
    claims from then on; closes before the journal does.
    """

    def __init__(self, owners: OwnerJournal, loaded: Callable[[dict[str, str]], None]) -> None:
        self.owners = owners
        self._loaded = loaded

    def startService(self) -> None:
        try:
            found = self.owners.open()
        except JournalError as e:
            _log.critical("the broker cannot start: {error}", error=e)
            raise
        _log.info(
            "{count} {have} owners",
            count=len(found),
            have="address has" if len(found) == 1 else "addresses have",
        )
        self._loaded(found)
        super().startService()  # type: ignore[no-untyped-call]

    def stopService(self) -> Deferred[None]:
        super().stopService()  # type: ignore[no-untyped-call]
        return self.owners.close()
