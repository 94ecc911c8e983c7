"""
Tests for the owners of addresses in L{malamute_pack.journal.journal}: the
journal is the broker's L{OwnerStore}, each claim a write of its own kind
in the order of writes (group-committed by the journal's one writer thread,
shipped to a pair's partner like any write), read back when the journal
opens, into the broker's L{Owners}. Real journals on real SQLite files.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import closing
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.access import Owners
from malamute_pack.broker.errors import Refused
from malamute_pack.journal import SYNCHRONOUS_LEVELS, Journal, JournalConfig
from malamute_pack.journal.writer import OwnerClaim, QueuedStore, WriteOp
from tests.clock_support import ThreadedClock
from tests.support import capture_log


class JournalOwnersTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.clock = ThreadedClock()

    def wait(self, d: Deferred[None]) -> None:
        done: list[object] = []
        d.addBoth(done.append)
        self.clock.run_thread_calls(lambda: bool(done))
        self.assertEqual(done, [None])

    def journal(self, **config: object) -> Journal:
        journal = Journal(
            self.path,
            self.clock,
            JournalConfig(prune_interval_s=3600, **config),  # type: ignore[arg-type]
        )
        journal.open()
        self.addCleanup(lambda: self.wait(journal.close()) if journal.is_open else None)
        return journal

    def owners_table(self) -> list[tuple[str, str, float]]:
        with closing(sqlite3.connect(self.path)) as conn:
            return conn.execute(
                "SELECT address, user, claimed FROM address_owners ORDER BY address"
            ).fetchall()

    def test_claimsSurviveARestart(self) -> None:
        """
        Claims saved among letters are there when the journal opens again,
        with the time of each; a later save of an address replaces its
        owner (the broker's L{Owners} decides which claim prevails).
        """
        journal = self.journal()
        journal.save_owner("inbox", "alice", 5.0)
        journal.store_queued("mailbox", "inbox", "carol", "s", "", None, [b"x"], lambda e: None)
        journal.save_owner("bob", "bob", 6.0)
        journal.save_owner("inbox", "carol", 4.0)
        self.wait(journal.close())
        found = journal.open()
        self.assertEqual(found.owners, {"inbox": ("carol", 4.0), "bob": ("bob", 6.0)})
        self.assertEqual(len(found.queued), 1)

    def test_claimsInTheOrderOfWrites(self) -> None:
        """
        A claim is a write of its own (an L{OwnerClaim}), handed to the
        writer in the order it was made among the letters, with its
        position: what a pair's active ships to its partner.
        """
        journal = self.journal()
        shipped: list[tuple[int, list[WriteOp]]] = []
        journal.shipper = lambda first, ops: shipped.append((first, list(ops)))
        journal.store_queued("mailbox", "a", "s", "x", "", None, [b"1"], lambda e: None)
        journal.save_owner("a", "alice", 1.0)
        journal.store_queued("mailbox", "b", "s", "y", "", None, [b"2"], lambda e: None)
        self.wait(journal.flush())
        ((first, ops),) = shipped
        self.assertEqual(first, 1)
        self.assertEqual(
            [type(op) for op in ops], [QueuedStore, OwnerClaim, QueuedStore], "not in order"
        )
        self.assertEqual(ops[1], OwnerClaim("a", "alice", 1.0))
        self.assertEqual(self.owners_table(), [("a", "alice", 1.0)])

    def test_claimIsWrittenAsALetter(self) -> None:
        """
        A batch holding a claim is committed with the letters' durability
        (queue_synchronous, FULL by default) even when stream records, which
        need less, are all that is with it: who owns an address is decided once.
        """
        journal = self.journal(stream_synchronous="OFF")
        journal.append_stream("s", "w", "x", [b"1"], 1.0)
        self.wait(journal.flush())
        writer = journal._hand.writer
        assert writer is not None
        self.assertEqual(writer._synchronous, SYNCHRONOUS_LEVELS.index("OFF"))
        journal.append_stream("s", "w", "x", [b"2"], 1.0)
        journal.save_owner("a", "alice", 1.0)
        self.wait(journal.flush())
        self.assertEqual(writer._synchronous, SYNCHRONOUS_LEVELS.index("FULL"))

    def test_noThreadOfItsOwn(self) -> None:
        """
        Claims take no thread or connection of their own: the journal's
        writer writes them (the owners' thread of earlier versions is gone).
        """
        journal = self.journal()
        journal.save_owner("a", "alice", 1.0)
        self.wait(journal.flush())
        names = {thread.name for thread in threading.enumerate()}
        self.assertNotIn("journal-owners", names)
        self.assertEqual(self.owners_table(), [("a", "alice", 1.0)])

    def test_claimSQLiteCannotTakeFailsAlone(self) -> None:
        """
        A claim on an address SQLite cannot store (not valid UTF-8) is
        logged and dropped alone; the letters and claims with it are written.
        """
        events = capture_log(self)
        journal = self.journal()
        stored: list[object] = []
        journal.save_owner("caf\udce9", "alice", 1.0)
        journal.store_queued("mailbox", "a", "s", "x", "", None, [b"1"], stored.append)
        journal.save_owner("good", "bob", 2.0)
        self.wait(journal.flush())
        self.assertEqual(stored, [None])
        self.assertEqual(self.owners_table(), [("good", "bob", 2.0)])
        lines = [formatEvent(e) for e in events]
        self.assertTrue(any("not saved in the journal" in line for line in lines), lines)
        self.assertEqual(journal.counters.errors, 0)

    def test_saveWhileClosedIsLogged(self) -> None:
        """A claim made while the journal is closed is logged, never raised."""
        events = capture_log(self)
        journal = self.journal()
        self.wait(journal.close())
        journal.save_owner("late", "alice", 1.0)
        self.assertTrue(
            any("owner of 'late' not saved" in formatEvent(e) for e in events),
            [formatEvent(e) for e in events],
        )

    def test_ownersStoreAndLoad(self) -> None:
        """
        The journal as the store of the broker's L{Owners}: its claims are
        written, and another L{Owners} loaded from what the journal reads
        back after a restart refuses another user.
        """
        journal = self.journal()
        owners = Owners(journal, clock=self.clock)
        self.clock.advance(7.0)
        owners.claim("alice", "alice")
        self.wait(journal.close())
        found = journal.open()
        self.assertEqual(found.owners, {"alice": ("alice", 7.0)})
        again = Owners(journal, clock=self.clock)
        again.load(found.owners)
        self.assertEqual(again.owner("alice"), "alice")
        self.assertRaises(Refused, again.claim, "bob", "alice")
