"""
Tests for client fail-over between the brokers of a pair (several
endpoints): the Twisted client against real in-process brokers on real
ROUTER sockets, a "refusing broker" (a real ROUTER in the test that answers
every message with ERROR 503, as a passive does) and endpoints nothing is
bound to; the blocking and bulk clients against broker processes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import cast

import zmq
from twisted.application.service import MultiService
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import deferLater
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient, RangeChunk
from malamute_pack.client.core import ClientState
from malamute_pack.client.endpoints import NOT_ACTIVE
from malamute_pack.client.errors import BrokerUnreachableError, MalamuteError
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess, fresh_ipc_endpoint
from malamute_pack.transport.router import RouterService
from malamute_pack.transport.zmqsocket import Batch, ZmqSocket
from tests.support import skip_slow, wait_for
from tests.unit.test_client_reactor import failure_of, stored

_reactor = cast(IReactorFDSet, reactor)


class RefusingBroker:
    """
    A ROUTER on loopback that answers every message with ERROR 503 "not
    active", as the passive broker of a pair does.

    @ivar received: the messages it got, decoded.
    """

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        router = context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(ANY_TCP_PORT)
        self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
        self.received: list[mlm.Message] = []
        self._socket = ZmqSocket(_reactor, router, self._batch)
        self._socket.startReading()

    def _batch(self, batch: Batch) -> None:
        refusal = mlm.encode(mlm.Error(NOT_ACTIVE, "not active: this is the backup"))
        for routing_id, *frames in batch:
            self.received.append(mlm.decode(frames))
            self._socket.send_to(routing_id, refusal)

    def opens(self) -> int:
        """How many CONNECTION_OPENs it refused."""
        return sum(type(m) is mlm.ConnectionOpen for m in self.received)

    def close(self) -> None:
        self._socket.close()


class FailoverTestCase(TestCase):
    """In-process brokers on tcp://127.0.0.1 ports of their choosing, refusers and clients."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.brokers: dict[str, MultiService] = {}
        self.dead = fresh_ipc_endpoint("dead")  # nothing is ever bound there

    def start_broker(self) -> str:
        """A broker with its own data directory; its endpoint."""
        settings = Settings(
            endpoints=("tcp://127.0.0.1:*",), timeout_ms=3000, data_dir=Path(self.mktemp())
        )
        broker = makeBrokerService(settings, _reactor, self.context)
        broker.startService()
        router = broker.getServiceNamed("router")
        assert isinstance(router, RouterService)
        endpoint = router.bound[0]
        self.brokers[endpoint] = broker
        self.addCleanup(lambda: Deferred.fromCoroutine(self.stop_broker(endpoint)))
        return endpoint

    async def stop_broker(self, endpoint: str) -> None:
        """Stop the broker at C{endpoint} (its socket closes: clients hear nothing more)."""
        broker = self.brokers.pop(endpoint, None)
        if broker is not None:
            await broker.stopService()

    def refuser(self) -> RefusingBroker:
        refuser = RefusingBroker(self.context)
        self.addCleanup(refuser.close)
        return refuser

    def connecting(
        self, endpoint: str | list[str], address: str = "", **options: object
    ) -> Deferred[MalamuteClient]:
        """MalamuteClient.connect with a short heartbeat and timeout (1 s) by default."""
        options.setdefault("heartbeat", 0.1)
        options.setdefault("timeout", 1.0)
        return MalamuteClient.connect(
            _reactor,
            endpoint,
            address,
            context=self.context,
            **options,  # type: ignore[arg-type]
        )

    async def client(
        self, endpoint: str | list[str], address: str = "", **options: object
    ) -> MalamuteClient:
        client = await self.connecting(endpoint, address, **options)
        self.addCleanup(client.close)
        return client


class ConnectTests(FailoverTestCase):
    async def test_firstDeadSecondServes(self) -> None:
        """
        With nothing bound at the first endpoint, connect() moves to the
        second after the first's share of the timeout and works there.
        """
        broker = self.start_broker()
        started = time.monotonic()
        client = await self.client([self.dead, broker], timeout=4.0)
        # At most the first's share (2 s) went to it: the second answered
        # before the whole timeout ran out.
        self.assertLess(time.monotonic() - started, 4.0)
        self.assertEqual((client.endpoint, client.switches), (broker, 1))
        self.assertEqual(client.endpoints, (self.dead, broker))
        await client.set_producer("s")

    async def test_firstRefusesSecondServes(self) -> None:
        """A first endpoint that answers ERROR 503 is left at once for the second."""
        refuser = self.refuser()
        broker = self.start_broker()
        started = time.monotonic()
        client = await self.client([refuser.endpoint, broker], timeout=20.0)
        # Well before the first's 10 s share of the timeout.
        self.assertLess(time.monotonic() - started, 5.0)
        self.assertEqual((client.endpoint, client.switches), (broker, 1))
        self.assertEqual(refuser.opens(), 1)
        await client.set_consumer("s", "")

    async def test_commaSeparated(self) -> None:
        """Endpoints separated by commas (blanks ignored) are tried in order."""
        refuser = self.refuser()
        broker = self.start_broker()
        client = await self.client(f"{refuser.endpoint}, {broker}")
        self.assertEqual(client.endpoints, (refuser.endpoint, broker))
        self.assertEqual(client.endpoint, broker)

    async def test_allRefuseUntilTimeout(self) -> None:
        """
        When every endpoint refuses, the client goes round again after a
        back-off until its timeout, then fails with BrokerUnreachableError.
        """
        first, second = self.refuser(), self.refuser()
        started = time.monotonic()
        error = await failure_of(
            self.connecting([first.endpoint, second.endpoint], timeout=1.2), BrokerUnreachableError
        )
        self.assertGreater(time.monotonic() - started, 1.1)
        self.assertIn("503", str(error))
        self.assertGreaterEqual(first.opens(), 2)  # round again after the back-off
        self.assertGreaterEqual(second.opens(), 2)

    async def test_singleEndpointAsBefore(self) -> None:
        """With one endpoint, ERROR 503 fails connect() as any refusal does."""
        refuser = self.refuser()
        error = await failure_of(self.connecting(refuser.endpoint), MalamuteError)
        self.assertEqual(error.code, NOT_ACTIVE)
        self.assertEqual(refuser.opens(), 1)

    async def test_singleEndpointBrokerStops(self) -> None:
        """With one endpoint, a silent broker means DISCONNECTED, as before: no switch."""
        broker = self.start_broker()
        client = await self.client(broker, timeout=0.5)
        await self.stop_broker(broker)
        await wait_for(lambda: client.state is ClientState.DISCONNECTED)
        self.assertEqual((client.endpoint, client.switches), (broker, 0))


class SessionTests(FailoverTestCase):
    async def test_brokerStopsMidSession(self) -> None:
        """
        The broker a client is on stops: the client moves to the other
        broker, its stream reader resumes after the last record it got (no
        record handed over twice), and a letter the first never stored is
        sent again and stored by the second.
        """
        first, second = self.start_broker(), self.start_broker()
        # The same records on both, as a pair's replication keeps them.
        writers = [await self.client(e) for e in (first, second)]
        for writer in writers:
            await writer.set_producer("s")
            for n in range(3):
                writer.send(f"r{n}", [b"x"])
            await writer.remove_consumer("barrier")
        reader = await self.client([first, second], "reader", timeout=0.5)
        await reader.set_consumer("s", "", mlm.EARLIEST)
        got = [await reader.recv() for _ in range(3)]
        self.assertEqual([d.sequence for d in got], [1, 2, 3])
        await self.stop_broker(first)
        letter = reader.sendto("owner", "while failing over", [b"1"])  # never STORED by first
        await wait_for(lambda: reader.state is ClientState.CONNECTED and reader.endpoint == second)
        self.assertEqual((reader.switches, reader.reconnects), (1, 1))
        self.assertIsInstance(await stored(letter), int)
        writers[1].send("r3", [b"x"])
        delivery = await reader.recv()
        self.assertEqual((delivery.subject, delivery.sequence), ("r3", 4))
        await reader.remove_consumer("barrier")
        self.assertEqual(reader.pending(), 0)
        owner = await self.client(second, "owner")
        self.assertEqual((await owner.recv()).subject, "while failing over")

    async def test_renumberedStreamReadAgain(self) -> None:
        """
        The broker a client reads a stream on stops, and the broker it moves
        to numbers that stream from 1 again (a journal made afresh): told so
        when it resumes, the reader reads that broker's records from its
        first, none dropped as a repeat of a number it had (found by the
        soak: the new journal's records were never handed over).
        """
        first, second = self.start_broker(), self.start_broker()
        old = await self.client(first)
        await old.set_producer("s")
        for n in range(3):
            old.send(f"old{n}", [b"x"])
        await old.remove_consumer("barrier")
        new = await self.client(second)
        await new.set_producer("s")
        new.send("new0", [b"x"])
        await new.remove_consumer("barrier")
        reader = await self.client([first, second], "reader", timeout=0.5)
        await reader.set_consumer("s", "", mlm.EARLIEST)
        got = [await reader.recv() for _ in range(3)]
        self.assertEqual([d.subject for d in got], ["old0", "old1", "old2"])
        await self.stop_broker(first)
        await wait_for(lambda: reader.state is ClientState.CONNECTED and reader.endpoint == second)
        new.send("new1", [b"x"])
        got = [await reader.recv() for _ in range(2)]
        self.assertEqual([(d.subject, d.sequence) for d in got], [("new0", 1), ("new1", 2)])

    async def test_nobodyServes(self) -> None:
        """
        The broker stops and the other endpoint refuses (503): after that
        round the client backs off and goes round again, and meanwhile
        commands fail with BrokerUnreachableError, as with one silent broker.
        """
        refuser = self.refuser()
        broker = self.start_broker()
        client = await self.client([broker, refuser.endpoint], timeout=0.5)
        await client.set_consumer("s", "")
        await self.stop_broker(broker)
        # Silent first, then refused by the second: round failed, back off,
        # and still nobody serves; the client waits, DISCONNECTED.
        await wait_for(lambda: refuser.opens() >= 1)
        await wait_for(lambda: client.state is ClientState.DISCONNECTED)
        await self.assertFailure(client.set_producer("t"), BrokerUnreachableError)
        self.assertGreaterEqual(client.switches, 2)


class FastFailoverTests(FailoverTestCase):
    """
    With a long timeout (10 s), a client notices a broker gone, or an
    endpoint nobody listens on, from its socket: it moves on long before
    any silence would count.
    """

    async def test_brokerStopsSwitchesAtOnce(self) -> None:
        """
        The broker a client is on goes away (its connections close): the
        client is open on the other within 3 s, its timeout being 10 s.
        """
        first, second = self.start_broker(), self.start_broker()
        client = await self.client([first, second], "me", timeout=10.0, heartbeat=1.0)
        await client.set_consumer("s", "")
        await self.stop_broker(first)
        await wait_for(
            lambda: client.state is ClientState.CONNECTED and client.endpoint == second, 3.0
        )
        self.assertEqual((client.switches, client.reconnects), (1, 1))
        await client.set_producer("s")  # works there

    async def test_deadEndpointSkipped(self) -> None:
        """
        Moving on mid-session to an endpoint nobody listens on: the client
        finds no connection there within the grace and goes on to the next,
        well within its 10 s timeout.
        """
        first, second = self.start_broker(), self.start_broker()
        client = await self.client([first, self.dead, second], timeout=10.0, heartbeat=1.0)
        await self.stop_broker(first)
        await wait_for(
            lambda: client.state is ClientState.CONNECTED and client.endpoint == second, 3.0
        )
        self.assertEqual(client.switches, 2)

    async def test_refusingPassiveAskedAgain(self) -> None:
        """
        The broker goes away and the other refuses (a passive before its
        pair's expiry): the client asks the passive again after each
        back-off, not after its timeout, and drops nothing meanwhile (its
        pings to the endpoint nobody listens on any more are not counted).
        """
        refuser = self.refuser()
        broker = self.start_broker()
        client = await self.client([broker, refuser.endpoint], timeout=10.0, heartbeat=0.2)
        await self.stop_broker(broker)
        await wait_for(lambda: refuser.opens() >= 3, 3.0)
        self.assertIn(client.state, (ClientState.DISCONNECTED, ClientState.RECONNECTING))
        self.assertEqual(client.dropped, 0)

    async def test_singleEndpointWaitsForSilence(self) -> None:
        """
        With one endpoint, a broker gone is noticed by silence only, as
        before: still CONNECTED well within the timeout.
        """
        broker = self.start_broker()
        client = await self.client(broker, timeout=10.0, heartbeat=1.0)
        await self.stop_broker(broker)
        await deferLater(cast(IReactorTime, reactor), 0.5, lambda: None)
        self.assertIs(client.state, ClientState.CONNECTED)


class BlockingFailoverTests(SynchronousTestCase):
    """The blocking and bulk clients against a broker process behind a dead endpoint."""

    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()), bind=ANY_TCP_PORT)
        self.broker.start()
        self.addCleanup(self.broker.stop)
        self.dead = fresh_ipc_endpoint("dead")

    def test_blockingCommaSeparated(self) -> None:
        """
        The blocking client given "dead,broker" connects to the second and
        works there: commands, STORED sends, deliveries.
        """
        client = BlockingClient(
            f"{self.dead},{self.broker.endpoint}", "me", timeout=1.0, heartbeat=0.1
        )
        self.addCleanup(client.close)
        self.assertEqual((client.endpoint, client.switches), (self.broker.endpoint, 1))
        client.sendto("me", "hello", [b"1"])
        delivery = client.recv(timeout=5)
        assert delivery is not None
        self.assertEqual(delivery.subject, "hello")

    def test_bulkFirstDown(self) -> None:
        """BulkClient with the first endpoint down appends and reads on the second."""
        with BulkClient([self.dead, self.broker.endpoint], timeout=1.0) as client:
            self.assertEqual(client.endpoint, self.broker.endpoint)
            appended = client.append("s", "k1", [(f"r{n}", [b"x"]) for n in range(10)])
            self.assertEqual((appended.first, appended.last), (1, 10))
            seqs = [
                s
                for item in client.read_range("s", 1, 10)
                if isinstance(item, RangeChunk)
                for s in item.seq
            ]
            self.assertEqual(seqs, list(range(1, 11)))
            self.assertEqual(client.switches, 1)


class BlockingFastFailoverTests(SynchronousTestCase):
    """The blocking client between two broker processes, the first killed (kill -9)."""

    skip = skip_slow

    def setUp(self) -> None:
        self.brokers = [BrokerProcess(Path(self.mktemp()), bind=ANY_TCP_PORT) for _ in range(2)]
        for broker in self.brokers:
            broker.start()
            self.addCleanup(broker.stop)

    def test_killedBrokerLeftAtOnce(self) -> None:
        """
        The broker the blocking client is on is killed: a send made at once
        does not block, and within 3 s (the timeout being 10 s) the client
        is open on the other broker, where it works.
        """
        first, second = (broker.endpoint for broker in self.brokers)
        client = BlockingClient([first, second], "me", timeout=10.0, heartbeat=1.0)
        self.addCleanup(client.close)
        client.set_producer("s")
        until = time.monotonic() + 3.0
        self.brokers[0].kill()
        client.send("while failing over", [b"x"])
        while not (client.state is ClientState.CONNECTED and client.endpoint == second):
            if time.monotonic() > until:
                self.fail(f"still {client.state.value} on {client.endpoint} after 3 s")
            client.pause(0.02)
        self.assertEqual(client.switches, 1)
        self.assertIsInstance(client.sendto("me", "after", [b"1"]), int)
        delivery = client.recv(timeout=5)
        assert delivery is not None
        self.assertEqual(delivery.subject, "after")

    def test_bulkKilledBrokerLeftAtOnce(self) -> None:
        """
        The broker a BulkClient is on is killed: its next append goes to the
        other broker and is done there within 3 s (the timeout being 10 s).
        """
        first, second = (broker.endpoint for broker in self.brokers)
        with BulkClient([first, second], timeout=10.0) as client:
            client.append("s", "k1", [("r", [b"x"])])
            self.assertEqual(client.endpoint, first)
            self.brokers[0].kill()
            started = time.monotonic()
            appended = client.append("s", "k2", [("r", [b"y"])])
            self.assertLess(time.monotonic() - started, 3.0)
            self.assertEqual((client.endpoint, client.switches), (second, 1))
            self.assertEqual((appended.first, appended.duplicate), (1, False))


class BulkNoBrokerTests(SynchronousTestCase):
    def test_bulkAllDown(self) -> None:
        """BulkClient with every endpoint down fails within its timeout, naming them all."""
        dead, other = fresh_ipc_endpoint("dead"), fresh_ipc_endpoint("dead")
        started = time.monotonic()
        with self.assertRaises(BrokerUnreachableError) as ctx:
            BulkClient([dead, other], timeout=0.6)
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertIn(other, str(ctx.exception))
