"""
Tests for durable named readers (L{malamute_pack.broker.consumers}) on a
real journal: a consumer resumes after its last commit, across connections
and broker restarts; resets; takeover; commits answered once durable and
never moving back; refusals; forgetting by age and by count.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness
from tests.memory_session import InMemorySession, Said

W, C1, C2 = b"writer", b"consumer-1", b"consumer-2"


def seqs(messages: list[mlm.Message]) -> list[int]:
    """The sequence numbers of the STREAM_RECORDs in C{messages}."""
    return [m.sequence for m in messages if isinstance(m, mlm.StreamRecord)]


def committed(messages: list[mlm.Message]) -> list[tuple[int, int, str]]:
    """(sequence, code, reason) of the STREAM_COMMITTEDs in C{messages}."""
    return [
        (m.sequence, m.status_code, m.status_reason)
        for m in messages
        if isinstance(m, mlm.StreamCommitted)
    ]


class ConsumerTestCase(SynchronousTestCase):
    """A broker journaling to a fresh SQLite file, restartable, with ten records on "s"."""

    limits = Limits()

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())
        self.h.open(W, "writer", version=2)
        self.h.command(W, mlm.StreamWrite("s"))
        self.write(10)

    def harness(self) -> BrokerHarness:
        config = BrokerConfig(timeout=60.0, limits=self.limits)
        return BrokerHarness(config, self.path, JournalConfig(prune_interval_s=3600))

    def restart(self) -> None:
        self.h.close()
        self.h = self.harness()
        self.h.open(W, "writer", version=2)
        self.h.command(W, mlm.StreamWrite("s"))

    def write(self, count: int) -> None:
        for n in range(count):
            self.h.send(W, mlm.StreamSend(f"t{n % 3}", [b"x"]))

    def consume(
        self, route: bytes, name: str = "c1", whence: int = mlm.RESUME, position: int = 0
    ) -> list[mlm.Message]:
        self.h.open(route, "", version=2)
        return self.h.command(route, mlm.StreamConsume("s", "", name, "", whence, position))


class ResumeTests(ConsumerTestCase):
    def test_newConsumerStartsAtEarliest(self) -> None:
        """A consumer the broker does not know reads from the earliest record, then live."""
        got = self.consume(C1)
        self.assertEqual(got[0], mlm.Ok())
        self.assertEqual(seqs(got), list(range(1, 11)))
        self.write(2)
        self.assertEqual(seqs(self.h.take(C1)), [11, 12])

    def test_resumesAfterCommitOnAnotherConnection(self) -> None:
        """
        A consumer that committed 4 and comes back on a new connection gets
        5 onwards: nothing missed, the uncommitted records seen again.
        """
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 4))
        self.assertEqual(committed(self.h.take(C1)), [(4, 200, "")])
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2)), list(range(5, 11)))

    def test_resumesAfterRestart(self) -> None:
        """A committed position survives a broker restart (it is in the journal)."""
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 7))
        self.h.take(C1)
        self.restart()
        self.write(1)
        self.assertEqual(seqs(self.consume(C2)), [8, 9, 10, 11])

    def test_commitNeverMovesBack(self) -> None:
        """A commit below the position keeps the position (and says which)."""
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 6))
        self.h.send(C1, mlm.StreamCommit("s", 3))
        self.assertEqual(committed(self.h.take(C1)), [(6, 200, ""), (6, 200, "")])

    def test_commitPastTheLastRefused(self) -> None:
        """
        A commit past the stream's last record (a number it never gave) is
        refused (300, saying so, at once: a refusal names its sequence, so
        it may pass answers still waiting for the disk) and moves nothing:
        the next consumer resumes where the last commit it acknowledged
        left it.
        """
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 3))
        self.h.send(C1, mlm.StreamCommit("s", 1000))
        answers = committed(self.h.take(C1))
        self.assertEqual([(seq, code) for seq, code, _ in answers], [(1000, 300), (3, 200)])
        self.assertIn("past the last record", answers[0][2])
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2)), list(range(4, 11)))

    def test_staleCommitAfterTheNumberingStartedAgain(self) -> None:
        """
        A commit sent again after a reconnection, numbered by the journal
        its client read before (since started afresh: its numbers are past
        this stream's), is refused even after the records of the new
        numbering were sent to the connection; the consumer's position does
        not pass over them, and a commit in the new numbering is
        acknowledged (found by the soak: the stale commit was clamped to
        the records just sent, and the client was then handed records at or
        below the position it was told).
        """
        session = InMemorySession("again")
        self.h.broker.receive(session, mlm.ConnectionOpen(version=2))
        self.h.broker.receive(session, mlm.StreamConsume("s", "", "c1", "", mlm.RESUME, 18042014))
        self.h.settle()
        self.assertEqual([r.seq for r in session.records], list(range(1, 11)))
        self.h.broker.receive(session, mlm.StreamCommit("s", 18042013))
        self.h.broker.receive(session, mlm.StreamCommit("s", 1))
        self.h.settle()
        answers = [said.values[:3] for said in session.said if said.what == "committed"]
        self.assertEqual(answers, [("s", 18042013, 300), ("s", 1, 200)])
        self.h.broker.receive(session, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2)), list(range(2, 11)))

    def test_commitClampedToWhatItWasSent(self) -> None:
        """
        A reader's commit of a record of the stream its connection was not
        sent yet is clamped to the last record it was sent: it passes over
        nothing it never had, and the records after its position still
        come.
        """
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 4))
        self.h.take(C1)
        self.h.send(C1, mlm.ConnectionClose())
        session = InMemorySession("again")
        self.h.broker.receive(session, mlm.ConnectionOpen(version=2))
        self.h.broker.receive(session, mlm.StreamConsume("s", "", "c1", "", mlm.RESUME, 0))
        self.h.broker.receive(session, mlm.StreamCommit("s", 9))
        self.h.settle()
        answers = [said.values for said in session.said if said.what == "committed"]
        self.assertEqual(answers, [("s", 4, 200, "")])
        self.assertEqual([r.seq for r in session.records], list(range(5, 11)))

    def test_patternFilters(self) -> None:
        """A consumer gets only the records its pattern matches."""
        self.h.open(C1, "", version=2)
        got = self.h.command(C1, mlm.StreamConsume("s", "t0", "c1", "", mlm.RESUME, 0))
        self.assertEqual(seqs(got), [1, 4, 7, 10])

    def test_resumePastTheNumberingToldSo(self) -> None:
        """
        A consumer the broker does not know, resuming with the number after
        the last record its client was handed past the stream's last number
        (its position is from a journal since made afresh), is told so by a
        STREAM_GAP whose available (the first record) is below its missed,
        then reads from the first record; one that resumes within the
        numbering is told nothing. (The gap comes before the OK: nothing of
        the stream comes before it.)
        """
        got = self.consume(C1, position=5000)
        self.assertEqual(got[:2], [mlm.StreamGap("s", 5000, 1), mlm.Ok()])  # the gap first
        gaps = [(m.missed, m.available) for m in got if isinstance(m, mlm.StreamGap)]
        self.assertEqual((gaps, seqs(got)), ([(5000, 1)], list(range(1, 11))))
        got = self.consume(C2, name="c2", position=11)
        self.assertEqual([m for m in got if isinstance(m, mlm.StreamGap)], [])
        self.assertEqual(seqs(got), list(range(1, 11)))

    def test_readerResumePastTheNumberingToldSo(self) -> None:
        """
        STREAM_READ_FROM with whence 5 (resume) reads from the position,
        as whence 2 does; past the stream's last number + 1 (a journal made
        afresh numbers it again) the reader is told so by a STREAM_GAP
        whose available is below its missed, and reads from the first record.
        """
        self.h.open(C1, "", version=2)
        got = self.h.command(C1, mlm.StreamReadFrom("s", "", mlm.RESUME, 7))
        self.assertEqual((got[0], seqs(got)), (mlm.Ok(), [7, 8, 9, 10]))
        self.h.open(C2, "", version=2)
        got = self.h.command(C2, mlm.StreamReadFrom("s", "", mlm.RESUME, 900))
        gaps = [(m.missed, m.available) for m in got if isinstance(m, mlm.StreamGap)]
        self.assertEqual((gaps, seqs(got)), ([(900, 1)], list(range(1, 11))))


class ResetTests(ConsumerTestCase):
    def test_latest(self) -> None:
        """Reset to latest: nothing old now, and a later resume starts after it."""
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 2))
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2, whence=mlm.LATEST)), [])
        self.h.send(C2, mlm.ConnectionClose())
        self.write(1)
        self.assertEqual(seqs(self.consume(C1)), [11])

    def test_sequence(self) -> None:
        """Reset to a sequence number: read from there, and resume from there later."""
        self.assertEqual(seqs(self.consume(C1, whence=mlm.SEQUENCE, position=8)), [8, 9, 10])
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2)), [8, 9, 10])

    def test_earliest(self) -> None:
        """Reset to earliest after a commit: everything again."""
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 9))
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2, whence=mlm.EARLIEST)), list(range(1, 11)))

    def test_time(self) -> None:
        """Reset to a time: from the first record at or after it, and resumed from there."""
        self.h.clock.advance(30)
        self.write(2)
        got = self.consume(C1, whence=mlm.TIME, position=30_000)
        self.assertEqual(seqs(got), [11, 12])
        self.h.send(C1, mlm.ConnectionClose())
        self.assertEqual(seqs(self.consume(C2)), [11, 12])


class TakeoverTests(ConsumerTestCase):
    def test_secondConnectionTakesOver(self) -> None:
        """
        A second connection consuming under the same name takes the
        consumer: the first gets no more records, and its commit is refused.
        """
        self.consume(C1)
        self.consume(C2)
        self.write(1)
        self.assertEqual(seqs(self.h.take(C1)), [])
        self.assertEqual(seqs(self.h.take(C2)), [11])
        self.h.send(C1, mlm.StreamCommit("s", 5))
        self.assertEqual(
            committed(self.h.take(C1)), [(5, 300, "consumer taken over by another connection")]
        )
        self.assertEqual(self.h.broker.consumers.takeovers, 1)

    def test_otherNameOnSameStreamRefused(self) -> None:
        """A connection consumes a stream under one name only."""
        self.consume(C1)
        got = self.h.command(C1, mlm.StreamConsume("s", "", "c2", "", mlm.RESUME, 0))
        self.assertEqual(
            [(m.status_code, m.status_reason) for m in got if isinstance(m, mlm.Error)],
            [(300, "already consuming stream 's' as 'c1'")],
        )


class RefusalTests(ConsumerTestCase):
    def test_commitWithoutConsuming(self) -> None:
        """A commit from a connection that does not consume the stream gets 300."""
        self.h.open(C1, "", version=2)
        self.h.send(C1, mlm.StreamCommit("s", 5))
        self.assertEqual(committed(self.h.take(C1)), [(5, 300, "not a consumer of stream 's'")])

    def test_emptyNameRefused(self) -> None:
        """A consumer needs a name."""
        got = self.consume(C1, name="")
        self.assertIsInstance(got[0], mlm.Error)
        assert isinstance(got[0], mlm.Error)
        self.assertEqual(got[0].status_reason, "invalid consumer name: it is empty")

    def test_version1Refused(self) -> None:
        """A version 1 connection cannot consume: ERROR 500."""
        self.h.open(C1, "")
        got = self.h.command(C1, mlm.StreamConsume("s", "", "c1", "", mlm.RESUME, 0))
        assert isinstance(got[0], mlm.Error)
        self.assertEqual(got[0].status_code, mlm.COMMAND_INVALID)

    def test_lastValuesRefused(self) -> None:
        """A consumer cannot start from last values (that is a snapshot, not a position)."""
        got = self.consume(C1, whence=mlm.LAST_VALUES)
        self.assertIsInstance(got[0], mlm.Error)


class NoJournalTests(SynchronousTestCase):
    def test_notImplemented(self) -> None:
        """Without a journal, STREAM_CONSUME gets ERROR 501."""
        h = BrokerHarness()
        self.addCleanup(h.close)
        h.open(C1, "", version=2)
        got = h.command(C1, mlm.StreamConsume("s", "", "c1", "", mlm.RESUME, 0))
        assert isinstance(got[0], mlm.Error)
        self.assertEqual(got[0].status_code, mlm.NOT_IMPLEMENTED)


class ForgettingTests(ConsumerTestCase):
    limits = Limits(consumers=2, consumer_ttl=100)

    def test_newNamePastTheLimitRefused(self) -> None:
        """
        With room for two, a third consumer is refused (300, naming the
        limit) and neither of the two is forgotten, across a restart too.
        """
        for name in ("a", "b"):
            self.consume(C1, name=name)
            self.h.send(C1, mlm.StreamCancel("s"))
            self.h.take(C1)
            self.h.clock.advance(1)
        got = self.h.command(C1, mlm.StreamConsume("s", "", "c", ""))
        assert isinstance(got[0], mlm.Error)
        self.assertEqual(got[0].status_code, 300)
        self.assertIn("malamute/limits/consumers", got[0].status_reason)
        consumers = self.h.broker.consumers
        self.assertEqual((len(consumers), consumers.forgotten, consumers.refused_names), (2, 0, 1))
        self.h.settle()
        self.restart()
        self.assertIsNotNone(self.h.broker.consumers.position("s", "a"))
        self.assertIsNone(self.h.broker.consumers.position("s", "c"))

    def test_unusedForgottenAfterTtl(self) -> None:
        """A consumer nobody holds, unused for longer than the TTL, is forgotten."""
        self.consume(C1)
        self.h.send(C1, mlm.StreamCommit("s", 3))
        self.h.send(C1, mlm.ConnectionClose())
        self.h.take(C1)
        self.h.clock.advance(90)
        self.h.broker.expire_silent()
        self.assertIsNotNone(self.h.broker.consumers.position("s", "c1"))
        self.h.clock.advance(20)
        self.h.broker.expire_silent()
        self.assertIsNone(self.h.broker.consumers.position("s", "c1"))
        self.h.settle()
        self.restart()
        self.assertIsNone(self.h.broker.consumers.position("s", "c1"))

    def test_heldNotForgottenByTtl(self) -> None:
        """A consumer a connection holds is kept, however old its last commit."""
        self.consume(C1)
        for _ in range(4):
            self.h.clock.advance(50)
            self.h.send(C1, mlm.ConnectionPing())
            self.h.broker.expire_silent()
        self.assertIsNotNone(self.h.broker.consumers.position("s", "c1"))


class OwnershipTests(ConsumerTestCase):
    """A consumer or group made by an authenticated user is that user's alone."""

    def answer(self, user: str | None, message: mlm.StreamConsume) -> Said:
        """What a new session of C{user} is answered when it sends C{message}."""
        session = InMemorySession(f"{user}-{len(self.sessions)}", user=user)
        self.sessions.append(session)
        self.h.broker.receive(session, mlm.ConnectionOpen(version=2))
        session.said.clear()
        self.h.broker.receive(session, message)
        self.h.settle()
        return next(said for said in session.said if said.what in ("ok", "error"))

    def setUp(self) -> None:
        super().setUp()
        self.sessions: list[InMemorySession] = []

    def test_otherUsersRefused(self) -> None:
        """
        Alice's consumer: bob and an unauthenticated client get ERROR 403;
        alice on a new connection gets it.
        """
        consume = mlm.StreamConsume("s", "", "c1", "")
        self.assertEqual(self.answer("alice", consume), Said("ok"))
        for user in ("bob", None):
            said = self.answer(user, consume)
            self.assertEqual(
                said,
                Said(
                    "error",
                    (403, "not allowed: consumer 'c1' of stream 's' belongs to another user"),
                ),
            )
        self.assertEqual(self.answer("alice", consume), Said("ok"))

    def test_groupOwned(self) -> None:
        """A group made by alice takes no member of bob's, even after a restart."""
        self.assertEqual(self.answer("alice", mlm.StreamConsume("s", "", "m1", "g")), Said("ok"))
        said = self.answer("bob", mlm.StreamConsume("s", "", "m2", "g"))
        self.assertEqual(said.what, "error")
        self.assertEqual(said.values[0], 403)
        for session in self.sessions:
            self.h.broker.receive(session, mlm.ConnectionClose())
        self.h.settle()
        self.restart()
        said = self.answer("bob", mlm.StreamConsume("s", "", "m2", "g"))
        self.assertEqual((said.what, said.values[0]), ("error", 403))

    def test_anonymousConsumerOpenToAll(self) -> None:
        """A consumer made without a user belongs to nobody: anyone may use it."""
        consume = mlm.StreamConsume("s", "", "c1", "")
        self.assertEqual(self.answer(None, consume), Said("ok"))
        self.assertEqual(self.answer("bob", consume), Said("ok"))


class QuotaTests(ConsumerTestCase):
    """Names per user and per connection: a flood is refused, and evicts nobody."""

    limits = Limits(consumers=6, consumers_per_user=3, consumers_per_connection=4)

    def setUp(self) -> None:
        super().setUp()
        self.sessions: dict[str, InMemorySession] = {}

    def session(self, label: str, user: str | None) -> InMemorySession:
        """A connection of C{user}, opened once under C{label}."""
        session = self.sessions.get(label)
        if session is None:
            session = self.sessions[label] = InMemorySession(label, user=user)
            self.h.broker.receive(session, mlm.ConnectionOpen(version=2))
        return session

    def consume_as(self, label: str, user: str | None, name: str, group: str = "") -> Said:
        """C{label}'s answer to consuming "s" as C{name} (then it stops reading "s")."""
        session = self.session(label, user)
        session.said.clear()
        self.h.broker.receive(session, mlm.StreamConsume("s", "", name, group))
        self.h.settle()
        said = next(said for said in session.said if said.what in ("ok", "error"))
        self.h.broker.receive(session, mlm.StreamCancel("s"))
        return said

    def test_otherUsersNamesNeverEvicted(self) -> None:
        """
        Alice's consumer and group survive bob's flood of names (refused past
        his share): bob can neither open nor join them afterwards.
        """
        self.assertEqual(self.consume_as("alice", "alice", "mine"), Said("ok"))
        self.assertEqual(self.consume_as("alice", "alice", "m1", group="g"), Said("ok"))
        answers = [self.consume_as("bob", "bob", f"flood{n}") for n in range(5)]
        self.assertEqual([a.what for a in answers], ["ok"] * 3 + ["error"] * 2)
        self.assertIn("consumers-per-user", str(answers[3].values[1]))
        self.assertEqual(self.h.broker.consumers.forgotten, 0)
        for name, group in (("mine", ""), ("m2", "g")):
            said = self.consume_as("bob2", "bob", name, group)
            self.assertEqual((said.what, said.values[0]), ("error", 403))
        self.assertEqual(self.consume_as("alice", "alice", "mine"), Said("ok"))

    def test_floodKeepsOthersPositions(self) -> None:
        """
        One anonymous client floods names: refused past the limits; another
        anonymous client's committed position is untouched.
        """
        session = self.session("keeper", None)
        self.h.broker.receive(session, mlm.StreamConsume("s", "", "keep", ""))
        self.h.settle()  # it was sent the records it commits
        self.h.broker.receive(session, mlm.StreamCommit("s", 5))
        self.h.settle()
        answers = [self.consume_as("flooder", None, f"flood{n}") for n in range(10)]
        self.assertIn("error", [a.what for a in answers])
        position = self.h.broker.consumers.position("s", "keep")
        assert position is not None
        self.assertEqual(position.seq, 5)

    def test_perConnectionLimit(self) -> None:
        """
        One connection may make so many names in its life; past it, it is
        refused while a new connection of the same user is not.
        """
        limits = Limits(consumers=20, consumers_per_user=20, consumers_per_connection=2)
        self.h.close()
        self.limits = limits
        self.restart()
        answers = [self.consume_as("one", "carol", f"n{n}") for n in range(3)]
        self.assertEqual([a.what for a in answers], ["ok", "ok", "error"])
        self.assertIn("consumers-per-connection", str(answers[2].values[1]))
        self.assertEqual(self.consume_as("one", "carol", "n0"), Said("ok"))  # known: not new
        self.assertEqual(self.consume_as("two", "carol", "n2"), Said("ok"))


class NameTests(ConsumerTestCase):
    def test_nulRefusedInEveryName(self) -> None:
        """
        A NUL in a consumer, group, member or stream name is refused (300):
        the broker's own marks hold one, so such a name could pass for them.
        """
        self.h.open(C1, "", version=2)
        for consume in (
            mlm.StreamConsume("s", "", "\x00group", ""),
            mlm.StreamConsume("s", "", "m\x00", "g"),
            mlm.StreamConsume("s", "", "m", "g\x00"),
            mlm.StreamConsume("s\x00", "", "c", ""),
        ):
            got = self.h.command(C1, consume)
            assert isinstance(got[0], mlm.Error), consume
            self.assertIn("NUL", got[0].status_reason)
        self.assertEqual(len(self.h.broker.consumers), 0)
        got = self.h.command(C2, mlm.ConnectionOpen(version=2, address="a\x00b"))
        assert isinstance(got[0], mlm.Error)
        self.assertIn("NUL", got[0].status_reason)


class ListingTests(ConsumerTestCase):
    def test_groupListedWithItsMembers(self) -> None:
        """The listing shows a group with members as held, naming them; without, as not."""
        for route, member in ((C1, "m1"), (C2, "m2")):
            self.h.open(route, "", version=2)
            self.h.command(route, mlm.StreamConsume("s", "", member, "g"))
        [view] = self.h.broker.consumers.views()
        self.assertEqual((view.kind, view.members), ("group", ("m1", "m2")))
        self.assertIsNotNone(view.holder)
        for route in (C1, C2):
            self.h.send(route, mlm.ConnectionClose())
        [view] = self.h.broker.consumers.views()
        self.assertEqual((view.members, view.holder), ((), None))
