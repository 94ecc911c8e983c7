"""
Tests for how L{malamute_pack.journal.writer}'s thread gathers a batch:
reactor turns submitted while it gathers share one transaction; it is
woken before its commit interval ends only by a full batch or by a control
operation (a barrier, a stop), never by the turns' submissions alone.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from malamute_pack.journal.config import JournalConfig
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.writer import Barrier
from malamute_pack.protocol.records import StreamRow
from tests.e2e_support import settle
from tests.journal_support import WriterCase
from tests.support import wait_for

# Far longer than any test waits: a batch written before it ends was woken.
LONG_INTERVAL = 600.0
# How long a test waits for what should come at once before it fails.
BOUND = 30.0


def row(seq: int) -> StreamRow:
    return stream_row("s", seq, 1.0, "w", "subject", [b"x"])


class FullBatchTests(WriterCase):
    """A batch that fills while the thread dozes."""

    config = JournalConfig(commit_interval_s=LONG_INTERVAL, commit_max_batch=3)

    async def test_fullBatchWakes(self) -> None:
        """
        Turns of one record each gather while the batch is not full (two
        records wait, unwritten); the third fills it, and it is written at
        once, long before the commit interval ends.
        """
        for seq in (1, 2):
            self.writer.submit([row(seq)])
            await settle(0.05)
        self.assertEqual(self.batches, [])
        self.writer.submit([row(3)])
        await wait_for(lambda: len(self.batches) == 1, BOUND)
        [outcome] = self.batches
        self.assertEqual((outcome.records, outcome.stream_last), (3, {"s": 3}))


class ControlTests(WriterCase):
    """A control operation while the thread dozes."""

    config = JournalConfig(commit_interval_s=LONG_INTERVAL)

    async def test_barrierWakes(self) -> None:
        """
        A barrier submitted while a batch gathers ends the gathering: the
        records before it are written, in one batch, before it is done.
        """
        self.writer.submit([row(1)])
        await settle(0.05)
        self.writer.submit([row(2), row(3)])
        done: Deferred[None] = Deferred()
        self.writer.submit(Barrier(lambda: done.callback(None)))
        await done
        [outcome] = self.batches
        self.assertEqual((outcome.records, outcome.stream_last), (3, {"s": 3}))


class IntervalTests(WriterCase):
    """Turns that never fill a batch."""

    config = JournalConfig(commit_interval_s=2.0)

    async def test_turnsShareOneBatch(self) -> None:
        """
        Turns submitted while the thread dozes through its commit interval
        are written together, in one batch, once the interval ends.
        """
        for seq in range(1, 6):
            self.writer.submit([row(seq)])
            await settle(0.01)
        await wait_for(lambda: len(self.batches) >= 1, BOUND)
        [outcome] = self.batches
        self.assertEqual((outcome.records, outcome.stream_last), (5, {"s": 5}))
