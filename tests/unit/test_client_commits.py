"""
Tests for L{malamute_pack.client.commits}: each answer settles the oldest
commit of its stream on the wire (OK with the broker's position, clamped
past the stream's end; a refusal with the error), a commit not answered by
its deadline fails (and its late answer settles nothing else), commits
wait for a usable connection and are sent again after the broker forgot
us, and closing fails them.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.commits import Commits
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
)
from malamute_pack.protocol import mlm

TIMEOUT = 30.0


class CommitsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.sent: list[mlm.Message] = []
        self.commits = Commits(
            lambda frames: self.sent.append(mlm.decode(frames)), self.clock, TIMEOUT
        )
        self.settled: list[tuple[str, int | ClientError]] = []

    def commit(self, name: str, stream: str, sequence: int, usable: bool = True) -> None:
        self.commits.commit(
            stream, sequence, lambda result: self.settled.append((name, result)), usable
        )

    def advance(self, seconds: float) -> None:
        """Move time on and run the deadlines that are due, as the core does."""
        self.clock.advance(seconds)
        self.commits.on_time(self.clock.seconds())

    def test_answersSettleInOrderPerStream(self) -> None:
        """
        Each OK settles the oldest commit of its stream with the position it
        carries, whatever the other streams' commits between.
        """
        self.commit("a", "s", 3)
        self.commit("b", "t", 4)
        self.commit("c", "s", 5)
        self.commit("d", "s", 9)
        self.assertEqual(
            self.sent,
            [
                mlm.StreamCommit("s", 3),
                mlm.StreamCommit("t", 4),
                mlm.StreamCommit("s", 5),
                mlm.StreamCommit("s", 9),
            ],
        )
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.assertEqual(self.settled, [("a", 3)])
        self.commits.committed(mlm.StreamCommitted("s", 5))
        self.commits.committed(mlm.StreamCommitted("t", 4))
        self.assertEqual(self.settled, [("a", 3), ("c", 5), ("b", 4)])
        self.assertEqual(len(self.commits), 1)
        self.commits.committed(mlm.StreamCommitted("s", 9))
        self.assertEqual(self.settled[-1], ("d", 9))
        self.assertEqual(len(self.commits), 0)

    def test_pastTheEndSettlesWithClampedPosition(self) -> None:
        """
        A commit past the stream's last record, which the broker clamps to
        it, is settled by that answer, with the broker's (lower) position.
        """
        self.commit("a", "s", 99)
        self.commits.committed(mlm.StreamCommitted("s", 5))
        self.assertEqual(self.settled, [("a", 5)])
        self.assertEqual(len(self.commits), 0)

    def test_answerAboveTheCommit(self) -> None:
        """
        A commit below the consumer's position is answered with that
        position: it settles that commit, not the next one of the stream.
        """
        self.commit("a", "s", 2)
        self.commit("b", "s", 8)
        self.commits.committed(mlm.StreamCommitted("s", 6))
        self.assertEqual(self.settled, [("a", 6)])
        self.commits.committed(mlm.StreamCommitted("s", 8))
        self.assertEqual(self.settled, [("a", 6), ("b", 8)])

    def test_refusalSettlesItsCommit(self) -> None:
        """A refusal fails the commit of that stream and sequence with the broker's reason."""
        self.commit("a", "s", 3)
        self.commit("b", "s", 7)
        self.commits.committed(mlm.StreamCommitted("s", 7, 300, "consumer taken over"))
        [(name, error)] = self.settled
        self.assertEqual(name, "b")
        assert isinstance(error, MalamuteError)
        self.assertEqual((error.code, error.reason), (300, "consumer taken over"))
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.assertEqual(self.settled[-1], ("a", 3))

    def test_refusalOfAnotherSequence(self) -> None:
        """A refusal whose sequence no commit of the stream has fails the oldest of the stream."""
        self.commit("a", "t", 1)
        self.commit("b", "s", 3)
        self.commit("c", "s", 7)
        self.commits.committed(mlm.StreamCommitted("s", 0, 300, "not a consumer of stream 's'"))
        [(name, error)] = self.settled
        self.assertEqual(name, "b")
        self.assertIsInstance(error, MalamuteError)

    def test_notDeliveredToMember(self) -> None:
        """
        A group member's commit of a record it was never sent, refused 300
        "not delivered to this member", fails with that MalamuteError.
        """
        self.commit("a", "s", 42)
        self.commits.committed(mlm.StreamCommitted("s", 42, 300, "not delivered to this member"))
        [(name, error)] = self.settled
        self.assertEqual(name, "a")
        assert isinstance(error, MalamuteError)
        self.assertEqual((error.code, error.reason), (300, "not delivered to this member"))
        self.assertEqual(len(self.commits), 0)

    def test_strayAnswerIgnored(self) -> None:
        """An answer for a stream with no commit on the wire settles nothing."""
        self.commit("a", "s", 3)
        self.commits.committed(mlm.StreamCommitted("t", 3))
        self.assertEqual(self.settled, [])
        self.assertEqual(len(self.commits), 1)

    def test_deadline(self) -> None:
        """
        A commit not answered within the timeout fails with
        BrokerUnreachableError, at its deadline and not before.
        """
        self.commit("a", "s", 3)
        self.clock.advance(10)
        self.commit("b", "t", 4)
        self.assertEqual(self.commits.wakeup_at(), TIMEOUT)
        self.advance(TIMEOUT - 10 - 0.001)
        self.assertEqual(self.settled, [])
        self.advance(0.001)
        [(name, error)] = self.settled
        self.assertEqual(name, "a")
        self.assertIsInstance(error, BrokerUnreachableError)
        self.assertIn("'s' up to 3 within 30s", str(error))
        self.assertEqual(len(self.commits), 1)
        self.assertEqual(self.commits.wakeup_at(), TIMEOUT + 10)
        self.advance(10)
        self.assertEqual([name for name, _ in self.settled], ["a", "b"])
        self.assertIsNone(self.commits.wakeup_at())

    def test_answeredBeforeDeadline(self) -> None:
        """A commit answered in time is not failed at its deadline."""
        self.commit("a", "s", 3)
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.assertIsNone(self.commits.wakeup_at())
        self.advance(TIMEOUT)
        self.assertEqual(self.settled, [("a", 3)])

    def test_lateAnswerSettlesNothingElse(self) -> None:
        """
        The answer to a commit that already failed at its deadline is its
        own: the next commit of the stream waits for the next answer.
        """
        self.commit("a", "s", 3)
        self.advance(TIMEOUT)
        self.commit("b", "s", 5)
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.assertEqual([name for name, _ in self.settled], ["a"])
        self.commits.committed(mlm.StreamCommitted("s", 5))
        self.assertEqual(self.settled[-1], ("b", 5))

    def test_heldUntilUsable(self) -> None:
        """A commit made while the connection is not usable goes when it is (flush)."""
        self.commit("a", "s", 3, usable=False)
        self.assertEqual(self.sent, [])
        self.commits.committed(mlm.StreamCommitted("s", 3))  # not for it: it was not sent
        self.assertEqual(self.settled, [])
        self.commits.flush()
        self.assertEqual(self.sent, [mlm.StreamCommit("s", 3)])
        self.commits.flush()
        self.assertEqual(len(self.sent), 1)
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.assertEqual(self.settled, [("a", 3)])

    def test_resendAfterReconnection(self) -> None:
        """
        When the broker forgot us, the commits not answered go again once
        the connection is usable, in the order made; a late answer of the
        forgotten connection that comes before is dropped.
        """
        self.commit("a", "s", 3)
        self.commit("b", "t", 4)
        self.commit("c", "s", 5)
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.sent.clear()
        self.commits.resend()
        self.assertEqual(self.sent, [])
        self.commits.committed(mlm.StreamCommitted("t", 4))  # late: dropped
        self.assertEqual(self.settled, [("a", 3)])
        self.commits.flush()
        self.assertEqual(self.sent, [mlm.StreamCommit("t", 4), mlm.StreamCommit("s", 5)])
        self.commits.committed(mlm.StreamCommitted("s", 5))
        self.commits.committed(mlm.StreamCommitted("t", 4))
        self.assertEqual(self.settled, [("a", 3), ("c", 5), ("b", 4)])

    def test_deadlineNotRestartedOnResend(self) -> None:
        """
        A commit sent again after a reconnection keeps the deadline of its
        call; one past its deadline is not sent again.
        """
        self.commit("a", "s", 3)
        self.advance(20)
        self.commit("b", "s", 4)
        self.commits.resend()
        self.commits.flush()
        self.advance(10)
        self.assertEqual([name for name, _ in self.settled], ["a"])
        self.sent.clear()
        self.commits.resend()
        self.commits.flush()
        self.assertEqual(self.sent, [mlm.StreamCommit("s", 4)])
        self.commits.committed(mlm.StreamCommitted("s", 4))
        self.assertEqual(self.settled[-1], ("b", 4))

    def test_dropAllFails(self) -> None:
        """Closing fails every commit still waiting, sent or not, and no deadline is left."""
        self.commit("a", "s", 3)
        self.commit("b", "s", 4, usable=False)
        error = ClientClosedError("closed")
        self.commits.drop_all(error)
        self.assertEqual(self.settled, [("a", error), ("b", error)])
        self.assertEqual(len(self.commits), 0)
        self.assertIsNone(self.commits.wakeup_at())
