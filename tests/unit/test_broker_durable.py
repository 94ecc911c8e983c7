"""
Tests for the broker model with a real journal (L{malamute_pack.broker.streaming},
L{malamute_pack.broker.postal} on L{malamute_pack.journal.Journal}): stream
sequence numbers, reading from every kind of position, on-demand delivery
under credit with exact sequence continuity, retention gaps, durable
mailboxes and queues with STORED and DONE, and recovery after a restart.
"""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import Journal, JournalConfig, RetentionPolicy
from malamute_pack.protocol import chunks, mlm
from tests.broker_support import BrokerHarness
from tests.journal_support import ids_before
from tests.memory_session import InMemorySession
from tests.support import fill_disk, mount_tmpfs, skip_slow
from tests.unit.test_journal_damage import mark_crashed

W, R, R2, S = b"writer", b"reader", b"reader-2", b"sender"


def records(messages: list[mlm.Message]) -> list[tuple[int, str]]:
    """(sequence, subject) of every STREAM_RECORD in C{messages}."""
    return [(m.sequence, m.subject) for m in messages if isinstance(m, mlm.StreamRecord)]


class DurableTestCase(SynchronousTestCase):
    """A broker journaling to a fresh SQLite file, restartable."""

    config = BrokerConfig(timeout=60.0)
    journal_config = JournalConfig(prune_interval_s=3600)

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())

    def harness(self) -> BrokerHarness:
        return BrokerHarness(self.config, self.path, self.journal_config)

    def restart(self) -> None:
        """Stop the broker, close its journal, start a new one on the same file."""
        self.h.close()
        self.h = self.harness()

    def writer(self, stream: str = "s") -> None:
        self.h.open(W, "writer", version=2)
        self.assertEqual(self.h.command(W, mlm.StreamWrite(stream)), [mlm.Ok()])

    def write(self, *subjects: str) -> None:
        for subject in subjects:
            self.h.send(W, mlm.StreamSend(subject, [subject.encode()]))


class StreamSequenceTests(DurableTestCase):
    def test_recordsCarrySequence(self) -> None:
        """
        A version 2 reader gets STREAM_RECORD with sequence numbers 1, 2, 3
        and the write time; a version 1 reader gets plain STREAM_DELIVER.
        """
        self.writer()
        self.h.open(R, "v2", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.open(R2, "v1")
        self.h.command(R2, mlm.StreamRead("s", ""))
        self.h.clock.advance(12.5)
        self.write("a", "b", "c")
        got = self.h.take(R)
        self.assertEqual(records(got), [(1, "a"), (2, "b"), (3, "c")])
        assert isinstance(got[0], mlm.StreamRecord)
        self.assertEqual((got[0].timestamp, got[0].content), (12500, [b"a"]))
        self.assertEqual(
            [m.subject for m in self.h.take(R2) if isinstance(m, mlm.StreamDeliver)],
            ["a", "b", "c"],
        )

    def test_sequenceSurvivesRestart(self) -> None:
        """Sequence numbers continue after a restart, without a gap or reuse."""
        self.writer()
        self.write("a", "b", "c")
        self.h.settle()
        self.restart()
        self.writer()
        self.write("d", "e")
        self.h.open(R, "r", version=2)
        self.assertEqual(
            records(self.h.command(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))),
            [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")],
        )


class PositionTests(DurableTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.writer()
        self.write("a", "b", "c")
        self.h.clock.advance(10)
        self.write("d", "e")
        self.h.open(R, "r", version=2)

    def readFrom(self, whence: int, position: int = 0, pattern: str = "") -> list[mlm.Message]:
        self.h.send(R, mlm.StreamReadFrom("s", pattern, whence, position))
        return self.h.take(R)

    def test_earliest(self) -> None:
        """EARLIEST delivers everything retained, after the OK."""
        got = self.readFrom(mlm.EARLIEST)
        self.assertEqual(got[0], mlm.Ok())
        self.assertEqual([n for n, _ in records(got)], [1, 2, 3, 4, 5])

    def test_sequence(self) -> None:
        """SEQUENCE delivers from that sequence number on."""
        self.assertEqual([n for n, _ in records(self.readFrom(mlm.SEQUENCE, 4))], [4, 5])

    def test_time(self) -> None:
        """TIME delivers from the first message written at or after that time."""
        self.assertEqual([n for n, _ in records(self.readFrom(mlm.TIME, 10_000))], [4, 5])
        self.write("f")
        self.assertEqual(records(self.h.take(R)), [(6, "f")])

    def test_latest(self) -> None:
        """LATEST delivers only what is written afterwards, as STREAM_READ."""
        self.assertEqual(self.readFrom(mlm.LATEST), [mlm.Ok()])
        self.write("f")
        self.assertEqual(records(self.h.take(R)), [(6, "f")])

    def test_patternApplies(self) -> None:
        """History is filtered by the reader's pattern like live messages."""
        self.assertEqual(records(self.readFrom(mlm.EARLIEST, 0, "^[bd]$")), [(2, "b"), (4, "d")])

    def test_historyThenLiveWithoutGap(self) -> None:
        """
        Messages written while the history is still being read arrive after
        it, in order, each once.
        """
        self.h.send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        self.write("f", "g")
        self.h.settle()
        self.write("h")
        self.assertEqual([n for n, _ in records(self.h.take(R))], [1, 2, 3, 4, 5, 6, 7, 8])

    def test_ownMessagesSkipped(self) -> None:
        """A writer reading its own stream from the start does not get its own messages."""
        self.h.send(W, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        self.assertEqual(records(self.h.take(W)), [])

    def test_version1Refused(self) -> None:
        """A version 1 client's STREAM_READ_FROM gets ERROR 500."""
        self.h.open(R2, "old")
        [reply] = self.h.command(R2, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)

    def test_badWhence(self) -> None:
        """An unknown whence gets ERROR 300 with the reason."""
        [reply] = self.readFrom(7)
        assert isinstance(reply, mlm.Error)
        self.assertIn("whence", reply.status_reason)


class CreditTests(DurableTestCase):
    def test_outOfCreditCatchesUp(self) -> None:
        """
        A reader out of credit misses nothing: with new credit it gets the
        messages it missed, then live ones, with no gap and no duplicate.
        """
        self.writer()
        self.h.open(R, "r", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.send(R, mlm.Credit(2))
        self.write(*"abcde")
        self.assertEqual([n for n, _ in records(self.h.take(R))], [1, 2])
        self.h.send(R, mlm.Credit(2))
        self.assertEqual([n for n, _ in records(self.h.take(R))], [3, 4])
        self.h.send(R, mlm.Credit(100))
        self.write("f")
        self.assertEqual([n for n, _ in records(self.h.take(R))], [5, 6])
        self.write("g")
        self.assertEqual(records(self.h.take(R)), [(7, "g")])

    def test_version1ReaderCatchesUp(self) -> None:
        """A version 1 reader that uses credit gets the same on-demand delivery."""
        self.writer()
        self.h.open(R, "r")
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.send(R, mlm.Credit(1))
        self.write(*"abc")
        self.h.send(R, mlm.Credit(10))
        subjects = [m.subject for m in self.h.take(R) if isinstance(m, mlm.StreamDeliver)]
        self.assertEqual(subjects, ["a", "b", "c"])

    def test_undeliveredRecordsComeAgain(self) -> None:
        """
        Live records the transport took but could not send after all (its
        batch went out to a full queue) come again from the journal once
        the reader has room, in order, then live ones, none twice.
        """
        self.writer()
        self.h.open(R, "r")
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.defer_sends()
        self.write(*"abc")
        self.h.full.add(R)
        self.h.send_deferred()
        self.assertEqual(self.h.take(R), [])
        self.h.full.discard(R)
        self.h.clock.advance(1)
        self.write("d")
        subjects = [m.subject for m in self.h.take(R) if isinstance(m, mlm.StreamDeliver)]
        self.assertEqual(subjects, ["a", "b", "c", "d"])

    def test_undeliveredGivesCreditBack(self) -> None:
        """A record that could not be sent after all does not use up the reader's credit."""
        self.writer()
        self.h.open(R, "r", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.send(R, mlm.Credit(3))
        self.h.defer_sends()
        self.write(*"abc")
        self.h.full.add(R)
        self.h.send_deferred()
        self.h.full.discard(R)
        self.h.clock.advance(1)
        self.write("d")
        self.assertEqual([n for n, _ in records(self.h.take(R))], [1, 2, 3])
        self.h.send(R, mlm.Credit(1))
        self.assertEqual([n for n, _ in records(self.h.take(R))], [4])

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.tuples(st.integers(0, 12), st.integers(0, 6), st.booleans()),
            min_size=1,
            max_size=8,
        )
    )
    def test_sequenceContinuity(self, steps: list[tuple[int, int, bool]]) -> None:
        """
        Whatever the interleaving of writes, credit grants and journal
        commits, the reader never gets more than its credit, and after a
        final grant it has received every message exactly once, in order.
        """
        self.h.close()
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.writer()
        self.h.open(R, "r", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.send(R, mlm.Credit(0))
        granted, written, got = 0, 0, []
        for writes, credit, settle in steps:
            self.write(*(f"m{written + i}" for i in range(writes)))
            written += writes
            if credit:
                self.h.send(R, mlm.Credit(credit))
                granted += credit
            if settle:
                got += [n for n, _ in records(self.h.take(R))]
                self.assertLessEqual(len(got), granted)
        self.h.send(R, mlm.Credit(1000))
        got += [n for n, _ in records(self.h.take(R))]
        self.assertEqual(got, list(range(1, written + 1)))


class RetentionTests(DurableTestCase):
    journal_config = JournalConfig(prune_interval_s=3600, retention=RetentionPolicy(max_count=3))

    def test_gapReported(self) -> None:
        """
        A reader that fell behind retention gets STREAM_GAP with the first
        sequence number it wanted and the first still kept, then goes on
        from there.
        """
        self.writer()
        self.h.open(R, "r", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.send(R, mlm.Credit(1))
        self.write(*"abcdefghij")
        self.h.take(R)
        assert self.h.journal is not None
        pruned: list[object] = []
        self.h.journal.prune().addCallback(pruned.append)
        self.h.clock.run_thread_calls(lambda: bool(pruned))
        self.h.send(R, mlm.Credit(100))
        got = self.h.take(R)
        self.assertEqual(got[0], mlm.StreamGap("s", 2, 8))
        self.assertEqual([n for n, _ in records(got)], [8, 9, 10])
        self.assertEqual(self.h.broker.streams.gaps, 1)


class DurableLetterTests(DurableTestCase):
    def setUp(self) -> None:
        super().setUp()
        # The journal's first letter id (its ids start past its creation time).
        self.first = ids_before(self.path) + 1

    def test_storedAfterCommit(self) -> None:
        """
        A version 2 sender gets STORED for each MAILBOX_SEND, in order, with
        the letter's id, once the journal has committed it.
        """
        self.h.open(S, "tx", version=2)
        for n in range(3):
            self.h.send(S, mlm.MailboxSend("rx", f"m{n}", f"t{n}", 0, [b"x"]))
        self.assertEqual(
            self.h.take(S),
            [mlm.Stored(self.first + n, f"t{n}", 200, "stored") for n in range(3)],
        )

    def test_refusalKeepsOrder(self) -> None:
        """
        A refusal (a full mailbox) is answered with STORED 300 and no id, in
        its place after the STORED of the letters before it.
        """
        self.config = BrokerConfig(timeout=60.0, limits=Limits(mailbox_max_messages=1))
        self.h.close()
        self.h = self.harness()
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("rx", "a", "ta", 0, []))
        self.h.send(S, mlm.MailboxSend("rx", "b", "tb", 0, []))
        self.h.send(S, mlm.MailboxSend("", "c", "tc", 0, []))
        got = [m for m in self.h.take(S) if isinstance(m, mlm.Stored)]
        self.assertEqual(
            [(m.tracker, m.status_code, m.id) for m in got],
            [("ta", 200, self.first), ("tb", 300, 0), ("tc", 300, 0)],
        )
        self.assertIn("retry later", got[1].status_reason)

    def test_recordUntilDone(self) -> None:
        """
        A version 2 recipient gets MAILBOX_RECORD with the id; without DONE
        the letter comes back when it reconnects; after DONE it is gone,
        even across a restart, and a tracked sender hears the status.
        """
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("rx", "hello", "trk", 0, [b"body"]))
        self.h.take(S)
        got = self.h.open(R, "rx", version=2)
        first = self.first
        self.assertEqual(got, [mlm.MailboxRecord(first, "tx", "rx", "hello", "trk", [b"body"])])
        self.h.command(R, mlm.ConnectionClose())
        self.assertEqual(self.h.open(R, "rx", version=2), got)
        self.h.send(R, mlm.Done(first, 200, "processed"))
        self.assertEqual(self.h.take(S), [mlm.Confirm("trk", 200, "processed")])
        self.restart()
        self.assertEqual(self.h.open(R, "rx", version=2), [])

    def test_restartKeepsLetters(self) -> None:
        """Letters stored for an absent recipient survive a restart, in order, same ids."""
        self.h.open(S, "tx", version=2)
        for n in range(3):
            self.h.send(S, mlm.MailboxSend("rx", f"m{n}", "", 0, []))
        self.h.take(S)
        self.restart()
        got = self.h.open(R, "rx", version=2)
        self.assertEqual(
            [(m.id, m.subject) for m in got],  # type: ignore[attr-defined]
            [(self.first + n, f"m{n}") for n in range(3)],
        )

    def test_version1HandOverRemoves(self) -> None:
        """A letter handed to a version 1 recipient is gone after a restart."""
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("rx", "m", "", 0, []))
        self.assertEqual(len(self.h.open(R, "rx")), 1)
        self.restart()
        self.assertEqual(self.h.open(R, "rx"), [])

    def test_deliveredAndDoneNeverJournaled(self) -> None:
        """
        A letter handed at once to a recipient that owes no answer for it
        (version 1, untracked) is never written to the journal: its sender
        gets STORED with its id all the same, and the next letter's id
        follows it, across a restart too.
        """
        self.h.open(R, "rx")
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("rx", "now", "t1", 0, [b"x"]))
        self.assertEqual(self.h.take(S), [mlm.Stored(self.first, "t1", 200, "stored")])
        self.assertEqual(self.h.take(R), [mlm.MailboxDeliver("tx", "rx", "now", "t1", [b"x"])])
        assert self.h.journal is not None
        self.assertEqual(self.h.journal.counters.records_written, 0)
        self.h.send(S, mlm.MailboxSend("away", "later", "t2", 0, [b"y"]))
        self.assertEqual(self.h.take(S), [mlm.Stored(self.first + 1, "t2", 200, "stored")])
        self.assertEqual(self.h.journal.counters.records_written, 1)
        self.restart()
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("away", "after", "t3", 0, []))
        self.assertEqual(self.h.take(S), [mlm.Stored(self.first + 2, "t3", 200, "stored")])

    def test_heldLetterJournaled(self) -> None:
        """
        A letter handed at once to a recipient that must answer it (version
        2: DONE) is journaled all the same: after a restart it comes again.
        """
        self.h.open(R, "rx", version=2)
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.MailboxSend("rx", "m", "", 0, [b"x"]))
        letter = mlm.MailboxRecord(self.first, "tx", "rx", "m", "", [b"x"])
        self.assertEqual(self.h.take(R), [letter])
        self.restart()
        self.assertEqual(self.h.open(R, "rx", version=2), [letter])

    def test_serviceRequestRequeuedFromVersion2Worker(self) -> None:
        """A version 2 worker that closes without DONE gives its request back."""
        self.h.open(W, "w1", version=2)
        self.h.command(W, mlm.ServiceOffer("svc", ""))
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.ServiceSend("svc", "job", "", 0, [b"x"]))
        [request] = [m for m in self.h.take(W) if isinstance(m, mlm.ServiceRecord)]
        self.h.open(R, "w2", version=2)
        self.h.command(R, mlm.ServiceOffer("svc", ""))
        self.h.send(W, mlm.ConnectionClose())
        [again] = [m for m in self.h.take(R) if isinstance(m, mlm.ServiceRecord)]
        self.assertEqual((again.id, again.subject), (request.id, "job"))

    def test_confirmedTrackedRequestGone(self) -> None:
        """A version 1 worker's CONFIRM of a tracked request removes it from the journal."""
        self.h.open(W, "w1")
        self.h.command(W, mlm.ServiceOffer("svc", ""))
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.ServiceSend("svc", "job", "trk", 0, []))
        self.h.take(W)
        self.h.send(W, mlm.Confirm("trk", 200, ""))
        self.h.settle()
        self.restart()
        self.h.open(W, "w1")
        self.assertEqual(self.h.command(W, mlm.ServiceOffer("svc", "")), [mlm.Ok()])

    def test_unconfirmedTrackedRequestSurvivesRestart(self) -> None:
        """A tracked request a worker never confirmed is served again after a restart."""
        self.h.open(W, "w1")
        self.h.command(W, mlm.ServiceOffer("svc", ""))
        self.h.open(S, "tx", version=2)
        self.h.send(S, mlm.ServiceSend("svc", "job", "trk", 0, []))
        self.h.take(W)
        self.restart()
        self.h.open(W, "w1")
        got = self.h.command(W, mlm.ServiceOffer("svc", ""))
        self.assertEqual(got[1:], [mlm.ServiceDeliver("tx", "svc", "job", "trk", [])])


class NoJournalTests(SynchronousTestCase):
    def test_positionNeedsJournal(self) -> None:
        """Without a journal, reading from a position gets ERROR 501."""
        h = BrokerHarness()
        h.open(R, "r", version=2)
        [reply] = h.command(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.NOT_IMPLEMENTED)

    def test_storedAtOnce(self) -> None:
        """Without a journal a version 2 sender still gets STORED, at once."""
        h = BrokerHarness()
        h.open(S, "tx", version=2)
        self.assertEqual(
            h.command(S, mlm.MailboxSend("rx", "m", "t", 0, [])),
            [mlm.Stored(1, "t", 200, "stored")],
        )


class PeerBrokerTests(DurableTestCase):
    """A peer broker of the pack is sent only what is durable here."""

    def peer_held(self) -> tuple[Journal, InMemorySession]:
        """The journal, holding each batch for a pair's partner, and a peer broker reading C{s}."""
        journal = self.h.journal
        assert journal is not None
        journal.hold_for_replica(True)
        peer = InMemorySession("peer")
        remote = self.h.broker.attach_remote(peer)
        assert remote is not None
        self.h.broker.streams.subscribe(remote, "s", "")
        return journal, peer

    def test_peerGetsOnlyDurable(self) -> None:
        """
        A peer broker (a remote connection) reading a stream is sent a
        record only once it is durable here (in a pair, once the partner
        has it): while the batch waits for the partner, a local reader has
        its records live and the peer nothing; once the partner has them,
        the peer gets them in order, and later records as they commit.
        """
        journal, peer = self.peer_held()
        self.h.open(R, "local", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.writer()
        self.write("a", "b")
        self.h.clock.run_thread_calls(lambda: bool(journal.commit_latencies))
        live = [mlm.decode(frames) for frames in self.h.sent.pop(R, [])]
        self.assertEqual(records(live), [(1, "a"), (2, "b")])
        self.assertEqual(peer.records, [])
        journal.replica_acked(journal.handed)
        self.assertEqual([(r.seq, r.subject) for r in peer.records], [(1, "a"), (2, "b")])
        journal.hold_for_replica(False)
        self.write("c")
        self.h.settle()
        self.assertEqual([r.seq for r in peer.records], [1, 2, 3])

    def test_withheldNeverSent(self) -> None:
        """
        What waited for a pair's partner when the broker yields (withheld:
        never acknowledged, the partner serving without it) never reaches a
        peer broker, though a local reader had it live.
        """
        journal, peer = self.peer_held()
        self.writer()
        self.write("a")
        self.h.clock.run_thread_calls(lambda: bool(journal.commit_latencies))
        journal.withhold("this broker yielded to its pair's partner")
        self.h.settle()
        self.assertEqual(peer.records, [])


class ConsumerDurableTests(DurableTestCase):
    """A consumer group, and a durable consumer, are handed only what is durable here."""

    def test_consumerGetsOnlyDurable(self) -> None:
        """
        A durable consumer (STREAM_CONSUME) is sent a record only once it is
        durable (in a pair, once the partner has it), while a live reader
        has it at once (found by the soak: a consumer committed past records a
        yielding broker then never acknowledged, another record at their
        numbers on the broker that served).
        """
        journal = self.held_while_read_live(mlm.StreamConsume("s", "", "c1", ""), "a")
        journal.replica_acked(journal.handed)
        self.assertEqual(records(self.h.take(R2)), [(1, "a")])

    def test_memberGetsOnlyDurable(self) -> None:
        """
        A group's member is sent a record only once it is durable (in a
        pair, once the partner has it), while a local reader has it live;
        what the broker withholds (it yields to its partner) never reaches
        the member (found by the soak: a record whose write failed reached
        one member, and its writer's retry, at a new number, another).
        """
        journal = self.held_while_read_live(mlm.StreamConsume("s", "", "m1", "g"), "a", "b")
        journal.replica_acked(journal.handed)
        self.assertEqual(records(self.h.take(R2)), [(1, "a"), (2, "b")])
        self.append_reported("k2", "c")
        journal.withhold("this broker yielded to its pair's partner")
        self.h.settle()
        self.assertEqual(records(self.h.take(R2)), [])

    def held_while_read_live(self, consume: mlm.StreamConsume, *subjects: str) -> Journal:
        """
        A live reader (R) and C{consume} (R2) on stream C{s}; the journal
        holds each batch for a pair's partner; C{subjects} appended (one
        batch): R has them, R2 nothing. The journal.
        """
        journal = self.h.journal
        assert journal is not None
        self.h.open(R, "local", version=2)
        self.h.command(R, mlm.StreamRead("s", ""))
        self.h.open(R2, "", version=2)
        self.h.command(R2, consume)
        self.writer()
        self.h.settle()  # every batch so far reported (the consumer's position's)
        journal.hold_for_replica(True)
        self.append_reported("k1", *subjects)
        live = [mlm.decode(frames) for frames in self.h.sent.pop(R, [])]
        self.assertEqual(records(live), list(enumerate(subjects, 1)))
        self.assertEqual(self.h.sent.get(R2, []), [])
        return journal

    def append_reported(self, key: str, *subjects: str) -> None:
        """L{append}, and wait until the journal's writer reported its batch."""
        journal = self.h.journal
        assert journal is not None
        reported = len(journal.commit_latencies)
        self.append(key, *subjects)  # one operation: one batch
        self.h.clock.run_thread_calls(lambda: len(journal.commit_latencies) > reported)

    def append(self, key: str, *subjects: str) -> None:
        """An idempotent append of C{subjects} by the writer: one journal operation."""
        data = chunks.encode_append([(subject, [subject.encode()]) for subject in subjects])
        self.h.send(W, mlm.StreamAppend("s", key, [data]))


class HoleTests(DurableTestCase):
    """A reader crossing numbers no record has (a crash's skip)."""

    journal_config = JournalConfig(prune_interval_s=3600, crash_skip=1000)

    def test_recordsWrittenDuringTheReadNotSkipped(self) -> None:
        """
        A consumer resumes inside the numbers a crash skipped: its read of
        them finds none, and the records written while that read ran come
        next, not skipped with the hole.
        """
        self.writer()
        self.write("a", "b", "c")
        self.h.open(R, "reader", version=2)
        self.h.command(R, mlm.StreamConsume("s", "", "c", "", mlm.RESUME))
        self.h.command(R, mlm.StreamCommit("s", 3))
        self.h.close()
        mark_crashed(self.path)
        self.h = self.harness()
        self.writer()
        self.h.open(R, "reader", version=2)
        # The read from 4 is asked for now; the writes go to the writer on
        # the clock's next turn, after it.
        self.h.send(R, mlm.StreamConsume("s", "", "c", "", mlm.RESUME))
        self.write("d", "e")
        got = [m for m in self.h.take(R) if isinstance(m, mlm.StreamRecord)]
        self.assertEqual([(m.sequence, m.subject) for m in got], [(1004, "d"), (1005, "e")])


class FailedBatchTests(DurableTestCase):
    """Records numbered in a batch the full disk refused, and a durable reader."""

    skip = skip_slow

    def setUp(self) -> None:
        self.mount = Path(self.mktemp()).resolve()
        # Registered first, so it is unmounted after the journal's own close.
        mount_tmpfs(self, self.mount, "2m")
        self.path = self.mount / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())

    def test_failedRecordsNeverReachADurableReader(self) -> None:
        """
        A durable consumer's read starts while records are still being
        written (they are in the journal's memory, not on disk); their batch
        fails on the full disk before the read's answer is delivered: the
        consumer is never sent them (they were never written; found by the
        soak: a peer broker, a durable reader, copied records of an append
        its origin had refused, and the retry's records too).
        """
        self.writer()
        self.write(*(f"ok{n}" for n in range(5)))
        self.h.open(R, "consumer", version=2)
        filler = self.mount / "filler"
        fill_disk(filler)
        self.h.send(W, mlm.StreamSend("lost", [bytes(65536)]))
        # The batch goes to the writer, which fails it; the reactor has not
        # heard yet (the answer waits in the clock's queue).
        clock = self.h.clock
        clock.advance(0)
        deadline = time.monotonic() + 30
        while clock.waiting_calls() == 0:
            self.assertLess(time.monotonic(), deadline, "the writer never answered")
            time.sleep(0.01)
        self.h.send(R, mlm.StreamConsume("s", "", "c1", "", mlm.EARLIEST, 0))
        got = records(self.h.take(R))
        filler.unlink()
        self.assertEqual([subject for _, subject in got], [f"ok{n}" for n in range(5)])
