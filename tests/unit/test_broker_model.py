"""
Tests for L{malamute_pack.broker.broker}: the broker model driven message by
message, with time on a L{Clock}: connection, takeover and expiry, streams,
mailboxes, services, credit, confirmations, timeouts and limits.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness

A, B, C, W1, W2 = b"peer-a", b"peer-b", b"peer-c", b"worker-1", b"worker-2"


def deliveries(messages: list[mlm.Message]) -> list[tuple[str, list[bytes]]]:
    """(subject, content) of every delivery in C{messages}."""
    return [
        (m.subject, m.content)
        for m in messages
        if isinstance(m, mlm.StreamDeliver | mlm.MailboxDeliver | mlm.ServiceDeliver)
    ]


class ConnectionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness()

    def test_strangerPingGetsError500(self) -> None:
        """
        A PING from a routing id that never opened gets ERROR 500, not PONG,
        so a libmlm client reconnects after a broker restart, and nothing is
        registered for the stranger.
        """
        [reply] = self.h.command(A, mlm.ConnectionPing())
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)
        self.assertEqual(len(self.h.broker.registry), 0)

    def test_anyCommandBeforeOpen(self) -> None:
        """Every command before CONNECTION_OPEN gets ERROR 500."""
        for message in (mlm.StreamWrite("s"), mlm.StreamRead("s", ""), mlm.Credit(5)):
            [reply] = self.h.command(A, message)
            assert isinstance(reply, mlm.Error)
            self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)

    def test_openThenPing(self) -> None:
        """After OPEN (answered OK) a PING is answered with PONG."""
        self.h.open(A, "a")
        self.assertEqual(self.h.command(A, mlm.ConnectionPing()), [mlm.ConnectionPong()])

    def test_close(self) -> None:
        """CONNECTION_CLOSE is answered OK and forgets the client."""
        self.h.open(A, "a")
        self.assertEqual(self.h.command(A, mlm.ConnectionClose()), [mlm.Ok()])
        self.assertEqual(len(self.h.broker.registry), 0)
        self.assertIsNone(self.h.broker.registry.holder("a"))

    def test_takeover(self) -> None:
        """
        A second client opening with the same address takes it over: the
        first is expired (its PING gets ERROR 500) and mail goes to the second.
        """
        self.h.open(A, "same")
        self.h.open(B, "same")
        [reply] = self.h.command(A, mlm.ConnectionPing())
        self.assertIsInstance(reply, mlm.Error)
        self.h.open(C)
        self.h.send(C, mlm.MailboxSend("same", "hi", "", 0, [b"x"]))
        self.assertEqual(deliveries(self.h.take(B)), [("hi", [b"x"])])
        self.assertEqual(self.h.take(A), [])

    def test_reopenChangesAddress(self) -> None:
        """An OPEN on an open connection re-registers it under the new address."""
        self.h.open(A, "old")
        self.h.open(A, "new")
        self.assertEqual(self.h.broker.registry.addresses(), {"new"})

    def test_expiry(self) -> None:
        """
        A client silent for longer than the timeout is expired: its readers
        go, its PING gets ERROR 500; a client that pings stays.
        """
        self.h.open(A, "a")
        self.h.open(B, "b")
        self.h.command(A, mlm.StreamRead("s", ""))
        for _ in range(8):
            self.h.clock.advance(1)
            self.h.command(B, mlm.ConnectionPing())
        self.assertFalse(self.h.connected(A))
        self.assertTrue(self.h.connected(B))
        self.assertEqual(self.h.broker.streams.streams["s"].readers.owner_count(), 0)
        self.assertEqual(self.h.broker.counters.expired_clients, 1)
        [reply] = self.h.command(A, mlm.ConnectionPing())
        self.assertIsInstance(reply, mlm.Error)

    def test_pauseExpiresNobody(self) -> None:
        """
        A broker that did not run for longer than the timeout (paused: its
        timers all come late at once) expires nobody at its first sweep:
        what its clients sent meanwhile is read first. A client that did
        send stays; one that did not is expired a sweep later.
        """
        self.h.open(A, "a")
        self.h.open(B, "b")
        self.h.clock.advance(1)
        self.h.clock.advance(7)  # paused: the sweeper's call comes 7 s late
        self.assertTrue(self.h.connected(A))
        self.assertTrue(self.h.connected(B))
        self.h.command(B, mlm.ConnectionPing())  # its pings, read after the pause
        self.h.clock.advance(1.25)
        self.assertFalse(self.h.connected(A))
        self.assertTrue(self.h.connected(B))

    def test_alwaysLateStillExpires(self) -> None:
        """A broker whose every sweep is late still expires a silent client."""
        self.h.open(A, "a")
        for _ in range(3):
            self.h.clock.advance(4)
        self.assertFalse(self.h.connected(A))

    def test_expiredMailboxKept(self) -> None:
        """Mail sent to an expired client's address waits for its return."""
        self.h.open(A, "a")
        for _ in range(20):  # the broker runs; the client is silent
            self.h.clock.advance(1)
        self.h.open(B)
        self.h.send(B, mlm.MailboxSend("a", "later", "", 0, [b"1"]))
        self.assertEqual(deliveries(self.h.open(A, "a")), [("later", [b"1"])])

    def test_brokerOnlyMessageIsViolation(self) -> None:
        """
        A client that sends a message only a broker sends (a delivery) gets
        ERROR 500 and is deregistered.
        """
        self.h.open(A, "a")
        [reply] = self.h.command(A, mlm.MailboxDeliver("x", "a", "s", "", []))
        self.assertIsInstance(reply, mlm.Error)
        self.assertFalse(self.h.connected(A))


class StreamTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness()
        self.h.open(A, "writer")
        self.assertEqual(self.h.command(A, mlm.StreamWrite("weather")), [mlm.Ok()])

    def test_regexPatterns(self) -> None:
        """
        Readers get the messages whose subject their regular expression
        finds (search, not full match); an empty pattern reads everything.
        """
        self.h.open(B, "b")
        self.h.open(C, "c")
        self.assertEqual(self.h.command(B, mlm.StreamRead("weather", r"temp\.")), [mlm.Ok()])
        self.h.command(C, mlm.StreamRead("weather", ""))
        for subject in ("temp.moscow", "wind.moscow", "x.temp.paris"):
            self.h.send(A, mlm.StreamSend(subject, [subject.encode()]))
        self.assertEqual(
            [s for s, _ in deliveries(self.h.take(B))], ["temp.moscow", "x.temp.paris"]
        )
        self.assertEqual(len(deliveries(self.h.take(C))), 3)

    def test_deliverFields(self) -> None:
        """A delivery names the stream, the sender's address and the subject."""
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("weather", ""))
        self.h.send(A, mlm.StreamSend("t", [b"1", b"2"]))
        self.assertEqual(
            self.h.take(B), [mlm.StreamDeliver("weather", "writer", "t", [b"1", b"2"])]
        )

    def test_oncePerReader(self) -> None:
        """A reader whose several patterns match gets the message once."""
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("weather", "temp"))
        self.h.command(B, mlm.StreamRead("weather", "moscow"))
        self.h.send(A, mlm.StreamSend("temp.moscow", []))
        self.assertEqual(len(self.h.take(B)), 1)

    def test_notToSender(self) -> None:
        """A writer that also reads its stream never gets its own messages."""
        self.h.command(A, mlm.StreamRead("weather", ""))
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("weather", ""))
        self.h.send(A, mlm.StreamSend("t", []))
        self.assertEqual(self.h.take(A), [])
        self.assertEqual(len(self.h.take(B)), 1)

    def test_otherStreamNotDelivered(self) -> None:
        """Readers of another stream get nothing."""
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("traffic", ""))
        self.h.send(A, mlm.StreamSend("t", []))
        self.assertEqual(self.h.take(B), [])

    def test_cancel(self) -> None:
        """STREAM_CANCEL drops every pattern the client had on that stream."""
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("weather", "a"))
        self.h.command(B, mlm.StreamRead("weather", "b"))
        self.assertEqual(self.h.command(B, mlm.StreamCancel("weather")), [mlm.Ok()])
        self.h.send(A, mlm.StreamSend("ab", []))
        self.assertEqual(self.h.take(B), [])

    def test_sendWithoutWriter(self) -> None:
        """
        STREAM_SEND before STREAM_WRITE (no reply in the protocol) is
        dropped and counted under its reason; the client stays connected.
        """
        self.h.open(B, "b")
        self.assertEqual(self.h.command(B, mlm.StreamSend("t", [])), [])
        self.assertEqual(self.h.broker.counters.by_reason, {"no stream": 1})
        self.assertTrue(self.h.connected(B))

    def test_badPattern(self) -> None:
        """A pattern that does not compile gets ERROR 300 with the reason."""
        self.h.open(B, "b")
        [reply] = self.h.command(B, mlm.StreamRead("weather", "("))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.FAILED)
        self.assertIn("invalid pattern", reply.status_reason)

    def test_writerSwitchesStream(self) -> None:
        """A client writes to one stream at a time: the latest STREAM_WRITE."""
        self.h.open(B, "b")
        self.h.command(B, mlm.StreamRead("weather", ""))
        self.h.command(A, mlm.StreamWrite("traffic"))
        self.h.send(A, mlm.StreamSend("t", []))
        self.assertEqual(self.h.take(B), [])


class MailboxTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness()
        self.h.open(A, "alice")

    def test_offlineDeliveredOnConnect(self) -> None:
        """
        Mail to an address with no client is kept, in order, and delivered
        when the owner connects; MAILBOX_SEND gets no OK (v1).
        """
        self.assertEqual(self.h.command(A, mlm.MailboxSend("bob", "1", "", 0, [b"one"])), [])
        self.h.send(A, mlm.MailboxSend("bob", "2", "", 0, [b"two"]))
        self.h.send(B, mlm.ConnectionOpen(address="bob"))
        messages = self.h.take(B)
        self.assertEqual(messages[0], mlm.Ok())
        self.assertEqual(
            messages[1:],
            [
                mlm.MailboxDeliver("alice", "bob", "1", "", [b"one"]),
                mlm.MailboxDeliver("alice", "bob", "2", "", [b"two"]),
            ],
        )
        self.assertEqual(len(self.h.broker.post.mailboxes["bob"]), 0)

    def test_emptyMailboxForgottenWithItsHolder(self) -> None:
        """
        An empty mailbox is forgotten when its holder leaves, so that
        short-lived addresses do not pile up; mail sent to the address
        afterwards is kept as for any address.
        """
        self.h.open(B, "bob")
        self.h.command(B, mlm.ConnectionClose())
        self.assertNotIn("bob", self.h.broker.post.mailboxes)
        self.h.send(A, mlm.MailboxSend("bob", "s", "", 0, [b"x"]))
        self.assertEqual(len(self.h.broker.post.mailboxes["bob"]), 1)

    def test_onlineDeliveredAtOnce(self) -> None:
        """Mail to a connected owner is delivered at once."""
        self.h.open(B, "bob")
        self.h.send(A, mlm.MailboxSend("bob", "s", "", 0, [b"x"]))
        self.assertEqual(deliveries(self.h.take(B)), [("s", [b"x"])])

    def test_confirmGoesToSender(self) -> None:
        """
        The recipient's CONFIRM of a tracked message reaches the original
        sender with the tracker and the recipient's status.
        """
        self.h.open(B, "bob")
        self.h.send(A, mlm.MailboxSend("bob", "s", "trk-1", 0, [b"x"]))
        [delivered] = self.h.take(B)
        assert isinstance(delivered, mlm.MailboxDeliver)
        self.assertEqual(delivered.tracker, "trk-1")
        self.h.send(B, mlm.Confirm("trk-1", 200, "done"))
        self.assertEqual(self.h.take(A), [mlm.Confirm("trk-1", 200, "done")])

    def test_timeoutExpires(self) -> None:
        """
        A message not delivered before its timeout is discarded and its
        sender gets a CONFIRM with a failure status.
        """
        self.h.send(A, mlm.MailboxSend("bob", "s", "trk-2", 1000, [b"x"]))
        self.h.clock.advance(0.5)
        self.h.command(A, mlm.ConnectionPing())
        self.h.clock.advance(0.6)
        [confirm] = self.h.take(A)
        assert isinstance(confirm, mlm.Confirm)
        self.assertEqual((confirm.tracker, confirm.status_code), ("trk-2", mlm.FAILED))
        self.assertIn("expired", confirm.status_reason)
        self.h.send(B, mlm.ConnectionOpen(address="bob"))
        self.assertEqual(self.h.take(B), [mlm.Ok()])

    def test_deliveredBeforeTimeout(self) -> None:
        """A message delivered in time is not expired later."""
        self.h.send(A, mlm.MailboxSend("bob", "s", "t", 1000, [b"x"]))
        self.h.open(B, "bob")
        self.h.clock.advance(2)
        self.assertEqual(self.h.take(A), [])
        self.assertEqual(self.h.broker.post.expired, 0)

    def test_full(self) -> None:
        """
        A full mailbox refuses: the tracked sender gets CONFIRM 300 telling
        it to retry later; nothing already stored is dropped.
        """
        h = BrokerHarness(BrokerConfig(limits=Limits(mailbox_max_messages=2)))
        h.open(A, "alice")
        for n in range(2):
            h.send(A, mlm.MailboxSend("bob", str(n), "", 0, [b"x"]))
        h.send(A, mlm.MailboxSend("bob", "3", "trk", 0, [b"x"]))
        [confirm] = h.take(A)
        assert isinstance(confirm, mlm.Confirm)
        self.assertEqual(confirm.status_code, mlm.FAILED)
        self.assertIn("retry later", confirm.status_reason)
        h.send(B, mlm.ConnectionOpen(address="bob"))
        self.assertEqual([s for s, _ in deliveries(h.take(B))], ["0", "1"])

    def test_emptyAddressRefused(self) -> None:
        """Mail to the empty address is refused and counted, not stored."""
        self.h.send(A, mlm.MailboxSend("", "s", "", 0, []))
        self.assertEqual(self.h.broker.post.mailboxes, {})
        self.assertEqual(self.h.broker.counters.refused, 1)


class CreditTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness()
        self.h.open(A, "alice")
        self.h.open(B, "bob")

    def test_noCreditMeansUnlimited(self) -> None:
        """A client that never sent CREDIT gets every message (v1 clients)."""
        for n in range(50):
            self.h.send(A, mlm.MailboxSend("bob", str(n), "", 0, []))
        self.assertEqual(len(self.h.take(B)), 50)

    def test_mailboxWaitsForCredit(self) -> None:
        """
        After CREDIT 2 only two mail messages arrive; the rest wait in the
        mailbox and arrive, in order, when more credit is granted.
        """
        self.h.send(B, mlm.Credit(2))
        for n in range(5):
            self.h.send(A, mlm.MailboxSend("bob", str(n), "", 0, []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(B))], ["0", "1"])
        self.h.send(B, mlm.Credit(10))
        self.assertEqual([s for s, _ in deliveries(self.h.take(B))], ["2", "3", "4"])

    def test_streamOutOfCreditDropped(self) -> None:
        """
        A stream reader out of credit is skipped and the miss is counted;
        delivery resumes with new credit.
        """
        self.h.command(A, mlm.StreamWrite("s"))
        self.h.command(B, mlm.StreamRead("s", ""))
        self.h.send(B, mlm.Credit(1))
        for n in range(3):
            self.h.send(A, mlm.StreamSend(str(n), []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(B))], ["0"])
        self.assertEqual(self.h.broker.streams.streams["s"].dropped, 2)
        self.h.send(B, mlm.Credit(1))
        self.h.send(A, mlm.StreamSend("3", []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(B))], ["3"])

    def test_undeliveredWithoutJournalDropped(self) -> None:
        """
        Without a journal, a live record the transport could not send after
        all is a counted miss (not a delivery), and its credit is given back.
        """
        self.h.command(A, mlm.StreamWrite("s"))
        self.h.command(B, mlm.StreamRead("s", ""))
        self.h.send(B, mlm.Credit(2))
        self.h.defer_sends()
        self.h.send(A, mlm.StreamSend("0", []))
        self.h.full.add(B)
        self.h.send_deferred()
        self.h.full.discard(B)
        stream = self.h.broker.streams.streams["s"]
        self.assertEqual((stream.dropped, stream.delivered), (1, 0))
        self.h.clock.advance(1)
        for n in range(1, 4):
            self.h.send(A, mlm.StreamSend(str(n), []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(B))], ["1", "2"])


class ServiceTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = BrokerHarness()
        self.h.open(A, "client")
        self.h.open(W1, "w1")
        self.h.open(W2, "w2")

    def offer(self, worker: bytes, pattern: str = "") -> None:
        self.assertEqual(self.h.command(worker, mlm.ServiceOffer("echo", pattern)), [mlm.Ok()])

    def test_fairDispatch(self) -> None:
        """Requests go to the offering workers in turn."""
        self.offer(W1)
        self.offer(W2)
        for n in range(4):
            self.h.send(A, mlm.ServiceSend("echo", str(n), "", 0, [b"x"]))
        self.assertEqual([s for s, _ in deliveries(self.h.take(W1))], ["0", "2"])
        self.assertEqual([s for s, _ in deliveries(self.h.take(W2))], ["1", "3"])

    def test_queuedUntilOffer(self) -> None:
        """Requests wait in the queue until a worker offers the service."""
        self.h.send(A, mlm.ServiceSend("echo", "early", "", 0, [b"x"]))
        self.h.send(W1, mlm.ServiceOffer("echo", ""))
        messages = self.h.take(W1)
        self.assertEqual(messages[0], mlm.Ok())
        self.assertEqual(messages[1:], [mlm.ServiceDeliver("client", "echo", "early", "", [b"x"])])

    def test_patternSelectsWorker(self) -> None:
        """A request goes only to a worker whose offer pattern matches its subject."""
        self.offer(W1, "^add")
        self.offer(W2, "^sub")
        self.h.send(A, mlm.ServiceSend("echo", "sub.1", "", 0, []))
        self.h.send(A, mlm.ServiceSend("echo", "add.1", "", 0, []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(W1))], ["add.1"])
        self.assertEqual([s for s, _ in deliveries(self.h.take(W2))], ["sub.1"])

    def test_trackedRequestRequeuedOnExpiry(self) -> None:
        """
        A tracked request held by a worker that expires before confirming
        goes back to the queue and the other worker gets it.
        """
        self.offer(W1)
        self.h.send(A, mlm.ServiceSend("echo", "job", "trk", 0, [b"x"]))
        self.assertEqual(len(deliveries(self.h.take(W1))), 1)
        self.offer(W2)
        received: list[mlm.Message] = []
        for _ in range(8):
            self.h.clock.advance(1)
            received += self.h.command(W2, mlm.ConnectionPing())
            self.h.command(A, mlm.ConnectionPing())
        self.assertEqual(deliveries(received), [("job", [b"x"])])
        self.assertEqual(self.h.broker.post.requeued, 1)

    def test_trackedRequestRequeuedOnClose(self) -> None:
        """A worker closing while it holds a tracked request gives it back."""
        self.offer(W1)
        self.h.send(A, mlm.ServiceSend("echo", "job", "trk", 0, []))
        self.h.take(W1)
        self.offer(W2)
        self.h.send(W1, mlm.ConnectionClose())
        self.assertEqual([s for s, _ in deliveries(self.h.take(W2))], ["job"])

    def test_confirmedRequestNotRequeued(self) -> None:
        """
        A tracked request the worker confirmed is complete: the sender gets
        the CONFIRM and the worker's later death requeues nothing.
        """
        self.offer(W1)
        self.h.send(A, mlm.ServiceSend("echo", "job", "trk", 0, []))
        self.h.take(W1)
        self.h.send(W1, mlm.Confirm("trk", 200, ""))
        [confirm] = self.h.take(A)
        self.assertIsInstance(confirm, mlm.Confirm)
        self.offer(W2)
        self.h.send(W1, mlm.ConnectionClose())
        self.assertEqual(self.h.take(W2), [])

    def test_untrackedDoneOnDelivery(self) -> None:
        """An untracked request is done once delivered, as in v1."""
        self.offer(W1)
        self.h.send(A, mlm.ServiceSend("echo", "job", "", 0, []))
        self.h.take(W1)
        self.offer(W2)
        self.h.send(W1, mlm.ConnectionClose())
        self.assertEqual(self.h.take(W2), [])

    def test_workerCreditHoldsRequests(self) -> None:
        """A worker out of credit gets no requests until it grants more."""
        self.h.send(W1, mlm.Credit(1))
        self.offer(W1)
        self.h.send(A, mlm.ServiceSend("echo", "1", "", 0, []))
        self.h.send(A, mlm.ServiceSend("echo", "2", "", 0, []))
        self.assertEqual([s for s, _ in deliveries(self.h.take(W1))], ["1"])
        self.h.send(W1, mlm.Credit(1))
        self.assertEqual([s for s, _ in deliveries(self.h.take(W1))], ["2"])

    def test_requestTimeout(self) -> None:
        """A request no worker takes before its timeout expires with a failed CONFIRM."""
        self.h.send(A, mlm.ServiceSend("echo", "x", "trk", 500, []))
        self.h.clock.advance(0.6)
        [confirm] = self.h.take(A)
        assert isinstance(confirm, mlm.Confirm)
        self.assertEqual(confirm.status_code, mlm.FAILED)
        self.assertEqual(len(self.h.broker.post.services["echo"].queue), 0)


class LimitTests(SynchronousTestCase):
    def test_malformedFromOneClientLeavesOthers(self) -> None:
        """
        Garbage from one client gets ERROR 500 and drops that client only;
        another client's stream keeps flowing.
        """
        h = BrokerHarness()
        h.open(A, "writer")
        h.command(A, mlm.StreamWrite("s"))
        h.open(B, "reader")
        h.command(B, mlm.StreamRead("s", ""))
        h.open(C, "bad")
        h.raw(C, [b"\x00garbage"])
        [reply] = h.take(C)
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)
        self.assertIn("malformed", reply.status_reason)
        h.send(A, mlm.StreamSend("t", []))
        self.assertEqual(len(h.take(B)), 1)
        self.assertEqual(h.broker.counters.malformed, 1)

    def test_oversizedCommandGetsError(self) -> None:
        """A command with a reply that is over the size limit gets ERROR 300."""
        h = BrokerHarness(BrokerConfig(limits=Limits(max_message_bytes=20)))
        h.open(A, "a")
        [reply] = h.command(A, mlm.StreamRead("stream-name", "pattern"))
        assert isinstance(reply, mlm.Error)
        self.assertIn("too large", reply.status_reason)

    def test_oversizedSendDropped(self) -> None:
        """
        An oversized STREAM_SEND (no reply in the protocol) is dropped and
        counted, without an ERROR and without dropping the client.
        """
        h = BrokerHarness(BrokerConfig(limits=Limits(max_frames=3)))
        h.open(A, "a")
        h.command(A, mlm.StreamWrite("s"))
        h.open(B, "b")
        h.command(B, mlm.StreamRead("s", ""))
        self.assertEqual(h.command(A, mlm.StreamSend("t", [b"1", b"2", b"3"])), [])
        self.assertEqual(h.take(B), [])
        self.assertEqual(h.broker.counters.refused, 1)
        self.assertTrue(h.connected(A))

    def test_tooManyClients(self) -> None:
        """An OPEN beyond the client limit gets ERROR 300."""
        h = BrokerHarness(BrokerConfig(limits=Limits(max_clients=1)))
        h.open(A, "a")
        [reply] = h.command(B, mlm.ConnectionOpen(address="b"))
        assert isinstance(reply, mlm.Error)
        self.assertIn("too many clients", reply.status_reason)

    def test_tooManySubscriptions(self) -> None:
        """A pattern beyond the per-client subscription limit gets ERROR 300."""
        h = BrokerHarness(BrokerConfig(limits=Limits(max_subscriptions=2)))
        h.open(A, "a")
        h.command(A, mlm.StreamRead("s", "1"))
        h.command(A, mlm.ServiceOffer("svc", "2"))
        [reply] = h.command(A, mlm.StreamRead("s", "3"))
        assert isinstance(reply, mlm.Error)
        self.assertIn("too many subscriptions", reply.status_reason)

    def test_longSubjectRefused(self) -> None:
        """A mailbox subject over the configured length is refused with CONFIRM."""
        h = BrokerHarness(BrokerConfig(limits=Limits(max_subject=4)))
        h.open(A, "a")
        [confirm] = h.command(A, mlm.MailboxSend("b", "too-long", "t", 0, []))
        assert isinstance(confirm, mlm.Confirm)
        self.assertIn("subject", confirm.status_reason)

    def test_longStreamSubjectDropped(self) -> None:
        """A stream subject over the configured length is dropped and counted."""
        h = BrokerHarness(BrokerConfig(limits=Limits(max_subject=4)))
        h.open(A, "a")
        h.command(A, mlm.StreamWrite("s"))
        h.open(B, "b")
        h.command(B, mlm.StreamRead("s", ""))
        h.send(A, mlm.StreamSend("short", []))
        h.send(A, mlm.StreamSend("ok", []))
        self.assertEqual([s for s, _ in deliveries(h.take(B))], ["ok"])
        self.assertEqual(h.broker.counters.by_reason, {"invalid subject": 1})

    def test_limitsValidated(self) -> None:
        """A limit that is not a positive integer, or over the wire's 255, is refused."""
        self.assertRaises(ValueError, Limits, max_clients=0)
        self.assertRaises(ValueError, Limits, max_subject=256)
