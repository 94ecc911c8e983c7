"""
Slow system tests of the broker's timers with the broker as a real process
(L{malamute_pack.testing.brokerprocess}):

- a letter sent with a timeout, taken by a version 2 recipient that leaves
  without DONE, goes back to its mailbox and still expires once: its
  sender and the sender of a later letter to that mailbox both hear
  CONFIRM 300 "expired", and the broker logs no error;
- with C{service-lease} set, a worker that heartbeats but never answers a
  tracked request loses it to another worker when the lease ends.

Skipped with C{MALAMUTE_SKIP_SLOW=1}.

Tests: this is a test module; its helpers are ``tests/system_support.py``
and the broker process of L{malamute_pack.testing.brokerprocess}.
"""

from __future__ import annotations

import time

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.support import skip_slow
from tests.system_support import Peer, SystemCase

# Seconds anything may take to happen: a liveness bound, not a benchmark.
DEADLINE = 10.0


class TimerCase(SystemCase):
    skip = skip_slow

    def peer(self, broker: BrokerProcess, address: str) -> Peer:
        peer = Peer(self.context, broker.endpoint)
        self.addCleanup(peer.close)
        self.assertEqual(peer.command(mlm.ConnectionOpen(version=2, address=address)), mlm.Ok())
        return peer


class RequeuedDeadlineTests(TimerCase):
    def test_requeuedLetterStillExpires(self) -> None:
        """
        The recipient takes a letter with a 1.5 s timeout and closes without
        DONE; a second letter with a 0.5 s timeout follows to the empty
        mailbox. Both senders' trackers get CONFIRM 300 "expired", each
        once, and the log holds no traceback.
        """
        broker = self.start()
        sender = self.peer(broker, "sender")
        box = self.peer(broker, "box")
        sender.send(mlm.MailboxSend("box", "first", "t1", 1500, [b"1"]))
        taken = box.expect(mlm.MailboxRecord)
        assert isinstance(taken, mlm.MailboxRecord)
        self.assertEqual(box.command(mlm.ConnectionClose()), mlm.Ok())
        sender.send(mlm.MailboxSend("box", "second", "t2", 500, [b"2"]))
        confirms: dict[str, mlm.Confirm] = {}
        deadline = time.monotonic() + DEADLINE
        while len(confirms) < 2 and time.monotonic() < deadline:
            message = sender.receive(0.5)
            if isinstance(message, mlm.Confirm):
                self.assertNotIn(message.tracker, confirms)
                confirms[message.tracker] = message
        self.assertEqual(sorted(confirms), ["t1", "t2"], broker.log_text())
        for confirm in confirms.values():
            self.assertEqual(confirm.status_code, mlm.FAILED)
            self.assertIn("expired", confirm.status_reason)
        self.assertIsNone(sender.receive(1.0))  # and nothing more
        log = broker.run_log()
        self.assertNotIn("Traceback", log)
        self.assertNotIn("AssertionError", log)


class LeaseTests(TimerCase):
    def test_silentWorkerLosesTheRequest(self) -> None:
        """
        With a lease of 1 s, a worker that PINGs but never answers a tracked
        request sees it go to another worker, which gets the same id.
        """
        config = self.base / "malamute.cfg"
        config.write_text("malamute\n    limits\n        service-lease = 1\n")
        broker = self.start("--config", str(config))
        lazy = self.peer(broker, "lazy")
        self.assertEqual(lazy.command(mlm.ServiceOffer("svc", "")), mlm.Ok())
        client = self.peer(broker, "client")
        client.send(mlm.ServiceSend("svc", "job", "track", 0, [b"work"]))
        held = lazy.expect(mlm.ServiceRecord)
        assert isinstance(held, mlm.ServiceRecord)
        busy = self.peer(broker, "busy")
        self.assertEqual(busy.command(mlm.ServiceOffer("svc", "")), mlm.Ok())
        deadline = time.monotonic() + DEADLINE
        again: mlm.Message | None = None
        while again is None and time.monotonic() < deadline:
            self.assertEqual(lazy.command(mlm.ConnectionPing()), mlm.ConnectionPong())
            again = busy.receive(0.3)
        assert isinstance(again, mlm.ServiceRecord), (again, broker.log_text())
        self.assertEqual((again.id, again.subject), (held.id, "job"))
        self.assertIn("past its lease", broker.run_log())
