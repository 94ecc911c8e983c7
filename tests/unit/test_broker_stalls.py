"""
Tests for bounded memory in the broker model: a party whose queue is full
(it does not drain) is stalled, not pushed at (L{malamute_pack.broker.stalled}):
a stream reader falls behind onto the journal and catches up in order, with
no journal it misses messages (counted) while others go on; letters wait in
their queue; a service request goes to a worker that drains. And the
letters the whole broker holds are bounded in bytes.
"""

from __future__ import annotations

import gc
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.post_office import LETTER_OVERHEAD
from malamute_pack.journal import JournalConfig
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness

W, R, R2, S, M = b"writer", b"reader", b"reader-2", b"sender", b"mailbox"
RETRY = BrokerConfig().stall_retry


def subjects(messages: list[mlm.Message]) -> list[str]:
    return [getattr(m, "subject", "") for m in messages if hasattr(m, "subject")]


class StreamStallTests(SynchronousTestCase):
    def harness(self, journal: bool) -> BrokerHarness:
        path = Path(self.mktemp()) / "journal.sqlite" if journal else None
        h = BrokerHarness(BrokerConfig(timeout=60.0), path, JournalConfig(prune_interval_s=3600))
        self.addCleanup(h.close)
        h.open(W, "writer")
        h.command(W, mlm.StreamWrite("s"))
        for reader in (R, R2):
            h.open(reader, reader.decode(), version=2)
            h.command(reader, mlm.StreamRead("s", ""))
        return h

    def test_stalledReaderCatchesUpFromTheJournal(self) -> None:
        """
        A reader whose queue is full misses nothing: once it drains, the
        broker delivers what it missed from the journal, in order, then live
        again; the other reader was never held back.
        """
        h = self.harness(journal=True)
        h.full.add(R)
        for n in range(5):
            h.send(W, mlm.StreamSend(f"m{n}", [b"x"]))
        self.assertEqual(subjects(h.take(R2)), [f"m{n}" for n in range(5)])
        self.assertEqual(h.take(R), [])
        self.assertEqual(h.broker.stalled.stalls, 1)
        h.clock.advance(RETRY)  # still full: stalls again
        self.assertEqual(h.take(R), [])
        h.full.clear()
        h.clock.advance(RETRY)
        h.send(W, mlm.StreamSend("m5", [b"x"]))
        got = [m for m in h.take(R) if isinstance(m, mlm.StreamRecord)]
        self.assertEqual(
            [(m.sequence, m.subject) for m in got], [(n + 1, f"m{n}") for n in range(6)]
        )

    def test_noJournalMissesOnlyForTheStalled(self) -> None:
        """
        With no journal, a reader that does not drain misses the messages it
        could not take (counted for it); the other reader gets them all.
        """
        h = self.harness(journal=False)
        h.full.add(R)
        for n in range(3):
            h.send(W, mlm.StreamSend(f"m{n}", [b"x"]))
        h.full.clear()
        h.clock.advance(RETRY)
        h.send(W, mlm.StreamSend("m3", [b"x"]))
        self.assertEqual(subjects(h.take(R)), ["m3"])
        self.assertEqual(subjects(h.take(R2)), ["m0", "m1", "m2", "m3"])
        self.assertEqual(h.broker.streams.dropped, 3)


class LetterStallTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness(BrokerConfig(timeout=60.0))
        self.addCleanup(self.h.close)

    def test_letterWaitsForAFullRecipient(self) -> None:
        """A letter to a recipient that does not drain stays queued, then arrives."""
        h = self.h
        h.open(M, "mailbox")
        h.open(S, "sender")
        h.full.add(M)
        h.send(S, mlm.MailboxSend("mailbox", "hi", "", 0, [b"x"]))
        self.assertEqual(len(h.broker.post.mailboxes["mailbox"]), 1)
        h.full.clear()
        h.clock.advance(RETRY)
        self.assertEqual(subjects(h.take(M)), ["hi"])
        self.assertEqual(len(h.broker.post.mailboxes["mailbox"]), 0)

    def test_requestGoesToAWorkerThatDrains(self) -> None:
        """
        A service request that the first worker cannot take goes to another
        worker; the stalled one gets the next once it drains.
        """
        h = self.h
        for worker in (b"w1", b"w2"):
            h.open(worker, worker.decode())
            h.command(worker, mlm.ServiceOffer("echo", ""))
        h.open(S, "sender")
        h.full.add(b"w1")
        h.send(S, mlm.ServiceSend("echo", "one", "", 0, [b"1"]))
        self.assertEqual(subjects(h.take(b"w2")), ["one"])
        h.full.clear()
        h.clock.advance(RETRY)
        h.send(S, mlm.ServiceSend("echo", "two", "", 0, [b"2"]))
        self.assertEqual(subjects(h.take(b"w1")), ["two"])


class LetterBudgetTests(SynchronousTestCase):
    def test_globalBudgetRefusesRetryLater(self) -> None:
        """
        Letters to many different offline addresses are bounded by the
        broker's letter budget in bytes (not only per mailbox): beyond it a
        letter is refused with "retry later", and room comes back when
        letters are done with.
        """
        budget = 4 * (1000 + LETTER_OVERHEAD)
        h = BrokerHarness(BrokerConfig(limits=Limits(letters_max_bytes=budget)))
        self.addCleanup(h.close)
        h.open(S, "sender", version=2)
        for n in range(5):
            h.send(S, mlm.MailboxSend(f"offline-{n}", "big", f"t{n}", 0, [bytes(1000)]))
        stored = [m for m in h.take(S) if isinstance(m, mlm.Stored)]
        self.assertEqual([m.status_code for m in stored], [200, 200, 200, 200, 300])
        self.assertIn("memory full", stored[-1].status_reason)
        self.assertIn("retry later", stored[-1].status_reason)
        self.assertEqual(h.broker.post.letter_bytes, budget)
        self.assertEqual(h.open(M, "offline-0", version=2)[0].subject, "big")  # type: ignore[attr-defined]
        h.send(M, mlm.Done(1))
        self.assertEqual(h.broker.post.letter_bytes, budget - 1000 - LETTER_OVERHEAD)
        h.send(S, mlm.MailboxSend("offline-9", "fits", "t9", 0, [bytes(1000)]))
        [stored_again] = [m for m in h.take(S) if isinstance(m, mlm.Stored)]
        self.assertEqual(stored_again.status_code, 200)

    def test_refusedLetterLeavesNoCycle(self) -> None:
        """
        A refused letter is freed by reference counting alone: nothing of
        it (the refusal's traceback held the frames that held the letter)
        waits in a reference cycle for the garbage collector, which the
        broker runs seldom (L{malamute_pack.gcservice}).
        """
        size = 3333
        h = BrokerHarness(BrokerConfig(limits=Limits(letters_max_bytes=size)))
        self.addCleanup(h.close)
        h.open(S, "sender", version=2)
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # keep what a collection finds, to look at it
        self.addCleanup(gc.garbage.clear)
        self.addCleanup(gc.set_debug, 0)
        h.send(S, mlm.MailboxSend("offline", "big", "t", 0, [bytes(size)]))
        stored = [m for m in h.take(S) if isinstance(m, mlm.Stored)]
        self.assertIn("memory full", stored[0].status_reason)
        gc.collect()
        holding = [
            o
            for o in gc.garbage
            if any(isinstance(r, bytes) and len(r) == size for r in gc.get_referents(o))
        ]
        self.assertEqual(holding, [])
