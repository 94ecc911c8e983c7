"""
The journal's one exception type: every SQLite failure (a full disk, an I/O
error, a corrupt file) reaches the broker as a :class:`JournalError` with a
message that says which journal, what it was doing and why it failed.

Failures come in two kinds, which :func:`storage_failure` tells apart: the
storage's (a full disk, an I/O error, a corrupt or locked file: nothing
could have been written) and one record's (text that is not valid UTF-8, a
number out of range, a constraint: only that record cannot be written).
The writer fails a whole batch for the first kind and only the record for
the second (:meth:`JournalError.refused`). A third is the writer's own: an
unexpected error in its thread (a bug) leaves it taking no writes
(:class:`WriterFailed`), and every later batch fails as on a full disk.

Tests: ``tests/unit/test_journal_disk_full.py``, ``tests/unit/test_journal_schema.py``,
``tests/unit/test_journal_isolation.py`` and ``tests/unit/test_journal_writer_failure.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

from malamute_pack.store import StoreError

# SQLite's primary result codes that say the storage failed, whatever was
# being written: retrying the records one by one would only fail them all.
_STORAGE_CODES: Final = frozenset(
    {
        sqlite3.SQLITE_PERM,
        sqlite3.SQLITE_BUSY,
        sqlite3.SQLITE_LOCKED,
        sqlite3.SQLITE_NOMEM,
        sqlite3.SQLITE_READONLY,
        sqlite3.SQLITE_INTERRUPT,
        sqlite3.SQLITE_IOERR,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_FULL,
        sqlite3.SQLITE_CANTOPEN,
        sqlite3.SQLITE_PROTOCOL,
        sqlite3.SQLITE_NOLFS,
        sqlite3.SQLITE_AUTH,
        sqlite3.SQLITE_NOTADB,
    }
)
_MAX_REASON: Final = 120


def storage_failure(exc: BaseException) -> bool:
    """
    Whether ``exc`` is the storage's failure (a full disk, an I/O error, a
    corrupt, read-only or locked database, no memory) rather than one
    record's (invalid text, a number out of range, a constraint).
    """
    if isinstance(exc, OSError | MemoryError):
        return True
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    return isinstance(code, int) and code & 0xFF in _STORAGE_CODES


class WriterFailed(Exception):
    """
    Why the journal's writer takes no writes: its thread failed on an
    unexpected error (``error``, also the ``__cause__``: a bug, not the
    storage's failure), or, with None, it has stopped. ``reason`` is the
    short text for clients.
    """

    def __init__(self, error: BaseException | None) -> None:
        if error is None:
            message = reason = "the journal's writer has stopped"
        else:
            name = type(error).__name__
            message = (
                f"its writer failed on an unexpected error, {name}: {error} (a bug: its"
                " traceback is logged), and takes no writes until the journal is opened again"
            )
            reason = f"the journal's writer failed ({name})"
        super().__init__(message)
        self.error = error
        self.reason = reason
        self.__cause__ = error


class JournalError(StoreError):
    """
    A journal operation failed. ``__cause__`` holds the original exception;
    ``sqlite_error`` is SQLite's error name (``"SQLITE_FULL"``...) when there
    is one, and ``disk_full`` says whether the disk (or quota) ran out.
    ``reason`` is a short text for clients: no paths, the cause first.
    """

    def __init__(
        self, message: str, *, sqlite_error: str | None = None, disk_full: bool = False
    ) -> None:
        super().__init__(message)
        self.sqlite_error = sqlite_error
        self.disk_full = disk_full
        self.record_refused = False
        self.reason = "the broker's disk is full" if disk_full else (sqlite_error or "write failed")

    @classmethod
    def refused(cls, exc: BaseException, path: Path, what: str) -> JournalError:
        """
        A JournalError for one record, ``what`` (``"letter 7"``), that the
        journal at ``path`` could not write because of ``exc``, a failure of
        that record only (see :func:`storage_failure`); chained to ``exc``.
        ``record_refused`` is set: writing it again would fail again.
        """
        if isinstance(exc, UnicodeError):
            why = "text that is not valid UTF-8"
        else:
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:_MAX_REASON]
        name = getattr(exc, "sqlite_errorname", None) if isinstance(exc, sqlite3.Error) else None
        error = cls(
            f"journal {path}: {what} cannot be written: {type(exc).__name__}: {exc}",
            sqlite_error=name,
        )
        error.record_refused = True
        error.reason = f"record refused: {why}"
        error.__cause__ = exc
        return error

    @classmethod
    def wrap(cls, exc: BaseException, path: Path, doing: str) -> JournalError:
        """
        A JournalError for ``exc``, raised while ``doing`` on the journal at
        ``path``, chained to ``exc`` (a L{WriterFailed}'s says so, and has its
        ``reason``).
        """
        name = getattr(exc, "sqlite_errorname", None) if isinstance(exc, sqlite3.Error) else None
        code = getattr(exc, "sqlite_errorcode", None)
        # The low byte is the primary result code, whatever the extended one.
        disk_full = (isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL) or (
            isinstance(exc, OSError) and exc.errno == 28  # ENOSPC
        )
        if isinstance(exc, WriterFailed):
            detail = str(exc)
        else:
            detail = f"{exc} ({name})" if name else f"{type(exc).__name__}: {exc}"
        hint = ": the disk is full, free space to resume journaling" if disk_full else ""
        error = cls(
            f"journal {path}: {doing} failed: {detail}{hint}",
            sqlite_error=name,
            disk_full=disk_full,
        )
        if isinstance(exc, WriterFailed):
            error.reason = exc.reason
        error.__cause__ = exc
        return error
