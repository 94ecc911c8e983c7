"""
One broker per data directory, and its identity (L{pack_identity}).

One broker per data directory: an exclusive lock on ``<data-dir>/lock``,
taken when the broker starts (before its journal opens, with or without a
journal) and held for its whole life.

The lock is ``flock(2)`` on the open lock file, so the kernel releases it
whenever the process ends, ``kill -9`` and crashes included: a stale lock
file never stops a broker, and the file is never deleted (deleting it would
let two processes lock two different files of the same name), but by a
failed first start, while it holds the lock (below): a broker that locks
the file and finds it no longer at the path locks the path's anew. Once it holds
the lock, the broker writes into the file who it is (pid, host, when it
started), so that a second broker refused the lock can name the first.

A failed first start leaves nothing behind: a directory missing or empty
when the broker was made is emptied again (and removed, with the parents
the start made, if it was missing) once everything that had started has
stopped (L{DataDirService.discard_failed_start}, called by
L{malamute_pack.startup.FailFast}), under the lock taken again, so that a
broker that has taken the directory in between keeps it whole.

Tests: ``tests/system/test_datadir.py``, ``tests/system/test_startup.py``,
``tests/unit/test_failed_start.py``, ``tests/system/test_failed_start.py``.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from twisted.application.service import Service
from twisted.logger import Logger

LOCK_NAME: Final = "lock"
_MAX_HOLDER_BYTES: Final = 4096

_log = Logger()


class DataDirError(Exception):
    """A broker cannot use a data directory; the message says why and what to do."""


# What to do about a directory the broker cannot use.
_FIX: Final = "give --data-dir a directory this user can write (it is made if missing)"


def prepare(directory: Path) -> None:
    """
    Make the data directory C{directory} if it is missing, and check that
    this process can write in it.

    @raise DataDirError: it is not a directory, cannot be made, or is not
        writable (the message says what to do).
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise DataDirError(f"data directory {directory} is a file, not a directory: {_FIX}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataDirError(
            f"data directory {directory} cannot be made: {e.strerror or e}: {_FIX}"
        ) from e
    if not os.access(directory, os.W_OK | os.X_OK):
        raise DataDirError(f"data directory {directory} is not writable by this user: {_FIX}")


@dataclass(frozen=True)
class Holder:
    """Who holds a data directory's lock, as it wrote into the lock file."""

    pid: int
    host: str
    started: str

    def to_bytes(self) -> bytes:
        return json.dumps({"pid": self.pid, "host": self.host, "started": self.started}).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Holder | None:
        """The holder ``data`` names, or None if it names none (empty, garbled)."""
        try:
            fields = json.loads(data)
            return cls(int(fields["pid"]), str(fields["host"]), str(fields["started"]))
        except (ValueError, TypeError, KeyError):
            return None

    @classmethod
    def this_process(cls) -> Holder:
        started = datetime.now(UTC).isoformat(timespec="seconds")
        return cls(os.getpid(), socket.gethostname(), started)

    def __str__(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started}"


class DataDirLock:
    """The lock of the data directory ``directory`` (made if missing)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory).absolute()
        self.path = self.directory / LOCK_NAME
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def acquire(self) -> Holder:
        """
        Take the lock without waiting and record this process in the lock
        file; the holder recorded.

        @raise DataDirError: another process holds it (the message names
            that process), or the lock file cannot be opened or locked.
        """
        if self._fd is not None:
            raise DataDirError(f"{self.path} is already locked by this broker")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise DataDirError(
                f"data directory {self.directory}: cannot open its lock file {self.path}:"
                f" {e.strerror or e}: {_FIX}"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise DataDirError(
                    f"data directory {self.directory}: cannot lock {self.path}: {e}"
                ) from e
            who = str(holder) if holder is not None else "a process that has not said which"
            raise DataDirError(
                f"data directory {self.directory} is in use by another broker: {who} "
                f"holds its lock {self.path}. Stop that broker first, or give this one "
                f"another --data-dir."
            ) from None
        if not _is_file_at(fd, self.path):
            # Removed (by a failed first start, DataDirLock.discard) between
            # our open and our lock: the lock that counts is the path's.
            os.close(fd)
            return self.acquire()
        holder = Holder.this_process()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, holder.to_bytes() + b"\n", 0)
        except OSError as e:
            os.close(fd)  # closing releases the lock
            raise DataDirError(
                f"data directory {self.directory}: cannot write its lock file {self.path}: {e}"
            ) from e
        self._fd = fd
        return holder

    def discard(self, made: Path | None) -> bool:
        """
        Remove everything in the directory, taking the lock for it (with
        the lock file, last), then the directory C{made} and those between
        it and this one, those that are empty; whether it did (not if the
        lock is held, by this object or anyone).
        """
        if self._fd is not None:
            return False
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        try:
            for entry in self.directory.iterdir():
                if entry.name == LOCK_NAME:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
            # Unlinked while locked: a broker that opens it now is refused,
            # one that opens the path after makes a file of its own.
            self.path.unlink()
        finally:
            os.close(fd)
        if made is not None:
            directory = self.directory
            while True:
                try:
                    directory.rmdir()
                except OSError:
                    break  # not empty: someone else's now
                if directory == made or directory.parent == directory:
                    break
                directory = directory.parent
        return True

    def holder(self) -> Holder | None:
        """Who the lock file says holds the lock (whether or not anyone does)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return _read_holder(fd)
        finally:
            os.close(fd)

    def release(self) -> None:
        """Give the lock up (a no-op if this object does not hold it)."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Still locked: nobody can read a holder that is gone.
            os.ftruncate(fd, 0)
        except OSError as e:
            _log.warn("could not clear {path}: {error}", path=str(self.path), error=e)
        finally:
            os.close(fd)  # releases the lock


def _is_file_at(fd: int, path: Path) -> bool:
    """Whether the open file C{fd} is the file at C{path} (not one since removed)."""
    try:
        named, opened = path.stat(), os.fstat(fd)
    except OSError:
        return False
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _read_holder(fd: int) -> Holder | None:
    try:
        return Holder.from_bytes(os.pread(fd, _MAX_HOLDER_BYTES, 0))
    except OSError:
        return None


class DataDirService(Service):
    """
    Holds the data directory's lock while it runs: started first and
    stopped last, so nothing else of the broker touches the directory
    without it. It is taken in C{privilegedStartService} under twistd, so a
    broker refused it stops before it binds an endpoint (or in
    C{startService} if that did not run). A refused lock is logged and
    raised, which makes C{twistd} exit with a non-zero status
    (L{malamute_pack.startup}).

    Made before anything else of the broker writes in the directory, it
    notes whether this is the directory's first start (missing or empty),
    and which directory the start will make (C{made}), for
    L{discard_failed_start}.
    """

    def __init__(self, directory: Path) -> None:
        self.lock = DataDirLock(directory)
        self.made = _first_missing(self.lock.directory)
        self.first_start = self.made is not None or _empty(self.lock.directory)
        self._held = False

    def privilegedStartService(self) -> None:
        self._lock()
        super().privilegedStartService()  # type: ignore[no-untyped-call]

    def startService(self) -> None:
        if not self.lock.locked:
            self._lock()
        super().startService()  # type: ignore[no-untyped-call]

    def _lock(self) -> None:
        try:
            holder = self.lock.acquire()
        except DataDirError as e:
            _log.critical("{error}", error=e)
            raise
        self._held = True
        _log.info(
            "data directory {directory} locked by {holder}",
            directory=str(self.lock.directory),
            holder=str(holder),
        )

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        self.lock.release()

    def discard_failed_start(self) -> None:
        """
        After a failed start, once all that had started has stopped: if it
        was the directory's first and this service had locked it, remove
        what the start made (L{DataDirLock.discard}); else nothing.
        """
        if not (self.first_start and self._held) or self.running:
            return
        if self.lock.discard(self.made):
            _log.info(
                "data directory {directory}: what the failed first start made is removed",
                directory=str(self.lock.directory),
            )


def _empty(directory: Path) -> bool:
    """Whether C{directory} is an empty directory (not if it cannot be read: prepare says why)."""
    try:
        return not any(directory.iterdir())
    except OSError:
        return False


def _first_missing(directory: Path) -> Path | None:
    """The first of C{directory} and its parents that is missing, from the root; None if none."""
    missing: Path | None = None
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        missing = candidate
    return missing


# The broker's identity: its id in the pack, and the origin its multicast
# bridges name.
PACK_ID_FILE: Final = "pack-id"


def pack_identity(data_dir: Path, journal: str | None = None) -> bytes:
    """
    This broker's 16-byte identity in the pack, from C{data_dir}'s
    C{pack-id} file (32 hex digits), made there on the first call.

    @param journal: the identity of the journal this broker opened, kept
        in the file beside it: a broker whose journal was started afresh
        (another identity) numbers its streams from 1 again, so it is a new
        member with a new identity, or its peers, which go on from the last
        number they took from it, would drop its records as seen.
    """
    path = data_dir / PACK_ID_FILE
    identity = _read_identity(path)
    kept = _journal_of(path)
    if identity is None or (journal is not None and kept is not None and kept != journal):
        identity = uuid.uuid4().bytes
        _write_identity(path, identity, journal)
    elif journal is not None and kept is None:
        _write_identity(path, identity, journal)
    return identity


def _journal_of(path: Path) -> str | None:
    """The journal identity a C{pack-id} file was made for (its second line), if any."""
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    return lines[1] if len(lines) > 1 else None


# The identity a pair's backup learned from its primary: the pair's, shown
# to a pack by whichever of the two is active.
PAIR_PACK_ID_FILE: Final = "pair-pack-id"


def learned_identity(data_dir: Path) -> bytes | None:
    """The pair's identity this backup learned from its primary, if it did."""
    return _read_identity(data_dir / PAIR_PACK_ID_FILE)


def learn_identity(data_dir: Path, identity: bytes) -> None:
    """Keep C{identity}, the pair's, as learned from the primary."""
    _write_identity(data_dir / PAIR_PACK_ID_FILE, identity)


def _read_identity(path: Path) -> bytes | None:
    """The 16 bytes the file at C{path} holds as 32 hex digits; None if it is missing."""
    try:
        text = (path.read_text().split() or [""])[0]
    except FileNotFoundError:
        return None
    try:
        identity = bytes.fromhex(text)
    except ValueError:
        identity = b""
    if len(identity) != 16:
        raise ValueError(f"{path} does not hold a pack identity (32 hex digits): {text[:40]!r}")
    return identity


def _write_identity(path: Path, identity: bytes, journal: str | None = None) -> None:
    scratch = path.with_suffix(".new")
    scratch.write_text(identity.hex().upper() + "\n" + (f"{journal}\n" if journal else ""))
    os.replace(scratch, path)
