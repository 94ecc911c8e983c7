"""
Tests for L{malamute_pack.client.outbox}: messages sent or held, the limit
on held ones, STORED matched in send order, resending after the broker
forgot us, and failing what waits on close.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.errors import (
    ClientClosedError,
    ClientError,
    MalamuteError,
    MessageDroppedError,
)
from malamute_pack.client.outbox import Outbox, StoredSend
from malamute_pack.protocol import mlm


def letter(subject: str) -> list[bytes]:
    return mlm.encode(mlm.MailboxSend("bob", subject, "", 0, []))


def stored(record_id: int, status_code: int = mlm.SUCCESS) -> mlm.Stored:
    return mlm.Stored(record_id, "", status_code, "refused" if status_code != mlm.SUCCESS else "")


class OutboxTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.sent: list[str] = []
        self.outbox = Outbox(self.send, max_held=3)
        self.results: list[int | ClientError] = []

    def send(self, frames: list[bytes]) -> None:
        message = mlm.decode(frames)
        assert isinstance(message, mlm.MailboxSend)
        self.sent.append(message.subject)

    def tracked(self, subject: str) -> StoredSend:
        return StoredSend(letter(subject), self.results.append)

    def test_usableSendsAtOnce(self) -> None:
        """While usable, messages go out as posted."""
        self.outbox.post(letter("a"), usable=True, state="connected")
        self.outbox.post(self.tracked("b"), usable=True, state="connected")
        self.assertEqual(self.sent, ["a", "b"])
        self.assertTrue(self.outbox.awaiting_stored)

    def test_heldUntilFlush(self) -> None:
        """While not usable, messages are held and go out in order on flush()."""
        self.outbox.post(letter("a"), usable=False, state="reconnecting")
        self.outbox.post(self.tracked("b"), usable=False, state="reconnecting")
        self.assertEqual(self.sent, [])
        self.assertEqual(self.outbox.pending_stored, 1)
        self.assertFalse(self.outbox.awaiting_stored)
        self.outbox.flush()
        self.assertEqual(self.sent, ["a", "b"])
        self.assertTrue(self.outbox.awaiting_stored)

    def test_tooManyHeld(self) -> None:
        """Past max_held a message is dropped and counted; a tracked one fails."""
        for n in range(3):
            self.outbox.post(letter(str(n)), usable=False, state="disconnected")
        self.outbox.post(letter("x"), usable=False, state="disconnected")
        self.outbox.post(self.tracked("y"), usable=False, state="disconnected")
        self.assertEqual(self.outbox.dropped, 2)
        [error] = self.results
        self.assertIsInstance(error, MessageDroppedError)
        self.assertIn("disconnected", str(error))

    def test_storedInOrder(self) -> None:
        """STOREDs answer the sends on the wire in order; a refusal is MalamuteError."""
        self.outbox.post(self.tracked("a"), usable=True, state="connected")
        self.outbox.post(self.tracked("b"), usable=True, state="connected")
        self.assertTrue(self.outbox.stored(stored(7)))
        self.assertTrue(self.outbox.stored(stored(0, mlm.FAILED)))
        self.assertFalse(self.outbox.stored(stored(9)))  # none waiting: ignored
        self.assertEqual(self.results[0], 7)
        assert isinstance(self.results[1], MalamuteError)
        self.assertEqual(self.results[1].code, mlm.FAILED)
        self.assertFalse(self.outbox.awaiting_stored)

    def test_resendUnstoredFirst(self) -> None:
        """Unacknowledged sends go again on the next flush, before those held meanwhile."""
        self.outbox.post(self.tracked("a"), usable=True, state="connected")
        self.outbox.post(self.tracked("b"), usable=True, state="connected")
        self.outbox.stored(stored(1))
        self.outbox.resend_unstored()
        self.outbox.post(self.tracked("c"), usable=False, state="reconnecting")
        self.assertFalse(self.outbox.awaiting_stored)
        self.sent.clear()
        self.outbox.flush()
        self.assertEqual(self.sent, ["b", "c"])
        self.assertEqual(self.outbox.pending_stored, 2)

    def test_dropAll(self) -> None:
        """On close every send waiting, on the wire or held, fails; nothing is left."""
        self.outbox.post(self.tracked("a"), usable=True, state="connected")
        self.outbox.post(self.tracked("b"), usable=False, state="reconnecting")
        self.outbox.post(letter("c"), usable=False, state="reconnecting")
        self.outbox.drop_all(ClientClosedError("closed"))
        self.assertEqual([type(r) for r in self.results], [ClientClosedError] * 2)
        self.assertEqual(self.outbox.pending_stored, 0)
        self.outbox.flush()
        self.assertEqual(self.sent, ["a"])
