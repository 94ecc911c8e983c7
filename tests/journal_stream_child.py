"""
A child process for ``tests/unit/test_journal_inserts.py``: the real reactor
and a real Journal at ``argv[1]`` flooding stream ``s`` (turns of 500
records, so that its batches go to the writer's insert process), printing
the stream's durable sequence number on its own line after each batch that
committed. The parent kills it with SIGKILL at some point and checks that
every record up to the last number printed survived, and that no insert
process outlived it.

Run as ``python -m tests.journal_stream_child PATH``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall, react

from malamute_pack.journal import Journal, JournalConfig

RECORDS_PER_TICK = 500
MAX_PENDING = 5000


def main(reactor: IReactorTime, path: str) -> Deferred[None]:
    journal = Journal(Path(path), reactor, JournalConfig())
    journal.open()
    out = sys.stdout

    def committed(records: int) -> None:
        out.write(f"{journal.durable_seq('s')}\n")
        out.flush()

    journal.on_batch = committed

    def tick() -> None:
        if journal.pending_writes < MAX_PENDING:
            for _ in range(RECORDS_PER_TICK):
                journal.append_stream("s", "child", "subject", [b"stream" * 10], 0.0)

    ticks = LoopingCall(tick)
    ticks.clock = reactor
    ticks.start(0.001)
    return Deferred()  # runs until killed


if __name__ == "__main__":
    react(main, sys.argv[1:2])
