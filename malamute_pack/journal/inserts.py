"""
Inserting a batch's rows: the multi-row INSERTs the journal's writer makes
of a batch (a few statements for a batch of any size), and the insert
process that runs them, outside the broker's GIL, for batches of many
stream records.

The writer thread (:mod:`malamute_pack.journal.writer`) shares the GIL with
the reactor. Binding a batch's parameters and the Python around its
statements hold it (2.5 us a record under a flood, measured with py-spy
in docs/performance.md), and each statement, which lets the GIL go while
SQLite works, costs the writer a wait for the reactor to give it back (up
to a switch interval). So a batch of stream records alone, from
``insert_process_rows`` records on
(:class:`~malamute_pack.journal.config.JournalConfig`), goes to a child
process instead (:class:`InsertProcess`: ``python -I -S`` running this
file, which imports nothing but the standard library), over a pipe: the
writer thread marshals the rows in one call of C and waits for the answer
without the GIL; the process binds, inserts and commits them with an
interpreter of its own. What the batch's outcome promises is unchanged:
the writer reports it once the process's COMMIT has returned, written at
the same ``synchronous`` level.

On the pipes, each message is a 4-byte big-endian length and a marshalled
value (both ends run the same interpreter). A request is ``(rows, stats,
synchronous)``: the stream rows, the ``streams`` totals to add, the level.
The process computes the rows' checksums itself
(:mod:`malamute_pack.journal.checksums`, which it loads by its path), so
that they cost the broker's GIL nothing.
The answer is ``None`` once committed, or the error that stopped it as
``(class name, message)``, the transaction rolled back: the writer thread
then writes that batch itself, and meets the same error with everything
its own path does about it (a record refused alone, a full disk failing
the batch). The process ends when its input closes, and with the thread
that started it (Linux's parent-death signal): a broker killed leaves
nothing behind that writes into its journal.

Tests: ``tests/unit/test_journal_inserts.py``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import marshal
import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import IO, Any, Final

# A stream row (records.StreamRow) and its checksum (checksums.with_checksums).
INSERT_STREAM: Final = (
    "INSERT INTO stream_messages "
    "(stream, seq, ts, sender, subject, content, bytes, origin, origin_seq, checksum) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
UPSERT_STREAM_STATS: Final = (
    "INSERT INTO streams (stream, last_seq, message_count, total_bytes) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (stream) DO UPDATE SET last_seq = max(last_seq, excluded.last_seq), "
    "message_count = message_count + excluded.message_count, "
    "total_bytes = total_bytes + excluded.total_bytes"
)
# Rows per multi-row INSERT, at least: SQLite inserts them in one step, so
# the GIL is released once per chunk, not once per message (per-row release
# makes the writer and the reactor hand the GIL back and forth for every
# message). A whole batch goes in one statement (rows_per_insert).
ROWS_PER_INSERT: Final = 128
# INSERTs of several rows by (single-row INSERT, rows), made as first needed.
_CHUNKED: Final[dict[tuple[str, int], str]] = {}
# A message's length on the pipes: 4 bytes, so at most this many bytes.
_LENGTH_BYTES: Final = 4
MAX_MESSAGE: Final = (1 << (8 * _LENGTH_BYTES)) - 1
# As the writer's own connection waits for a lock (opening.py).
_BUSY_TIMEOUT_MS: Final = 10_000
# Linux's prctl option: the signal a process gets when its parent thread ends.
_PR_SET_PDEATHSIG: Final = 1
# Seconds a stopping process has to exit before it is killed.
_STOP_TIMEOUT_S: Final = 10.0


def chunk_statement(single: str, rows: int) -> str:
    """The INSERT of C{rows} rows made from C{single} (one row's), made once per size."""
    statement = _CHUNKED.get((single, rows))
    if statement is None:
        head, values = single.split(" VALUES ")
        statement = _CHUNKED[single, rows] = head + " VALUES " + ", ".join([values] * rows)
    return statement


def insert_all(
    conn: sqlite3.Connection,
    single: str,
    rows: Sequence[tuple[Any, ...]],
    most: int = ROWS_PER_INSERT,
) -> None:
    """
    Insert C{rows} with C{single}, a chunk of rows per statement: whole
    chunks of C{most} rows, then the rest in chunks of halving sizes (the
    largest power of two below C{most}, then half of it, ... 1 row), so that
    a batch of any size takes a few statements, from a dozen distinct ones
    at most that SQLite keeps prepared. In the writer thread, each
    statement lets the GIL go once while SQLite works and then waits for it
    back: a full batch in one statement is one wait instead of ten.
    """
    whole = len(rows) - len(rows) % most
    if whole:
        conn.executemany(
            chunk_statement(single, most),
            (tuple(chain.from_iterable(rows[i : i + most])) for i in range(0, whole, most)),
        )
    size = 1 << max(0, (most - 1).bit_length() - 1)
    while whole < len(rows):
        if len(rows) - whole >= size:
            chunk = rows[whole : whole + size]
            conn.execute(chunk_statement(single, size), tuple(chain.from_iterable(chunk)))
            whole += size
        size //= 2


def rows_per_insert(conn: sqlite3.Connection, single: str, batch: int) -> int:
    """
    How many rows one INSERT made from C{single} carries on C{conn}: a
    whole batch of C{batch} operations, within SQLite's limit on a
    statement's parameters, and never fewer than L{ROWS_PER_INSERT} (an
    append's records are not bounded by the batch; every SQLite since 3.32
    takes 32,766 parameters, 2,978 rows of 11).
    """
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // single.count("?")
    return max(min(batch, limit), min(ROWS_PER_INSERT, limit))


def write_stream_batch(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[Any, ...]],
    stats: Sequence[tuple[Any, ...]],
    most: int,
) -> None:
    """
    In one transaction on C{conn}: stream C{rows}, each with its checksum
    (L{INSERT_STREAM}'s columns; C{most} per INSERT at most), and the
    C{stats} (stream, last seq, records, bytes) added to the ``streams``
    totals. Raises what SQLite raises, the transaction rolled back.
    """
    conn.execute("BEGIN")
    try:
        insert_all(conn, INSERT_STREAM, rows, most)
        if stats:
            conn.executemany(UPSERT_STREAM_STATS, stats)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def batch_committed(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> bool:
    """
    Whether stream C{rows}, written in one transaction, are in the file:
    whether their last one is (a batch commits whole or not at all).
    """
    stream, seq = rows[-1][:2]
    found = conn.execute(
        "SELECT 1 FROM stream_messages WHERE stream = ? AND seq = ?", (stream, seq)
    ).fetchone()
    return found is not None


class InsertRefused(Exception):
    """
    The insert process did not write a batch (nothing of it is written):
    it cannot be marshalled, it is larger than a message, or writing it
    failed there. The process goes on.
    """


class InsertProcessLost(Exception):
    """
    The insert process is gone: it could not start, it ended, or it
    answered something unreadable. ``in_doubt`` when the batch had reached
    it (it may have committed).
    """

    def __init__(self, message: str, *, in_doubt: bool = False) -> None:
        super().__init__(message)
        self.in_doubt = in_doubt


def _write_message(stream: IO[bytes], data: bytes) -> None:
    stream.write(len(data).to_bytes(_LENGTH_BYTES, "big") + data)
    stream.flush()


def _read_message(stream: IO[bytes]) -> Any:
    """The next value on C{stream}; EOFError at its end (or in a message)."""
    head = stream.read(_LENGTH_BYTES)
    if len(head) < _LENGTH_BYTES:
        raise EOFError("the pipe closed")
    size = int.from_bytes(head, "big")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError(f"the pipe closed {len(data)} bytes into a message of {size}")
    return marshal.loads(data)


class InsertProcess:
    """
    The insert process of the journal at C{path}, started at its first
    batch, putting C{rows_per_insert} rows in one INSERT at most. Used from
    the writer thread alone.
    """

    def __init__(self, path: Path, rows_per_insert: int) -> None:
        self._path = Path(path).absolute()
        self._rows_per_insert = rows_per_insert
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The process's id while it runs."""
        return None if self._process is None else self._process.pid

    def _start(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-I",
            "-S",
            str(Path(__file__).absolute()),
            str(self._path),
            str(self._rows_per_insert),
            str(os.getpid()),
        ]
        try:
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as e:
            raise InsertProcessLost(f"the insert process could not start: {e}") from e
        return self._process

    def insert(
        self, rows: Sequence[tuple[Any, ...]], stats: Sequence[tuple[Any, ...]], synchronous: str
    ) -> None:
        """
        Have the process write C{rows} and C{stats} (L{write_stream_batch})
        with C{PRAGMA synchronous} at C{synchronous}, and wait until it has
        committed. Raises L{InsertRefused} (nothing written, the process
        goes on) or L{InsertProcessLost} (the process is gone).
        """
        request: tuple[Any, ...] = (rows, stats, synchronous)
        try:
            data = marshal.dumps(request)
        except ValueError as e:
            raise InsertRefused(f"a batch that cannot be marshalled: {e}") from e
        if len(data) > MAX_MESSAGE:
            raise InsertRefused(f"a batch of {len(data)} bytes is larger than a message")
        process = self._process or self._start()
        assert process.stdin is not None and process.stdout is not None
        sent = False
        try:
            _write_message(process.stdin, data)
            sent = True
            answer = _read_message(process.stdout)
            if answer is None:
                return
            name, message = answer
        except (OSError, EOFError, ValueError, TypeError) as e:
            self.stop(kill=True)
            raise InsertProcessLost(
                f"the insert process ended ({type(e).__name__}: {e})", in_doubt=sent
            ) from e
        raise InsertRefused(f"{name}: {message}")

    def stop(self, kill: bool = False) -> int | None:
        """End the process (closing its input, or killing it); its exit code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if kill:
            process.kill()
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        try:
            code = process.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        if process.stdout is not None:
            process.stdout.close()
        return code


# The process itself.


def _die_with_parent(parent: int) -> None:
    """End with the thread that started this process (Linux), or at once if it has ended."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the end of its input ends it
    if os.getppid() != parent:
        os._exit(0)


def serve(
    path: str,
    rows_per_insert: int,
    requests: IO[bytes],
    answers: IO[bytes],
    checksummed: Callable[[Sequence[tuple[Any, ...]]], list[tuple[Any, ...]]],
) -> None:
    """
    Write each batch requested on C{requests}, its rows C{checksummed}
    (L{malamute_pack.journal.checksums.with_checksums}), answering on
    C{answers}, until they end.
    """
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
    synchronous = ""
    try:
        while True:
            try:
                request = _read_message(requests)
            except EOFError:
                return
            answer: tuple[str, str] | None = None
            try:
                rows, stats, level = request
                if level != synchronous:
                    if not (isinstance(level, str) and level.isalpha()):
                        raise ValueError(f"not a synchronous level: {level!r}")
                    conn.execute(f"PRAGMA synchronous = {level}")
                    synchronous = level
                write_stream_batch(conn, checksummed(rows), stats, rows_per_insert)
            except Exception as e:  # the writer thread writes it and meets the error itself
                answer = (type(e).__name__, str(e))
            _write_message(answers, marshal.dumps(answer))
    finally:
        conn.close()


def main(argv: Sequence[str]) -> None:
    """``inserts.py PATH ROWS_PER_INSERT PARENT_PID``: serve on stdin and stdout."""
    path, rows, parent = argv
    _die_with_parent(int(parent))
    # A bytes parameter takes sqlite3's slow path (its adapters looked up and
    # missed, 0.36 us a row); a bytearray, the same BLOB, does not, and a
    # registered adapter is found at once: 13% less a row to bind, measured.
    # The registry is the process's own: this process has no other use of it.
    sqlite3.register_adapter(bytes, bytearray)
    checksums = load_beside("checksums")
    serve(path, int(rows), sys.stdin.buffer, sys.stdout.buffer, checksums.with_checksums)


def load_beside(name: str) -> ModuleType:
    """
    The module C{name} of this file's directory, loaded by its path: this
    process imports no package (C{-I -S}), and that module only the
    standard library.
    """
    spec = importlib.util.spec_from_file_location(
        f"_insert_process_{name}", Path(__file__).with_name(f"{name}.py")
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}.py beside {__file__}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main(sys.argv[1:])
