"""
Tests for a real broker (``twistd malamute``) whose journal file is damaged
while it is down, as a fault injector damages it: bits flipped at random
past the SQLite header, or the file cut short. The broker starts (it
salvages a file it finds damaged: L{malamute_pack.journal.salvage}), and a
bulk read of everything written answers in bounded time with each record
either served with its exact content or inside a gap: never a damaged
record served as good, never a read left waiting
(L{malamute_pack.journal.verify}, L{malamute_pack.broker.ranges}).
"""

from __future__ import annotations

import random
from pathlib import Path

from malamute_pack.client.bulk import BulkClient, RangeGap
from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.system_support import SystemCase

APPENDS = 20
PER_APPEND = 100
RECORDS = APPENDS * PER_APPEND
# Seconds a read may stay silent: far above a sound broker's answer.
READ_TIMEOUT_S = 10.0


def content(seq: int) -> tuple[str, tuple[bytes, ...]]:
    """Record C{seq}'s subject and frames (the appends number them 1.. in order)."""
    i, n = divmod(seq - 1, PER_APPEND)
    return f"sub{n % 7}", (f"body-{i}-{n}".encode() * 10,)


class DamagedJournalTests(SystemCase):
    """A broker whose journal is damaged while it is down."""

    def fill(self) -> BrokerProcess:
        """A broker holding RECORDS records of stream C{s}, stopped; its journal file."""
        broker = self.start()
        with BulkClient(broker.endpoint) as client:
            for i in range(APPENDS):
                client.append(
                    "s", f"k{i}", [content(i * PER_APPEND + n + 1) for n in range(PER_APPEND)]
                )
        broker.stop()
        return broker

    def journal(self, broker: BrokerProcess) -> Path:
        path = broker.data_dir / "journal.sqlite"
        self.assertTrue(path.exists())
        return path

    def read_all(self, broker: BrokerProcess) -> tuple[set[int], set[int]]:
        """
        Read 1..RECORDS back: the records served (each checked exact) and
        the numbers told as gaps; fails on a wrong record or a silent broker.
        """
        served: set[int] = set()
        gapped: set[int] = set()
        with BulkClient(broker.endpoint, timeout=READ_TIMEOUT_S, retries=0) as client:
            for item in client.read_range("s", 1, RECORDS):
                if isinstance(item, RangeGap):
                    gapped.update(range(item.missed, item.available))
                    continue
                for seq, subject, frames in zip(item.seq, item.subject, item.content, strict=True):
                    self.assertEqual((subject, decode_frames(frames)), content(seq), seq)
                    served.add(seq)
        self.assertFalse(served & gapped)
        return served, gapped

    def test_flippedBitsNeverServedWrong(self) -> None:
        """
        Bits flipped at random past the header (three seeded rounds of five):
        the broker starts, and every record is served exactly or told as a
        gap, the read answered every time.
        """
        broker = self.fill()
        path = self.journal(broker)
        pristine = path.read_bytes()
        for seed in (3, 16, 19):
            data = bytearray(pristine)
            chance = random.Random(seed)
            for _ in range(5):
                at = chance.randrange(4096, len(data))
                data[at] ^= 1 << chance.randrange(8)
            for name in path.parent.glob("journal.sqlite*"):
                name.unlink()
            path.write_bytes(bytes(data))
            broker.start()
            served, gapped = self.read_all(broker)
            self.assertEqual(served | gapped, set(range(1, RECORDS + 1)), seed)
            broker.stop()

    def test_truncatedJournalSalvaged(self) -> None:
        """
        A journal cut short is salvaged at start: the damaged file is kept
        beside it, the log says what was lost, the records before the cut
        are served and those after are told as gaps, and a new record's
        number comes after every number the damaged file held.
        """
        broker = self.fill()
        path = self.journal(broker)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) * 3 // 4])
        broker.start()
        log = broker.run_log()
        self.assertIn("was damaged", log)
        self.assertIn("salvage: stream 's': records", log)
        [aside] = [
            p
            for p in path.parent.glob("journal.sqlite.damaged-*")
            if not p.name.endswith(("-wal", "-shm"))
        ]
        self.assertEqual(aside.read_bytes(), data[: len(data) * 3 // 4])
        served, gapped = self.read_all(broker)
        self.assertEqual(served | gapped, set(range(1, RECORDS + 1)))
        self.assertIn(1, served)
        self.assertTrue(gapped)
        with BulkClient(broker.endpoint) as client:
            appended = client.append("s", "after", [("late", [b"x"])])
        self.assertGreater(appended.first, RECORDS)
