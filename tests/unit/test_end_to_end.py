"""
End-to-end tests of the broker over real ZeroMQ sockets (ipc and tcp on
loopback) in the reactor: raw DEALER peers speak the wire protocol to the
service that C{twistd malamute} runs.
"""

from __future__ import annotations

from pathlib import Path

import zmq
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent
from twisted.trial.unittest import TestCase

from malamute_pack.broker.broker import Broker
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.session import Session
from malamute_pack.protocol import mlm
from malamute_pack.protocol.records import StreamRecord
from malamute_pack.settings import Settings
from malamute_pack.tap import BrokerService
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zmqcore import BUILD
from tests.e2e_support import (
    Peer,
    ipc_endpoint,
    settle,
    start_broker,
    tcp_endpoint,
    the_reactor,
)
from tests.support import capture_log


class BrokerTestCase(TestCase):
    """Starts a broker per test on C{self.endpoint()} and makes peers."""

    timeout_ms = 10_000

    def endpoint(self) -> str:
        return ipc_endpoint()

    def settings(self) -> Settings:
        return Settings(
            endpoints=(self.endpoint(),),
            timeout_ms=self.timeout_ms,
            data_dir=Path(self.mktemp()),
        )

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.peers: list[Peer] = []
        self.start()
        self.addCleanup(lambda: Deferred.fromCoroutine(self._stopEverything()))

    def start(self, settings: Settings | None = None) -> None:
        self.service, self.router = start_broker(settings or self.settings(), self.context)
        self.address = self.router.bound[0]

    def broker(self) -> Broker:
        """The broker model the service runs."""
        model = self.service.getServiceNamed("broker")
        assert isinstance(model, BrokerService)
        return model.broker

    async def _stopEverything(self) -> None:
        for peer in self.peers:
            peer.close()
        await self.stop()
        self.context.term()

    async def stop(self) -> None:
        """Stop the broker and wait for its journal to close."""
        await self.service.stopService()

    def peer(self, plain: tuple[str, str] | None = None) -> Peer:
        peer = Peer(self.context, self.address, plain)
        self.peers.append(peer)
        return peer

    async def opened(self, address: str = "") -> Peer:
        peer = self.peer()
        await peer.open(address)
        return peer


class StartupLogTests(BrokerTestCase):
    def setUp(self) -> None:
        self.events = capture_log(self)
        super().setUp()

    def test_coreNamedOnce(self) -> None:
        """The start-up log names the ZeroMQ I/O core in use (compiled, or pure and why), once."""
        lines = [formatEvent(e) for e in self.events]
        self.assertEqual(
            [t for t in lines if t.startswith("ZeroMQ I/O core")], [f"ZeroMQ I/O core: {BUILD}"]
        )


class IpcTests(BrokerTestCase):
    """The end-to-end scenarios over ipc."""

    async def test_streamFanOutWithPatterns(self) -> None:
        """
        Three readers with different regular expressions each receive
        exactly the messages their pattern finds, in order; the writer,
        also reading, gets none of its own.
        """
        writer = await self.opened("writer")
        assert await writer.command(mlm.StreamWrite("weather")) == mlm.Ok()
        assert await writer.command(mlm.StreamRead("weather", "")) == mlm.Ok()
        patterns = {"all": "", "temp": r"^temp\.", "moscow": r"moscow$"}
        readers = {}
        for name, pattern in patterns.items():
            readers[name] = await self.opened(name)
            assert await readers[name].command(mlm.StreamRead("weather", pattern)) == mlm.Ok()
        subjects = ["temp.moscow", "wind.moscow", "temp.paris", "rain.oslo"] * 25
        for subject in subjects:
            writer.send(mlm.StreamSend(subject, [subject.encode()]))
        expected = {
            "all": subjects,
            "temp": [s for s in subjects if s.startswith("temp.")],
            "moscow": [s for s in subjects if s.endswith("moscow")],
        }
        for name, wanted in expected.items():
            got = []
            for _ in wanted:
                message = await readers[name].next()
                assert isinstance(message, mlm.StreamDeliver)
                self.assertEqual(message.sender, "writer")
                self.assertEqual(message.content, [message.subject.encode()])
                got.append(message.subject)
            self.assertEqual(got, wanted)
        await settle()
        self.assertEqual([r.pending() for r in readers.values()], [0, 0, 0])
        self.assertEqual(writer.pending(), 0)

    async def test_mailboxToOfflineAddress(self) -> None:
        """
        A mailbox message sent to an address nobody holds is delivered when
        a client opens with that address.
        """
        sender = await self.opened("sender")
        sender.send(mlm.MailboxSend("late", "hello", "", 0, [b"body"]))
        await settle()
        receiver = self.peer()
        self.assertEqual(await receiver.command(mlm.ConnectionOpen(address="late")), mlm.Ok())
        self.assertEqual(
            await receiver.next(), mlm.MailboxDeliver("sender", "late", "hello", "", [b"body"])
        )

    async def test_workersServedFairly(self) -> None:
        """Two workers offering a service get the requests in turn."""
        w1, w2 = await self.opened("w1"), await self.opened("w2")
        for worker in (w1, w2):
            assert await worker.command(mlm.ServiceOffer("echo", "")) == mlm.Ok()
        client = await self.opened("client")
        for n in range(10):
            client.send(mlm.ServiceSend("echo", str(n), "", 0, [b"x"]))
        got1 = [await w1.next_subject() for _ in range(5)]
        got2 = [await w2.next_subject() for _ in range(5)]
        self.assertEqual(got1, ["0", "2", "4", "6", "8"])
        self.assertEqual(got2, ["1", "3", "5", "7", "9"])


class TcpTests(IpcTests):
    """The end-to-end scenarios over tcp on loopback."""

    def endpoint(self) -> str:
        return tcp_endpoint()


class RecoveryTests(BrokerTestCase):
    timeout_ms = 400

    async def test_killedWorkerRequestServedByOther(self) -> None:
        """
        A worker that vanishes (socket gone, no CLOSE) holding a tracked
        request is expired after the timeout and the request goes to the
        other worker; the requester gets the second worker's CONFIRM.
        """
        w1 = await self.opened("w1")
        assert await w1.command(mlm.ServiceOffer("jobs", "")) == mlm.Ok()
        client = await self.opened("client")
        client.send(mlm.ServiceSend("jobs", "job-1", "trk-1", 0, [b"payload"]))
        held = await w1.next()
        assert isinstance(held, mlm.ServiceDeliver) and held.tracker == "trk-1"
        w1.close()
        self.peers.remove(w1)
        w2 = await self.opened("w2")
        assert await w2.command(mlm.ServiceOffer("jobs", "")) == mlm.Ok()
        # Both live peers keep pinging so only the vanished worker expires.
        requests: list[mlm.ServiceDeliver] = []
        for _ in range(30):
            for peer in (w2, client):
                peer.send(mlm.ConnectionPing())
            await settle(0.05)
            while w2.pending():
                message = await w2.next()
                if isinstance(message, mlm.ServiceDeliver):
                    requests.append(message)
            if requests:
                break
        [request] = requests
        self.assertEqual((request.subject, request.content), ("job-1", [b"payload"]))
        w2.send(mlm.Confirm("trk-1", 200, "done"))
        while True:
            reply = await client.next()
            if not isinstance(reply, mlm.ConnectionPong):
                break
        self.assertEqual(reply, mlm.Confirm("trk-1", 200, "done"))

    async def test_error500AfterRestart(self) -> None:
        """
        After the broker restarts on the same endpoint a client's PING gets
        ERROR 500 (the new broker does not know it); a new OPEN recovers it,
        and its mailbox works again.
        """
        self.timeout_ms = 10_000
        await self.stop()
        endpoint = ipc_endpoint()
        self.start(Settings(endpoints=(endpoint,), data_dir=Path(self.mktemp())))
        peer = await self.opened("client")
        await self.stop()
        self.start(Settings(endpoints=(endpoint,), data_dir=Path(self.mktemp())))
        reply = await peer.command(mlm.ConnectionPing())
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)
        await peer.open("client")
        other = await self.opened("other")
        other.send(mlm.MailboxSend("client", "back", "", 0, []))
        delivered = await peer.next()
        assert isinstance(delivered, mlm.MailboxDeliver)
        self.assertEqual(delivered.subject, "back")


class FlowAndSafetyTests(BrokerTestCase):
    async def test_creditStopsAndResumes(self) -> None:
        """
        A client that grants CREDIT 3 gets three mailbox messages and no
        more until it grants credit again; then the rest arrive in order.
        """
        receiver = await self.opened("rx")
        receiver.send(mlm.Credit(3))
        sender = await self.opened("tx")
        for n in range(8):
            sender.send(mlm.MailboxSend("rx", str(n), "", 0, []))
        got = [await receiver.next_subject() for _ in range(3)]
        await settle(0.1)
        self.assertEqual(receiver.pending(), 0)
        receiver.send(mlm.Credit(100))
        got += [await receiver.next_subject() for _ in range(5)]
        self.assertEqual(got, [str(n) for n in range(8)])

    async def test_garbageClientDoesNotDisturbOthers(self) -> None:
        """
        One peer sending garbage (bad signatures, unknown ids, truncated
        fields, empty messages) gets ERRORs while a stream between two other
        clients carries every message.
        """
        writer = await self.opened("writer")
        assert await writer.command(mlm.StreamWrite("s")) == mlm.Ok()
        reader = await self.opened("reader")
        assert await reader.command(mlm.StreamRead("s", "")) == mlm.Ok()
        bad = self.peer()
        garbage = [[b"\x00"], [b"\xaa\xa8\x63"], [b"\xaa\xa8\x06\x10ab"], [b""], [b"x" * 5000]]
        for n in range(200):
            bad.send_raw(garbage[n % len(garbage)])
            writer.send(mlm.StreamSend(str(n), []))
        subjects = [await reader.next_subject() for _ in range(200)]
        self.assertEqual(subjects, [str(n) for n in range(200)])
        errors = [await bad.next() for _ in range(200)]
        self.assertTrue(all(isinstance(e, mlm.Error) for e in errors))
        self.assertEqual(self.broker().counters.malformed, 200)


class PlainAuthTests(BrokerTestCase):
    def settings(self) -> Settings:
        passwords = Path(self.mktemp())
        passwords.write_text("# users\nadmin = secret\nguest=guest\n")
        return Settings(
            endpoints=(tcp_endpoint(),),
            mechanism="plain",
            passwords=passwords,
            data_dir=Path(self.mktemp()),
        )

    async def test_plainAccepted(self) -> None:
        """A client with a user and password from the file is served."""
        peer = self.peer(plain=("admin", "secret"))
        self.assertEqual(await peer.command(mlm.ConnectionOpen(address="a")), mlm.Ok())

    async def test_plainRefused(self) -> None:
        """
        A client with a wrong password, or with no PLAIN credentials at all,
        is never heard by the broker.
        """
        wrong = self.peer(plain=("admin", "nope"))
        wrong.send(mlm.ConnectionOpen(address="x"))
        anonymous = self.peer()
        anonymous.send(mlm.ConnectionOpen(address="y"))
        await settle(0.3)
        self.assertEqual((wrong.pending(), anonymous.pending()), (0, 0))
        assert self.router.sessions is not None
        self.assertEqual(self.router.sessions.received, 0)
        zap = self.service.getServiceNamed("zap")
        self.assertGreaterEqual(zap.refused, 1)


class _FaultyReceiver:
    """A receiver with a bug: STREAM_WRITE raises; anything else is answered PONG."""

    def receive(self, session: Session, message: mlm.Message) -> None:
        if isinstance(message, mlm.StreamWrite):
            raise RuntimeError("a bug in the model")
        session.pong()

    def malformed(self, session: Session, reason: str) -> None:
        session.error(mlm.COMMAND_INVALID, reason)

    def rejected(self, session: Session, message: mlm.Message, reason: str) -> None:
        session.error(mlm.FAILED, reason)

    def undelivered(self, session: Session, record: StreamRecord) -> None:
        pass

    def unresponsive(self, session: Session, reason: str) -> None:
        pass


class RouterFaultTests(TestCase):
    async def test_bugCostsOneMessage(self) -> None:
        """
        An exception while handling one message is logged and costs that
        message only: the socket keeps reading, later messages are handled.
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router = RouterService(
            the_reactor(), context, _FaultyReceiver(), Limits(), [ipc_endpoint()]
        )
        router.startService()
        peer = Peer(context, router.bound[0])
        try:
            peer.send(mlm.StreamWrite("s"))
            peer.send(mlm.ConnectionPing())
            self.assertEqual(await peer.next(), mlm.ConnectionPong())
            peer.send(mlm.StreamWrite("s"))
            self.assertEqual(await peer.command(mlm.ConnectionPing()), mlm.ConnectionPong())
            self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 2)
        finally:
            peer.close()
            router.stopService()
            context.term()
