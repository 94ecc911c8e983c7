"""
Tests for L{malamute_pack.journal.owners}: claims written beside a real
journal (its own connection and thread, the journal's writer running) and
read back after a restart, into the broker's L{Owners} through the service.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.access import Owners
from malamute_pack.journal import Journal, JournalConfig, JournalError
from malamute_pack.journal.owners import OwnerJournal, OwnerJournalService
from tests.clock_support import ThreadedClock


class OwnerJournalTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.clock = ThreadedClock()

    def wait(self, d: Deferred[None]) -> None:
        done: list[object] = []
        d.addBoth(done.append)
        self.clock.run_thread_calls(lambda: bool(done))
        self.assertEqual(done, [None])

    def open_journal(self) -> Journal:
        journal = Journal(self.path, self.clock, JournalConfig(prune_interval_s=3600))
        journal.open()
        self.addCleanup(lambda: self.wait(journal.close()))
        return journal

    def test_claimsSurviveARestart(self) -> None:
        """
        Claims written while the journal's own writer writes letters are
        there after both close and open again; a second claim of an
        address keeps the first owner.
        """
        journal = self.open_journal()
        owners = OwnerJournal(self.path, self.clock)
        self.assertEqual(owners.open(), {})
        owners.save_owner("inbox", "alice")
        journal.store_queued("mailbox", "inbox", "carol", "s", "", None, [b"x"], lambda e: None)
        owners.save_owner("bob", "bob")
        owners.save_owner("inbox", "bob")
        self.wait(owners.flush())
        self.assertEqual((owners.saved, owners.failed), (3, 0))
        self.wait(owners.close())
        again = OwnerJournal(self.path, self.clock)
        self.assertEqual(again.open(), {"inbox": "alice", "bob": "bob"})
        self.wait(again.close())

    def test_saveAfterCloseIsCountedAndLogged(self) -> None:
        """A claim that cannot be written is counted and logged, never raised."""
        self.open_journal()
        owners = OwnerJournal(self.path, self.clock)
        owners.open()
        self.wait(owners.close())
        owners.save_owner("late", "alice")
        self.assertEqual(owners.failed, 1)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_unmigratedDatabaseRefused(self) -> None:
        """A database without the journal's tables is a JournalError at open."""
        self.path.parent.mkdir(parents=True)
        sqlite3.connect(self.path).close()
        self.assertRaises(JournalError, OwnerJournal(self.path, self.clock).open)

    def test_serviceLoadsTheBrokersOwners(self) -> None:
        """
        The service hands the stored claims to the broker's Owners, whose
        new claims are then stored; stopping it closes the table.
        """
        self.open_journal()
        first = OwnerJournal(self.path, self.clock)
        first.open()
        first.save_owner("inbox", "alice")
        self.wait(first.close())
        table = OwnerJournal(self.path, self.clock)
        owners = Owners(table)
        service = OwnerJournalService(table, owners.load)
        service.startService()
        self.assertEqual(owners.owner("inbox"), "alice")
        owners.claim("bob", "bob")
        stopped = service.stopService()
        assert stopped is not None
        self.wait(stopped)
        check = OwnerJournal(self.path, self.clock)
        self.assertEqual(check.open(), {"inbox": "alice", "bob": "bob"})
        self.wait(check.close())
