"""
Tests for the broker model's session interface (L{malamute_pack.broker.session}):
the model driven only through in-memory sessions, which encode nothing, and
side by side with MLM sessions. What each session gets is decided by its
own policy, not by branches in the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.letters import Letter
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.session import Hold
from malamute_pack.protocol import mlm
from malamute_pack.transport.sessions import MlmSessions
from tests.memory_session import InMemorySession, Said


def _nothing(letter: Letter) -> Hold:
    return Hold.NOTHING


def _for_confirm(letter: Letter) -> Hold:
    return Hold.FOR_CONFIRM


class SessionTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock, BrokerConfig(timeout=5.0))

    def opened(self, name: str, address: str = "", **kwargs: object) -> InMemorySession:
        session = InMemorySession(name, **kwargs)  # type: ignore[arg-type]
        self.broker.receive(session, mlm.ConnectionOpen(address=address))
        self.assertEqual(session.take(), [Said("ok")])
        return session

    def test_openAttachesCloseDetaches(self) -> None:
        """
        OPEN registers a connection for the session and tells it
        (attached); CLOSE is answered OK and tells it detached.
        """
        a = self.opened("a", "alice")
        self.assertEqual(a.attachments, [1])
        self.assertIs(self.broker.registry.holder("alice"), self.broker.registry.get(a))
        self.broker.receive(a, mlm.ConnectionClose())
        self.assertEqual(a.take(), [Said("ok")])
        self.assertEqual(a.attachments, [1, -1])
        self.assertIsNone(self.broker.registry.get(a))

    def test_strangerIsNotRegistered(self) -> None:
        """A session that never opened gets ERROR 500 and nothing is kept for it."""
        stranger = InMemorySession("stranger")
        self.broker.receive(stranger, mlm.ConnectionPing())
        [said] = stranger.take()
        self.assertEqual(said.what, "error")
        self.assertEqual(said.values[0], mlm.COMMAND_INVALID)
        self.assertEqual(len(self.broker.registry), 0)
        self.assertEqual(stranger.attachments, [])

    def test_fanOutHandsEveryReaderTheSameRecord(self) -> None:
        """
        A stream message goes to every matching reader as one and the same
        record object (so each dialect can encode it once), never back to
        its writer.
        """
        writer = self.opened("w", "writer")
        self.broker.receive(writer, mlm.StreamWrite("weather"))
        self.broker.receive(writer, mlm.StreamRead("weather", ""))
        readers = [self.opened(f"r{i}") for i in range(3)]
        for reader in readers:
            self.broker.receive(reader, mlm.StreamRead("weather", "^temp"))
            reader.take()
        writer.take()
        self.broker.receive(writer, mlm.StreamSend("temp.paris", [b"21"]))
        self.broker.receive(writer, mlm.StreamSend("wind.paris", [b"3"]))
        first = readers[0].records[0]
        for reader in readers:
            self.assertEqual([r.subject for r in reader.records], ["temp.paris"])
            self.assertIs(reader.records[0], first)
        self.assertEqual((first.stream, first.seq, first.sender), ("weather", 1, "writer"))
        self.assertEqual(list(first.content), [b"21"])
        self.assertEqual(writer.records, [])

    def test_heldUntilAnsweredIsRequeued(self) -> None:
        """
        A recipient whose policy holds letters until answered keeps each
        one held; when it goes away unanswered, the letter is delivered
        again to the address's next owner.
        """
        sender = self.opened("s", "sender")
        first = self.opened("m1", "mailbox")
        self.broker.receive(sender, mlm.MailboxSend("mailbox", "hi", "", 0, [b"x"]))
        self.assertEqual([letter.subject for letter in first.letters], ["hi"])
        self.broker.receive(first, mlm.ConnectionClose())
        second = InMemorySession("m2")
        self.broker.receive(second, mlm.ConnectionOpen(address="mailbox"))
        self.assertEqual([letter.subject for letter in second.letters], ["hi"])
        self.assertEqual(self.broker.post.requeued, 1)

    def test_nothingHeldIsDoneAtHandOver(self) -> None:
        """
        A recipient whose policy holds nothing is the letter's end: its
        leaving does not bring the letter back.
        """
        sender = self.opened("s", "sender")
        recipient = self.opened("m1", "mailbox", policy=_nothing)
        self.broker.receive(sender, mlm.MailboxSend("mailbox", "hi", "", 0, [b"x"]))
        self.assertEqual(len(recipient.letters), 1)
        self.broker.receive(recipient, mlm.ConnectionClose())
        again = self.opened("m2", "mailbox")
        self.assertEqual(again.letters, [])
        self.assertEqual(self.broker.post.requeued, 0)

    def test_heldForConfirmPassesTheConfirmOn(self) -> None:
        """
        A letter held only for its CONFIRM: the recipient's CONFIRM reaches
        the sender, and losing the recipient does not requeue it.
        """
        sender = self.opened("s", "sender")
        recipient = self.opened("m", "mailbox", policy=_for_confirm)
        self.broker.receive(sender, mlm.MailboxSend("mailbox", "hi", "t-1", 0, [b"x"]))
        sender.take()
        self.broker.receive(recipient, mlm.Confirm("t-1", 201, "did it"))
        self.assertEqual(sender.take(), [Said("confirm", ("t-1", 201, "did it"))])
        self.broker.receive(sender, mlm.MailboxSend("mailbox", "again", "t-2", 0, [b"y"]))
        self.broker.receive(recipient, mlm.ConnectionClose())
        self.assertEqual(self.broker.post.requeued, 0)

    def test_receiptsInSendOrder(self) -> None:
        """
        Every letter a session sends gets a receipt, in send order: stored
        ones with their id and 200, a refused one (a full mailbox) with 300.
        """
        self.broker = Broker(self.clock, BrokerConfig(limits=Limits(mailbox_max_messages=1)))
        sender = self.opened("s", "sender")
        for tracker in ("a", "b", "c"):
            address = "bob" if tracker != "c" else "carol"
            self.broker.receive(sender, mlm.MailboxSend(address, "hi", tracker, 0, [b"x"]))
        receipts = [(r.tracker, r.code) for r in sender.receipts]
        self.assertEqual(receipts, [("a", 200), ("b", 300), ("c", 200)])
        self.assertIn("queue full", sender.receipts[1].reason)
        self.assertEqual([r.id for r in sender.receipts if r.code == 200], [1, 2])
        self.assertEqual(self.broker.counters.by_reason, {"queue full": 1})

    def test_commandsOutsideTheDialectAreRefused(self) -> None:
        """
        A session that does not speak STREAM_READ_FROM and DONE is refused
        them (ERROR 500 for the command that has a reply, a counted refusal
        for DONE), and stays connected.
        """
        commands = frozenset(set(mlm.MESSAGE_TYPES.values()) - {mlm.StreamReadFrom, mlm.Done})
        session = self.opened("v1", "old", commands=commands)
        self.broker.receive(session, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        [said] = session.take()
        self.assertEqual(said.what, "error")
        self.assertEqual(said.values[0], mlm.COMMAND_INVALID)
        self.assertIn("STREAM_READ_FROM", str(said.values[1]))
        self.broker.receive(session, mlm.Done(1))
        self.assertEqual(session.take(), [])
        self.assertEqual(self.broker.counters.refused, 2)
        self.assertIsNotNone(self.broker.registry.get(session))

    def test_takeoverDetachesThePreviousHolder(self) -> None:
        """
        A session opening with an address another session holds takes it
        over: the previous one is detached and is a stranger again.
        """
        old = self.opened("old", "same")
        new = self.opened("new", "same")
        self.assertEqual(old.attachments, [1, -1])
        self.assertEqual(new.attachments, [1])
        self.broker.receive(old, mlm.ConnectionPing())
        [said] = old.take()
        self.assertEqual((said.what, said.values[0]), ("error", mlm.COMMAND_INVALID))

    def test_mlmAndInMemorySessionsTogether(self) -> None:
        """
        MLM sessions and in-memory sessions share one broker: an MLM writer's
        stream message reaches an in-memory reader, and an in-memory
        sender's letter reaches an MLM recipient as MAILBOX_DELIVER frames.
        """
        sent: list[tuple[bytes, list[bytes]]] = []

        def output(route: bytes, frames: Sequence[bytes]) -> bool:
            sent.append((route, list(frames)))
            return True

        mlm_sessions = MlmSessions(self.broker, output, Limits())
        mlm_sessions.receive(b"w", mlm.encode(mlm.ConnectionOpen(address="mlm-writer")))
        mlm_sessions.receive(b"w", mlm.encode(mlm.StreamWrite("s")))
        reader = self.opened("reader", "memory")
        self.broker.receive(reader, mlm.StreamRead("s", ""))
        mlm_sessions.receive(b"w", mlm.encode(mlm.StreamSend("hello", [b"1"])))
        self.assertEqual([(r.sender, r.subject) for r in reader.records], [("mlm-writer", "hello")])
        sent.clear()
        self.broker.receive(reader, mlm.MailboxSend("mlm-writer", "back", "", 0, [b"2"]))
        self.assertEqual(
            [(route, mlm.decode(frames)) for route, frames in sent],
            [(b"w", mlm.MailboxDeliver("memory", "mlm-writer", "back", "", [b"2"]))],
        )

    def test_expiryDetaches(self) -> None:
        """A silent session's connection expires: it is detached and counted."""
        a = self.opened("a", "alice")
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.clock.pump([0.5] * 14)  # the broker runs; the session is silent
        self.assertEqual(a.attachments, [1, -1])
        self.assertEqual(self.broker.counters.expired_clients, 1)

    def test_noExpiryWhileNotListening(self) -> None:
        """
        While the broker is not reading (backpressure) nobody is expired for
        silence; once it reads again every connection counts as just heard.
        """
        a = self.opened("a", "alice")
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.broker.listening(False)
        self.clock.advance(20.0)
        self.assertEqual(a.attachments, [1])
        self.broker.listening(True)
        self.clock.advance(4.0)
        self.assertEqual(a.attachments, [1])
        self.clock.advance(2.0)
        self.assertEqual(a.attachments, [1, -1])


class InternalSessionTests(SynchronousTestCase):
    """Sessions of the broker's own process (a multicast bridge): attach_internal."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock, BrokerConfig(timeout=5.0))

    def test_neverExpired(self) -> None:
        """An internal connection stays however long it is silent; a client's expires."""
        bridge = InMemorySession("bridge")
        connection = self.broker.attach_internal(bridge)
        client = InMemorySession("client")
        self.broker.receive(client, mlm.ConnectionOpen(address="alice"))
        self.clock.advance(60)
        self.broker.expire_silent()
        self.assertIs(self.broker.registry.get(bridge), connection)
        self.assertIsNone(self.broker.registry.get(client))

    def test_patternsAnnounced(self) -> None:
        """
        What an internal connection reads counts as a local reading (the
        pack announces it to its peers), unlike a remote one's.
        """
        internal = self.broker.attach_internal(InMemorySession("bridge"))
        remote = self.broker.attach_remote(InMemorySession("peer"))
        assert remote is not None
        self.broker.streams.subscribe(internal, "prices", "EUR.*")
        self.broker.streams.subscribe(remote, "prices", "USD.*")
        self.assertEqual(self.broker.interests.readings(), [("prices", "EUR.*")])
        self.broker.detach_remote(internal.session)
        self.assertEqual(self.broker.interests.readings(), [])
