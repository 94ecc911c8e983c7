"""
The journal's one exception type: every SQLite failure (a full disk, an I/O
error, a corrupt file) reaches the broker as a :class:`JournalError` with a
message that says which journal, what it was doing and why it failed.

Tests: ``tests/test_journal_disk_full.py`` and ``tests/test_journal_schema.py``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from malamute_pack.broker.store import StoreError


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
        self.reason = "the broker's disk is full" if disk_full else (sqlite_error or "write failed")

    @classmethod
    def wrap(cls, exc: BaseException, path: Path, doing: str) -> JournalError:
        """
        A JournalError for ``exc``, raised while ``doing`` on the journal at
        ``path``, chained to ``exc``.
        """
        name = getattr(exc, "sqlite_errorname", None) if isinstance(exc, sqlite3.Error) else None
        code = getattr(exc, "sqlite_errorcode", None)
        # The low byte is the primary result code, whatever the extended one.
        disk_full = (isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL) or (
            isinstance(exc, OSError) and exc.errno == 28  # ENOSPC
        )
        detail = f"{exc} ({name})" if name else f"{type(exc).__name__}: {exc}"
        hint = ": the disk is full, free space to resume journaling" if disk_full else ""
        error = cls(
            f"journal {path}: {doing} failed: {detail}{hint}",
            sqlite_error=name,
            disk_full=disk_full,
        )
        error.__cause__ = exc
        return error
