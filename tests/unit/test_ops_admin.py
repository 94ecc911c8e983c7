"""
Tests for L{malamute_pack.ops.admin}: each admin action's effect on a real
broker model and a real journal (what a restart recovers, what the file
holds), what it returns, and its refusals.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.journal import JournalConfig
from malamute_pack.journal.writer import CompactSet, RetentionSet, StreamDelete, WriteOp
from malamute_pack.ops.admin import Admin, AdminError
from malamute_pack.ops.management import ManagementSession
from malamute_pack.ops.stats import Statistics
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from tests.broker_support import BrokerHarness

W, R, M, B, S, S2 = b"writer", b"reader", b"mailer", b"bob", b"server", b"server-2"


class AdminCase(SynchronousTestCase):
    """A broker model on a clock with a real journal (unless C{journaled} is False)."""

    journaled = True

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())
        self.admin = Admin(self.h.broker, self.h.journal)

    def harness(self) -> BrokerHarness:
        return BrokerHarness(
            BrokerConfig(timeout=3600.0),
            self.path if self.journaled else None,
            JournalConfig(prune_interval_s=3600),
        )

    def restart(self) -> BrokerHarness:
        self.h.close()
        self.h = self.harness()
        return self.h

    def rows(self, sql: str) -> list[tuple[object, ...]]:
        with sqlite3.connect(self.path) as conn:
            return conn.execute(sql).fetchall()

    def flush(self) -> None:
        """Wait until everything handed to the journal so far is done (prunes included)."""
        assert self.h.journal is not None
        done: list[object] = []
        self.h.journal.flush().addBoth(done.append)
        self.h.clock.run_thread_calls(lambda: bool(done))

    def write(self, count: int, stream: str = "s") -> None:
        self.h.open(W, "writer")
        self.h.command(W, mlm.StreamWrite(stream))
        for n in range(count):
            self.h.send(W, mlm.StreamSend(f"m{n}", [b"x" * 10]))
        self.h.settle()


class PurgeTests(AdminCase):
    def test_purgeMailbox(self) -> None:
        """
        Purging a mailbox drops its letters for good: counted with their
        bytes, out of the memory budget, and gone from the journal (a
        restart recovers none).
        """
        h = self.h
        h.open(M, "mailer")
        for _ in range(3):
            h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        h.settle()
        self.assertEqual(self.rows("SELECT count(*) FROM queued_messages"), [(3,)])
        result = self.admin.purge_mailbox("bob")
        self.assertEqual(result, {"mailbox": "bob", "purged": 3, "bytes": 15, "journaled": True})
        self.assertEqual(len(h.broker.post.mailboxes["bob"]), 0)
        self.assertEqual(h.broker.post.letter_bytes, 0)
        self.assertEqual(h.broker.post.purged, 3)
        h.settle()
        self.assertEqual(self.rows("SELECT count(*) FROM queued_messages"), [(0,)])
        h = self.restart()
        self.assertEqual(h.open(B, "bob"), [])

    def test_purgeTellsTrackedSenders(self) -> None:
        """The sender of a tracked letter hears it failed: purged by an operator."""
        h = self.h
        h.open(M, "mailer")
        h.send(M, mlm.MailboxSend("bob", "hi", "t-1", 0, [b"hello"]))
        h.take(M)
        self.admin.purge_mailbox("bob")
        self.assertEqual(h.take(M), [mlm.Confirm("t-1", mlm.FAILED, "purged by an operator")])

    def test_purgeService(self) -> None:
        """
        Purging a service queue drops the requests waiting (not those a
        worker holds), from the journal too.
        """
        h = self.h
        h.open(S, "server", version=2)
        h.command(S, mlm.ServiceOffer("svc", ".*"))
        h.send(S, mlm.Credit(1))
        h.open(M, "mailer")
        for _ in range(3):
            h.send(M, mlm.ServiceSend("svc", "job", "", 0, [b"work"]))
        h.settle()
        result = self.admin.purge_service("svc")
        self.assertEqual(result, {"service": "svc", "purged": 2, "bytes": 8, "journaled": True})
        self.assertEqual(len(h.broker.post.services["svc"].queue), 0)
        (held,) = h.broker.registry.holder("server").held.values()  # type: ignore[union-attr]
        h.settle()
        self.assertEqual(self.rows("SELECT id FROM queued_messages"), [(held.id,)])

    def test_unknownQueues(self) -> None:
        """Purging a mailbox or a service that does not exist is an AdminError."""
        self.assertRaises(AdminError, self.admin.purge_mailbox, "nobody")
        self.assertRaises(AdminError, self.admin.purge_service, "nothing")


class NoJournalPurgeTests(AdminCase):
    journaled = False

    def test_purgeWithoutJournal(self) -> None:
        """Without a journal a purge empties the queue in memory."""
        h = self.h
        h.open(M, "mailer")
        h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        self.assertEqual(
            self.admin.purge_mailbox("bob"),
            {"mailbox": "bob", "purged": 1, "bytes": 5, "journaled": False},
        )
        self.assertEqual(h.open(B, "bob"), [])

    def test_deleteStreamWithoutJournal(self) -> None:
        """Without a journal, deleting a stream's records finds none to delete."""
        self.write(2)
        result = self.admin.delete_stream("s")
        self.assertEqual((result["records"], result["bytes"]), (0, 0))
        self.assertRaises(AdminError, self.admin.delete_stream, "nothing")

    def test_retentionNeedsJournal(self) -> None:
        """Without a journal there is no retention to change."""
        self.assertRaises(AdminError, self.admin.set_retention, None, 60.0, None, None)

    def test_compactionNeedsJournal(self) -> None:
        """Without a journal there is no last-value stream."""
        self.assertRaises(AdminError, self.admin.set_compaction, "s", "subject")


class DeleteStreamTests(AdminCase):
    def test_deleteStream(self) -> None:
        """
        Deleting a stream's records removes them from the journal at once
        for readers (the first retained sequence number moves past them)
        and from the file; numbering goes on, and a reader from the
        earliest gets only what is written after.
        """
        self.write(5)
        result = self.admin.delete_stream("s")
        self.assertEqual(
            result, {"stream": "s", "records": 5, "deleted_through": 5, "first_seq": 6}
        )
        assert self.h.journal is not None
        self.assertEqual(self.h.journal.first_seq("s"), 6)
        self.h.settle()
        self.flush()
        self.assertEqual(self.rows("SELECT count(*) FROM stream_messages"), [(0,)])
        self.assertEqual(
            self.rows("SELECT message_count, total_bytes FROM streams WHERE stream = 's'"),
            [(0, 0)],
        )
        self.h.send(W, mlm.StreamSend("after", [b"y"]))
        self.h.open(R, "reader", version=2)
        answers = self.h.command(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        got = [m for m in answers + self.h.take(R) if isinstance(m, mlm.StreamRecord)]
        self.assertEqual([(m.sequence, m.subject) for m in got], [(6, "after")])
        stats = Statistics(self.h.clock, self.h.broker, self.h.journal, Settings())
        stats.sample()
        self.h.clock.run_thread_calls(lambda: not stats.refreshing)
        (stream,) = stats.streams()
        self.assertEqual((stream["first_seq"], stream["retained_records"]), (6, 1))

    def test_deleteKeepsOtherStreams(self) -> None:
        """Only the named stream's records go."""
        self.write(2, "s")
        self.h.open(B, "bob")
        self.h.command(B, mlm.StreamWrite("t"))
        self.h.send(B, mlm.StreamSend("t1", [b"z"]))
        self.h.settle()
        self.admin.delete_stream("s")
        self.h.settle()
        self.flush()
        self.assertEqual(self.rows("SELECT stream, seq FROM stream_messages"), [("t", 1)])

    def test_deleteIsAJournalWrite(self) -> None:
        """
        The delete is one of the journal's ordered writes (what a pair's
        active ships to its partner), after the records it deletes.
        """
        shipped: list[WriteOp] = []
        assert self.h.journal is not None
        self.h.journal.shipper = lambda first, ops: shipped.extend(ops)
        self.write(3)
        self.admin.delete_stream("s")
        self.h.settle()
        self.flush()
        self.assertEqual(len(shipped), 4)
        delete = shipped[-1]
        assert isinstance(delete, StreamDelete)
        self.assertEqual(
            (delete.stream, delete.through, delete.deleted, delete.freed), ("s", 3, 3, 3 * 14)
        )

    def test_unknownStream(self) -> None:
        """Deleting a stream that does not exist is an AdminError."""
        self.assertRaises(AdminError, self.admin.delete_stream, "nothing")


class RetentionTests(AdminCase):
    def test_streamRetention(self) -> None:
        """
        A stream's new retention prunes it at once, leaves the others and
        the default alone, and says it lasts until the broker restarts.
        """
        self.write(5, "s")
        self.write(5, "t")
        result = self.admin.set_retention("s", None, None, 2)
        self.assertEqual(result["stream"], "s")
        self.assertEqual(result["retention"]["max_records"], 2)
        self.assertEqual(result["previous"]["max_records"], 1_000_000)
        self.assertEqual(result["retention"]["max_age_s"], result["previous"]["max_age_s"])
        self.assertIs(result["until_restart"], True)
        self.assertIn("until the broker restarts", result["note"])
        self.flush()
        assert self.h.journal is not None
        self.assertEqual(self.h.journal.first_seq("s"), 4)
        self.assertEqual(self.h.journal.first_seq("t"), 1)
        self.assertEqual(self.h.journal.config.retention_for("t").max_count, 1_000_000)

    def test_defaultRetention(self) -> None:
        """The default retention changes every stream without its own; 0 removes a limit."""
        self.write(5, "s")
        result = self.admin.set_retention(None, 0, None, 3)
        self.assertEqual(result["retention"]["max_age_s"], None)
        self.assertEqual(result["retention"]["max_records"], 3)
        self.flush()
        assert self.h.journal is not None
        self.assertEqual(self.h.journal.first_seq("s"), 3)

    def test_retentionIsAJournalWrite(self) -> None:
        """
        A retention change takes its place among the journal's ordered
        writes (what a pair's active ships to its partner), with the new
        default and each stream's own.
        """
        shipped: list[WriteOp] = []
        assert self.h.journal is not None
        self.h.journal.shipper = lambda first, ops: shipped.extend(ops)
        self.write(1)
        self.admin.set_retention("s", None, None, 2)
        self.flush()
        (change,) = [op for op in shipped if isinstance(op, RetentionSet)]
        self.assertEqual(change.retention, self.h.journal.config.retention)
        self.assertEqual(change.per_stream["s"].max_count, 2)

    def test_badRetention(self) -> None:
        """A negative limit or an unknown stream is an AdminError."""
        self.write(1)
        self.assertRaises(AdminError, self.admin.set_retention, "s", -1.0, None, None)
        self.assertRaises(AdminError, self.admin.set_retention, "nothing", 1.0, None, None)


class CompactionTests(AdminCase):
    def test_turnOnAndOff(self) -> None:
        """
        A stream made a last-value stream keeps its subjects' last values
        (built at once from what it retains), listed in the statistics;
        made an ordinary one again, it forgets them. Each says it lasts
        until the broker restarts.
        """
        self.write(3, "s")
        result = self.admin.set_compaction("s", "subject")
        self.assertEqual((result["compact"], result["previous"]), ("subject", ""))
        self.assertIn("until the broker restarts", result["note"])
        self.flush()
        assert self.h.journal is not None
        self.assertTrue(self.h.journal.compacted("s"))
        self.assertEqual(self.rows("SELECT count(*) FROM stream_last_values"), [(3,)])
        stats = Statistics(self.h.clock, self.h.broker, self.h.journal, Settings())
        (stream,) = stats.streams()
        self.assertEqual(
            (stream["compact"], stream["last_values"], stream["last_values_not_kept"]),
            ("subject", 3, 0),
        )
        result = self.admin.set_compaction("s", "")
        self.assertEqual((result["compact"], result["previous"]), ("", "subject"))
        self.flush()
        self.assertFalse(self.h.journal.compacted("s"))
        self.assertEqual(self.rows("SELECT count(*) FROM stream_last_values"), [(0,)])
        (stream,) = stats.streams()
        self.assertEqual((stream["compact"], stream["last_values"]), ("", None))

    def test_compactionIsAJournalWrite(self) -> None:
        """
        A compaction change takes its place among the journal's ordered
        writes (what a pair's active ships to its partner), naming every
        last-value stream.
        """
        shipped: list[WriteOp] = []
        assert self.h.journal is not None
        self.h.journal.shipper = lambda first, ops: shipped.extend(ops)
        self.write(1)
        self.admin.set_compaction("s", "subject")
        self.flush()
        (change,) = [op for op in shipped if isinstance(op, CompactSet)]
        self.assertEqual(change.streams, frozenset({"s"}))

    def test_refusals(self) -> None:
        """Another compaction, or an unknown stream, is an AdminError."""
        self.write(1)
        self.assertRaises(AdminError, self.admin.set_compaction, "s", "key")
        self.assertRaises(AdminError, self.admin.set_compaction, "nothing", "subject")


class DisconnectTests(AdminCase):
    journaled = False

    def test_disconnectByAddress(self) -> None:
        """
        Disconnecting a client ends its connection as an expiry would: the
        requests it held go back to their queue, to another worker.
        """
        h = self.h
        h.open(S, "server", version=2)
        h.command(S, mlm.ServiceOffer("svc", ".*"))
        h.open(M, "mailer")
        h.send(M, mlm.ServiceSend("svc", "job", "", 0, [b"work"]))
        self.assertEqual(len(h.take(S)), 1)
        result = self.admin.disconnect("server")
        self.assertEqual(
            result,
            {
                "client": S.hex(),
                "address": "server",
                "user": None,
                "disconnected": True,
                "requeued": 1,
            },
        )
        self.assertFalse(h.connected(S))
        h.open(S2, "server-2")
        got = h.command(S2, mlm.ServiceOffer("svc", ".*"))
        self.assertEqual([m.subject for m in got if isinstance(m, mlm.ServiceDeliver)], ["job"])
        # It must open again: anything else is refused.
        self.assertIsInstance(h.command(S, mlm.ConnectionPing())[0], mlm.Error)

    def test_disconnectById(self) -> None:
        """A client (an anonymous one too) is found by its id in the clients section."""
        h = self.h
        h.open(R, "")
        self.assertEqual(self.admin.disconnect(R.hex())["address"], "")
        self.assertFalse(h.connected(R))

    def test_refusals(self) -> None:
        """An unknown client, or a part of the broker, cannot be disconnected."""
        self.assertRaises(AdminError, self.admin.disconnect, "nobody")
        stats = Statistics(self.h.clock, self.h.broker, None, Settings())
        session = ManagementSession(self.h.clock, self.h.broker, stats)
        session.attach()
        (internal,) = [c for c in stats.clients() if c["internal"]]
        self.assertRaises(AdminError, self.admin.disconnect, internal["id"])
