"""
A child process for ``tests/system/test_journal_durability.py``: the real reactor
and a real Journal at ``argv[1]``, storing mailbox records in a loop (with
stream appends and removals in the same batches) and printing each record's
id on its own line once its ``on_durable`` reports it committed. The parent
kills it with SIGKILL at some point and checks that every printed id
survived.

Run as ``python -m tests.journal_store_child PATH``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall, react

from malamute_pack.journal import Journal, JournalConfig, JournalError, QueuedRecord

STORES_PER_TICK = 20
MAX_PENDING = 2000


def main(reactor: IReactorTime, path: str) -> Deferred[None]:
    journal = Journal(Path(path), reactor, JournalConfig())
    journal.open()
    out = sys.stdout

    def report(record_id: int, error: JournalError | None) -> None:
        if error is not None:
            out.write(f"error {error}\n")
        else:
            out.write(f"{record_id}\n")
            if record_id % 3 == 0:
                # Confirmed at once: these may or may not survive the kill.
                journal.remove_queued(record_id)
        out.flush()

    def store_one() -> None:
        record: QueuedRecord | None = None

        def on_durable(error: JournalError | None) -> None:
            assert record is not None
            report(record.id, error)

        record = journal.store_queued(
            "mailbox", "box", "child", "subject", "tracker", None, [b"payload" * 20], on_durable
        )

    def tick() -> None:
        if journal.pending_writes < MAX_PENDING:
            for _ in range(STORES_PER_TICK):
                store_one()
            journal.append_stream("s", "child", "subject", [b"stream" * 10], 0.0)

    ticks = LoopingCall(tick)
    ticks.clock = reactor
    ticks.start(0.001)
    return Deferred()  # runs until killed


if __name__ == "__main__":
    react(main, sys.argv[1:2])
