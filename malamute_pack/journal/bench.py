"""
Journal throughput benchmark, with the real reactor and real SQLite files:
``python -m malamute_pack.journal.bench [--scale X] [--dir DIR]``.

For stream appends (timed until every record has committed) and durable
queued stores (timed until the last ``on_durable`` fired) it measures group
commit, one transaction per record (``commit_max_batch=1``), and group
commit with ``synchronous=OFF``, and prints one line per run::

    journal=stream_append mode=group_commit synchronous=NORMAL n=... secs=... records_per_s=...

then, per kind, the ratios ``group_vs_per_record`` and ``group_vs_off``.
Records are fed from the reactor in chunks, as the broker would.

Tests: none (a benchmark prints figures; the journal's behaviour is tested
in ``tests/unit/test_journal_*.py``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import react

from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.errors import JournalError
from malamute_pack.journal.journal import Journal

CHUNK = 500
PAYLOAD = (b"x" * 200,)


@dataclass(frozen=True)
class Run:
    kind: str  # "stream_append" or "queued_store_durable"
    mode: str  # "group_commit" or "per_record"
    synchronous: str
    n: int

    def config(self) -> JournalConfig:
        return JournalConfig(
            commit_max_batch=1 if self.mode == "per_record" else 1000,
            stream_synchronous=self.synchronous,
            queue_synchronous=self.synchronous,
        )


def runs(scale: float) -> list[Run]:
    def n(count: int) -> int:
        return max(100, int(count * scale))

    return [
        Run("stream_append", "group_commit", "NORMAL", n(200_000)),
        Run("stream_append", "per_record", "NORMAL", n(20_000)),
        Run("stream_append", "group_commit", "OFF", n(200_000)),
        Run("queued_store_durable", "group_commit", "FULL", n(100_000)),
        Run("queued_store_durable", "per_record", "FULL", n(2_000)),
        Run("queued_store_durable", "group_commit", "OFF", n(100_000)),
    ]


def feed(reactor: IReactorTime, n: int, one: Callable[[int], None]) -> Deferred[None]:
    """Call ``one(i)`` for i in range(n), CHUNK per reactor turn."""
    fed: Deferred[None] = Deferred()
    schedule = cast(Any, reactor).callLater

    def chunk(start: int) -> None:
        for i in range(start, min(n, start + CHUNK)):
            one(i)
        if start + CHUNK < n:
            schedule(0, chunk, start + CHUNK)
        else:
            fed.callback(None)

    chunk(0)
    return fed


@inlineCallbacks
def measure(reactor: IReactorTime, run: Run, directory: Path) -> Any:
    """Seconds ``run`` took, and its journal's counters."""
    path = directory / f"{run.kind}-{run.mode}-{run.synchronous}.db"
    journal = Journal(path, reactor, run.config())
    journal.open()
    durable: Deferred[None] = Deferred()
    acknowledged = 0

    def on_durable(error: JournalError | None) -> None:
        nonlocal acknowledged
        if error is not None:
            raise error
        acknowledged += 1
        if acknowledged == run.n:
            durable.callback(None)

    def append(i: int) -> None:
        journal.append_stream("bench", "sender", "subject", PAYLOAD, 0.0)

    def store(i: int) -> None:
        journal.store_queued("mailbox", "box", "sender", "subject", "", None, PAYLOAD, on_durable)

    started = time.perf_counter()
    if run.kind == "stream_append":
        yield feed(reactor, run.n, append)
        yield journal.flush()
    else:
        yield feed(reactor, run.n, store)
        yield durable
    secs = time.perf_counter() - started
    counters = journal.counters
    yield journal.close()
    path.unlink()
    return secs, counters


@inlineCallbacks
def main(reactor: IReactorTime, *argv: str) -> Any:
    parser = argparse.ArgumentParser(prog="python -m malamute_pack.journal.bench")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every n by this")
    parser.add_argument("--dir", type=Path, default=None, help="where to put the databases")
    args = parser.parse_args(argv)
    directory = Path(tempfile.mkdtemp(prefix="journal-bench-", dir=args.dir))
    rates: dict[tuple[str, str, str], float] = {}
    try:
        for run in runs(args.scale):
            secs, counters = yield measure(reactor, run, directory)
            rate = run.n / secs
            rates[(run.kind, run.mode, run.synchronous)] = rate
            print(
                f"journal={run.kind} mode={run.mode} synchronous={run.synchronous} n={run.n} "
                f"secs={secs:.3f} records_per_s={rate:.0f} batches={counters.batches}",
                flush=True,
            )
        for kind, durable_level in (("stream_append", "NORMAL"), ("queued_store_durable", "FULL")):
            group = rates[(kind, "group_commit", durable_level)]
            print(
                f"journal={kind} synchronous={durable_level} "
                f"group_vs_per_record={group / rates[(kind, 'per_record', durable_level)]:.1f} "
                f"group_vs_off={group / rates[(kind, 'group_commit', 'OFF')]:.2f}",
                flush=True,
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    react(main, sys.argv[1:])
