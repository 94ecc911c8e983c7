"""
System test of a pair whose passive's journal is damaged while it is down
(L{malamute_pack.journal.salvage}, L{malamute_pack.pair.replication}): two
real brokers on two hosts (network namespaces), appends from a third. The
passive is killed (kill -9), a page of its journal is spoiled, and it
restarts: it salvages its journal, comes back passive, and its catch-up
copies again what it lost, so that, once it is the only broker left, it
serves every acknowledged record at its number.

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it). Support: ``tests/pair_system_support.py``.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import ClassVar

from tests.pair_system_support import (
    CAUGHT_UP,
    IN_SYNC,
    PASSIVE,
    SILENT,
    PairCase,
    check_appends,
)

STREAM = "ticks"
APPENDS = 200
RECORDS = 10
REFILLED = "were copied again from the active"


class SalvagedPassiveTests(PairCase):
    """The passive's journal damaged while it is down."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_salvagedPassiveRefilled": "mpd1"}

    def test_salvagedPassiveRefilled(self) -> None:
        """
        2,000 records appended (acknowledged on both disks); the passive h2
        is killed, a page of its journal spoiled; restarted, h2 says its
        journal was damaged and what it lost, comes back passive, catches
        up and says the lost records were copied again. Then h1 is killed:
        h2 serves every acknowledged record at its number.
        """
        self.start_pair()
        job = self.client(
            "append",
            kind="append",
            endpoints=self.both,
            stream=STREAM,
            prefix="pd",
            records=RECORDS,
            count=APPENDS,
        )
        appended = job.records(120.0)
        self.assertEqual(sum(1 for r in appended if "first" in r), APPENDS)
        self.broker(2).kill()
        path = self.broker(2).data_dir / "journal.sqlite"
        # What an automatic checkpoint would have put in the file before the
        # kill (the journal is still marked running: an unclean stop).
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            (running,) = conn.execute(
                "SELECT value FROM journal_counters WHERE name = 'running'"
            ).fetchone()
        self.assertEqual(running, 1)
        data = bytearray(path.read_bytes())
        page = data.index(b"pd000100.0") // 4096
        data[page * 4096] = 0x77
        path.write_bytes(bytes(data))
        self.broker(2).start(timeout=60.0)
        self.wait_logs(
            [(2, "was damaged"), (2, PASSIVE), (2, CAUGHT_UP), (2, REFILLED), (1, IN_SYNC, 2)],
            60.0,
            "h2 did not salvage and catch up",
        )
        self.assertIn(f"salvage: stream {STREAM!r}: records", self.broker(2).run_log())
        silent = self.broker(2).run_log().count(SILENT)
        self.broker(1).kill()
        self.wait_logs([(2, SILENT, silent + 1)], 10.0, "h2 did not see h1 go")
        rows = self.read_stream([self.endpoint(2)], STREAM)
        check = check_appends(appended, rows)
        self.assertEqual(check.missing, [])
        self.assertEqual(check.reused, [])
        self.assertEqual(check.records, APPENDS * RECORDS)
