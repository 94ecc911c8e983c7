"""
Tests for L{malamute_pack.client.commits}: a commit is settled by the
answer that covers it, a refusal settles its own commit with the error,
commits are sent again after the broker forgot us, and closing fails them.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.commits import Commits
from malamute_pack.client.errors import ClientClosedError, ClientError, MalamuteError
from malamute_pack.protocol import mlm


class CommitsTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[mlm.Message] = []
        self.commits = Commits(lambda frames: self.sent.append(mlm.decode(frames)))
        self.settled: list[tuple[str, int | ClientError]] = []

    def commit(self, name: str, stream: str, sequence: int) -> None:
        self.commits.commit(stream, sequence, lambda result: self.settled.append((name, result)))

    def test_positionSettlesEveryCommitUpToIt(self) -> None:
        """A durable position settles the commits of that stream up to it, not the others."""
        self.commit("a", "s", 3)
        self.commit("b", "t", 4)
        self.commit("c", "s", 5)
        self.commit("d", "s", 9)
        self.assertEqual(len(self.sent), 4)
        self.commits.committed(mlm.StreamCommitted("s", 5))
        self.assertEqual(self.settled, [("a", 5), ("c", 5)])
        self.assertEqual(len(self.commits), 2)

    def test_refusalSettlesItsCommit(self) -> None:
        """A refusal fails the commit of that stream and sequence with the broker's reason."""
        self.commit("a", "s", 3)
        self.commit("b", "s", 7)
        self.commits.committed(mlm.StreamCommitted("s", 7, 300, "consumer taken over"))
        [(name, error)] = self.settled
        self.assertEqual(name, "b")
        assert isinstance(error, MalamuteError)
        self.assertEqual((error.code, error.reason), (300, "consumer taken over"))

    def test_resendAfterReconnection(self) -> None:
        """Commits not answered go again, in order, when the broker forgot us."""
        self.commit("a", "s", 3)
        self.commit("b", "t", 4)
        self.commits.committed(mlm.StreamCommitted("s", 3))
        self.sent.clear()
        self.commits.resend()
        self.assertEqual(self.sent, [mlm.StreamCommit("t", 4)])

    def test_dropAllFails(self) -> None:
        """Closing fails every commit still waiting."""
        self.commit("a", "s", 3)
        error = ClientClosedError("closed")
        self.commits.drop_all(error)
        self.assertEqual(self.settled, [("a", error)])
        self.assertEqual(len(self.commits), 0)
