"""
Tests for L{malamute_pack.broker.letters} (letters and the bounded
first-in first-out queue that holds them: a mailbox or a service queue) and
L{malamute_pack.broker.deadlines} (which queued letters are due to expire, and
which held requests are due to go back to their queue).
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.deadlines import Deadlines, Leases
from malamute_pack.broker.letters import Kind, Letter, LetterQueue, LetterState, QueueFull


def letter(n: int, content: Sequence[bytes] = (b"x",), deadline: float | None = None) -> Letter:
    """Letter number C{n} to mailbox C{rx}, with C{content} and C{deadline}."""
    return Letter(
        id=n,
        kind=Kind.MAILBOX,
        sender="tx",
        address="rx",
        subject=f"subject-{n}",
        tracker="",
        content=list(content),
        deadline=deadline,
    )


def ids(letters: Sequence[Letter] | LetterQueue) -> list[int]:
    return [each.id for each in letters]


class LetterTests(SynchronousTestCase):
    def test_sizeIsContentBytes(self) -> None:
        """A letter's size is the bytes of its content frames, all together."""
        self.assertEqual(letter(1, [b"abc", b"", b"de"]).size, 5)
        self.assertEqual(letter(2, []).size, 0)

    def test_newLetterIsQueuedNowhere(self) -> None:
        """A new letter is in the QUEUED state, in no queue yet, and not requeued on loss."""
        new = letter(1)
        self.assertEqual(new.state, LetterState.QUEUED)
        self.assertEqual((new.queue, new.requeue_on_loss), (None, False))


class LetterQueueTests(SynchronousTestCase):
    def test_firstInFirstOut(self) -> None:
        """
        Letters leave from the front in the order they were appended; the
        queue counts them and their bytes, and each knows its queue.
        """
        queue = LetterQueue("mailbox rx", max_messages=10, max_bytes=100)
        letters = [letter(n, [b"x" * n]) for n in (1, 2, 3)]
        for each in letters:
            queue.append(each)
        self.assertEqual((len(queue), queue.bytes, ids(queue)), (3, 6, [1, 2, 3]))
        self.assertTrue(all(each.queue is queue for each in letters))
        first = queue.first()
        assert first is not None
        queue.remove(first)
        self.assertEqual((ids(queue), queue.bytes, first.queue), ([2, 3], 5, None))

    def test_emptyHasNoFirst(self) -> None:
        """An empty queue has no first letter, no length and no bytes."""
        queue = LetterQueue("q", max_messages=1, max_bytes=1)
        self.assertEqual((queue.first(), len(queue), queue.bytes), (None, 0, 0))

    def test_removeFromAnywhere(self) -> None:
        """A letter can leave from the middle (it expired); the others keep their order."""
        queue = LetterQueue("q", max_messages=10, max_bytes=100)
        letters = [letter(n) for n in (1, 2, 3)]
        for each in letters:
            queue.append(each)
        queue.remove(letters[1])
        self.assertEqual((ids(queue), queue.bytes), ([1, 3], 2))

    def test_fullByCount(self) -> None:
        """
        A letter beyond the count bound is refused with QueueFull naming the
        queue; nothing about the queue or the letter changes.
        """
        queue = LetterQueue("mailbox rx", max_messages=2, max_bytes=1000)
        queue.append(letter(1))
        queue.append(letter(2))
        refused = letter(3)
        error = self.assertRaises(QueueFull, queue.append, refused)
        self.assertIn("mailbox rx", str(error))
        self.assertEqual((ids(queue), queue.bytes, refused.queue), ([1, 2], 2, None))

    def test_fullByBytes(self) -> None:
        """
        A letter that would take the queue past its byte bound is refused;
        one that brings it exactly to the bound is taken.
        """
        queue = LetterQueue("service echo", max_messages=100, max_bytes=10)
        queue.append(letter(1, [b"x" * 6]))
        error = self.assertRaises(QueueFull, queue.append, letter(2, [b"x" * 5]))
        self.assertIn("10 bytes", str(error))
        queue.append(letter(3, [b"x" * 4]))
        self.assertEqual((ids(queue), queue.bytes), ([1, 3], 10))

    def test_unboundedAppend(self) -> None:
        """Letters recovered from the journal (bounded=False) are taken past the bounds."""
        queue = LetterQueue("q", max_messages=1, max_bytes=1)
        queue.append(letter(1, [b"xx"]), bounded=False)
        queue.append(letter(2, [b"yy"]), bounded=False)
        self.assertEqual((ids(queue), queue.bytes), ([1, 2], 4))

    def test_requeueAtFrontPastBounds(self) -> None:
        """
        A letter handed back (its recipient left) goes to the front, QUEUED
        again, even if the queue has filled up meanwhile.
        """
        queue = LetterQueue("q", max_messages=1, max_bytes=100)
        held = letter(1)
        queue.append(held)
        queue.remove(held)
        held.state = LetterState.HELD
        queue.append(letter(2))
        queue.requeue(held)
        self.assertEqual((ids(queue), queue.bytes), ([1, 2], 2))
        self.assertEqual((held.state, held.queue), (LetterState.QUEUED, queue))


class DeadlinesTests(SynchronousTestCase):
    def test_nothingDue(self) -> None:
        """With no letter there is no next deadline and nothing due."""
        deadlines = Deadlines()
        self.assertEqual((deadlines.next_time(), deadlines.pop_due(1e9)), (None, []))

    def test_dueInDeadlineOrder(self) -> None:
        """
        The letters due at a time are those whose deadline is at or before
        it, earliest first (ties in the order added); later ones stay.
        """
        deadlines = Deadlines()
        letters = [letter(1, deadline=5.0), letter(2, deadline=2.0), letter(3, deadline=9.0)]
        letters.append(letter(4, deadline=2.0))
        for each in letters:
            deadlines.add(each)
        self.assertEqual(deadlines.next_time(), 2.0)
        self.assertEqual(ids(deadlines.pop_due(1.9)), [])
        self.assertEqual(ids(deadlines.pop_due(5.0)), [2, 4, 1])
        self.assertEqual((deadlines.next_time(), len(deadlines)), (9.0, 1))

    def test_deliveredLettersSkipped(self) -> None:
        """
        A letter no longer queued (delivered and held, or done) is never
        due, and is dropped when it comes up: the next deadline is that of
        a letter still waiting.
        """
        deadlines = Deadlines()
        held, done, waiting = (letter(n, deadline=float(n)) for n in (1, 2, 3))
        for each in (held, done, waiting):
            deadlines.add(each)
        held.state = LetterState.HELD
        done.state = LetterState.DONE
        self.assertEqual(deadlines.next_time(), 3.0)
        self.assertEqual(len(deadlines), 1)
        self.assertEqual(deadlines.pop_due(10.0), [waiting])

    def test_skippedWhenPopped(self) -> None:
        """A letter delivered after its deadline passed is not returned as due."""
        deadlines = Deadlines()
        late, other = letter(1, deadline=1.0), letter(2, deadline=1.5)
        deadlines.add(late)
        deadlines.add(other)
        late.state = LetterState.DONE
        self.assertEqual(deadlines.pop_due(2.0), [other])
        self.assertEqual(len(deadlines), 0)

    def test_oneEntryPerLetter(self) -> None:
        """
        Adding a letter again (it was requeued before its deadline) keeps
        its one entry: it comes due once.
        """
        deadlines = Deadlines()
        requeued = letter(1, deadline=1.0)
        deadlines.add(requeued)
        requeued.state = LetterState.HELD
        requeued.state = LetterState.QUEUED
        deadlines.add(requeued)
        self.assertEqual(len(deadlines), 1)
        self.assertEqual(deadlines.pop_due(2.0), [requeued])
        deadlines.add(requeued)  # watched again once its entry is gone
        self.assertEqual(deadlines.pop_due(2.0), [requeued])


class LeasesTests(SynchronousTestCase):
    def test_dueWhileHeld(self) -> None:
        """A held letter is due at the end of its lease; one answered before is not."""
        leases = Leases()
        held, answered = letter(1), letter(2)
        for each, until in ((held, 5.0), (answered, 4.0)):
            each.state = LetterState.HELD
            each.lease_until = until
            leases.add(each)
        answered.state = LetterState.DONE
        self.assertEqual(leases.next_time(), 5.0)
        self.assertEqual(leases.pop_due(6.0), [held])

    def test_newLeaseReplacesTheOld(self) -> None:
        """A letter held again with a new lease is due at the new time only."""
        leases = Leases()
        request = letter(1)
        request.state = LetterState.HELD
        request.lease_until = 5.0
        leases.add(request)
        request.lease_until = 9.0  # requeued and held by another worker
        leases.add(request)
        self.assertEqual(leases.pop_due(6.0), [])
        self.assertEqual(leases.pop_due(9.0), [request])
