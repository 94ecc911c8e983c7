"""
Tests for the post office's timers: deadlines of letters sent with a
timeout (one deadline per letter across hand-over and requeue) and leases
of service requests a worker holds without answering.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness

S, M, M2, W1, W2 = b"sender", b"mailbox", b"mailbox-2", b"worker-1", b"worker-2"


def confirms(messages: list[mlm.Message]) -> list[tuple[str, int]]:
    return [(m.tracker, m.status_code) for m in messages if isinstance(m, mlm.Confirm)]


class DeadlineTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness(BrokerConfig(timeout=600.0))
        self.addCleanup(self.h.close)

    def test_requeuedLetterExpiresOnce(self) -> None:
        """
        A letter with a timeout, taken by a version 2 recipient that leaves
        without DONE, goes back to its mailbox and expires once at its
        deadline; a later letter to that mailbox expires too, and both
        senders hear (the requeue used to put the letter in the deadline
        heap twice, and the second expiry broke every later one).
        """
        h = self.h
        h.open(S, "sender")
        h.open(M, "mailbox", version=2)
        h.send(S, mlm.MailboxSend("mailbox", "first", "t1", 1000, [b"1"]))
        self.assertEqual(len(h.take(M)), 1)
        h.send(M, mlm.ConnectionClose())
        self.assertEqual(h.broker.post.requeued, 1)
        h.clock.advance(0.5)
        h.send(S, mlm.MailboxSend("mailbox", "second", "t2", 1000, [b"2"]))
        h.clock.advance(0.6)
        self.assertEqual(confirms(h.take(S)), [("t1", mlm.FAILED)])
        h.clock.advance(0.5)
        self.assertEqual(confirms(h.take(S)), [("t2", mlm.FAILED)])
        self.assertEqual(h.broker.post.expired, 2)
        self.assertEqual(len(h.broker.post.mailboxes["mailbox"]), 0)
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_deliveredBeforeDeadlineDoesNotExpire(self) -> None:
        """A letter answered before its deadline never expires."""
        h = self.h
        h.open(S, "sender")
        h.open(M, "mailbox", version=2)
        h.send(S, mlm.MailboxSend("mailbox", "hi", "t", 1000, [b"1"]))
        [record] = h.take(M)
        assert isinstance(record, mlm.MailboxRecord)
        h.send(M, mlm.Done(record.id))
        h.clock.advance(2.0)
        self.assertEqual(confirms(h.take(S)), [("t", mlm.SUCCESS)])
        self.assertEqual(h.broker.post.expired, 0)


class LeaseTests(SynchronousTestCase):
    def harness(self, lease: int) -> BrokerHarness:
        h = BrokerHarness(BrokerConfig(timeout=600.0, limits=Limits(service_lease=lease)))
        self.addCleanup(h.close)
        for worker in (W1, W2):
            h.open(worker, worker.decode(), version=2)
            h.command(worker, mlm.ServiceOffer("echo", ""))
        h.open(S, "sender")
        return h

    def test_leaseGivesTheRequestBack(self) -> None:
        """
        A worker that holds a service request without answering past the
        lease loses it: it goes back to the queue and to another worker;
        the first worker's late DONE is refused (counted).
        """
        h = self.harness(lease=5)
        h.send(S, mlm.ServiceSend("echo", "job", "t", 0, [b"x"]))
        [first] = h.take(W1)
        assert isinstance(first, mlm.ServiceRecord)
        h.clock.advance(4.9)
        self.assertEqual(h.take(W2), [])
        h.clock.advance(0.2)
        [second] = h.take(W2)
        assert isinstance(second, mlm.ServiceRecord)
        self.assertEqual((second.id, second.subject), (first.id, "job"))
        self.assertEqual(h.broker.post.leases_ended, 1)
        h.send(W1, mlm.Done(first.id))
        self.assertEqual(h.broker.counters.by_reason.get("unknown letter"), 1)
        h.send(W2, mlm.Done(second.id))
        self.assertEqual(confirms(h.take(S)), [("t", mlm.SUCCESS)])

    def test_answeredWithinTheLease(self) -> None:
        """A request answered within its lease stays answered; nothing comes back."""
        h = self.harness(lease=5)
        h.send(S, mlm.ServiceSend("echo", "job", "", 0, [b"x"]))
        [record] = h.take(W1)
        assert isinstance(record, mlm.ServiceRecord)
        h.send(W1, mlm.Done(record.id))
        h.clock.advance(10)
        self.assertEqual((h.take(W2), h.broker.post.leases_ended), ([], 0))

    def test_noLeaseByDefault(self) -> None:
        """Without a lease a worker holds a request until it answers or is lost."""
        h = self.harness(lease=0)
        h.send(S, mlm.ServiceSend("echo", "job", "", 0, [b"x"]))
        self.assertEqual(len(h.take(W1)), 1)
        h.clock.advance(500)  # long, but short of the broker's heartbeat timeout
        self.assertEqual(h.take(W2), [])
