"""
Tests for L{malamute_pack.client.reactor_client}: the Twisted client against
a real broker service in the test's reactor, over tcp on loopback.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import zmq
from twisted.application.service import MultiService
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from malamute_pack.client.core import ClientState
from malamute_pack.client.errors import (
    BadEndpointError,
    BrokerUnreachableError,
    ClientClosedError,
    MalamuteError,
)
from malamute_pack.client.events import Confirmation, Delivery
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.transport.router import RouterService

_reactor = cast(IReactorFDSet, reactor)
_clock = cast(IReactorTime, reactor)

_E = TypeVar("_E", bound=BaseException)


async def failure_of(d: Deferred[Any], kind: type[_E]) -> _E:
    """The C{kind} exception C{d} fails with (an AssertionError if it does not)."""
    try:
        result = await d
    except kind as e:
        return e
    raise AssertionError(f"expected {kind.__name__}, got the result {result!r}")


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the reactor run until C{condition()} holds; fail after C{timeout}."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        await deferLater(_clock, 0.01)


class ClientTestCase(TestCase):
    """A broker per test on tcp://127.0.0.1 (a port of its choosing) and clients."""

    broker_timeout_ms = 3000

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.data_dir = Path(self.mktemp())
        self.broker: MultiService | None = None
        self.endpoint = self.start_broker("tcp://127.0.0.1:*")
        self.addCleanup(self.stop_broker)

    def settings(self, endpoint: str) -> Settings:
        return Settings(
            endpoints=(endpoint,),
            timeout_ms=self.broker_timeout_ms,
            data_dir=self.data_dir,
            **self.extra_settings(),  # type: ignore[arg-type]
        )

    def extra_settings(self) -> dict[str, object]:
        """Settings this test case's broker has beyond the defaults."""
        return {}

    def start_broker(self, endpoint: str) -> str:
        """Start a broker bound to C{endpoint}; return the endpoint it bound."""
        self.broker = makeBrokerService(self.settings(endpoint), _reactor, self.context)
        self.broker.startService()
        router = self.broker.getServiceNamed("router")
        assert isinstance(router, RouterService)
        return router.bound[0]

    def stop_broker(self) -> None:
        if self.broker is not None:
            self.broker.stopService()
            self.broker = None

    async def restart_broker(self) -> None:
        """A new broker on the same endpoint (it forgets every client)."""
        self.stop_broker()
        end = time.monotonic() + 5
        while True:
            try:
                self.start_broker(self.endpoint)
                return
            except zmq.ZMQError as e:
                # The old listener is closed by libzmq's I/O thread, a moment later.
                if e.errno != zmq.EADDRINUSE or time.monotonic() > end:
                    raise
                self.stop_broker()
                await deferLater(_clock, 0.05)

    async def client(self, address: str = "", **options: object) -> MalamuteClient:
        options.setdefault("heartbeat", 0.1)
        options.setdefault("timeout", 2.0)
        client = await MalamuteClient.connect(
            _reactor, self.endpoint, address, context=self.context, **options  # type: ignore[arg-type]
        )
        self.addCleanup(client.close)
        return client

    async def round_trip(self, *clients: MalamuteClient) -> None:
        """
        A command round trip on each client: all that each sent before has
        been handled by the broker, and all the broker sent it has arrived.
        """
        for client in clients:
            await client.remove_consumer("barrier")


class ConnectTests(ClientTestCase):
    async def test_connectAndClose(self) -> None:
        """connect() fires once the broker said OK; close() closes; recv then fails."""
        client = await self.client("me")
        self.assertIs(client.state, ClientState.CONNECTED)
        self.assertEqual(client.address, "me")
        await client.close()
        self.assertIs(client.state, ClientState.CLOSED)
        await self.assertFailure(client.recv(), ClientClosedError)

    async def test_connectTimesOut(self) -> None:
        """With no broker at the endpoint, connect() fails with BrokerUnreachableError."""
        self.stop_broker()
        await self.assertFailure(
            MalamuteClient.connect(_reactor, self.endpoint, timeout=0.3, heartbeat=0.1,
                                   context=self.context),
            BrokerUnreachableError,
        )

    async def test_badEndpoint(self) -> None:
        """An endpoint ZeroMQ cannot parse fails connect() with BadEndpointError."""
        await self.assertFailure(
            MalamuteClient.connect(_reactor, "nonsense://x", context=self.context),
            BadEndpointError,
        )

    async def test_pendingRecvFailsOnClose(self) -> None:
        """A recv() waiting when the client closes fails with ClientClosedError."""
        client = await self.client()
        waiting = client.recv()
        await client.close()
        await self.assertFailure(waiting, ClientClosedError)


class TrafficTests(ClientTestCase):
    async def test_streamWithRegex(self) -> None:
        """A consumer with C{^temp\\.} gets exactly the temperature messages, in order."""
        consumer = await self.client("consumer")
        producer = await self.client("producer")
        await consumer.set_consumer("weather", r"^temp\.")
        await producer.set_producer("weather")
        for subject in ["temp.paris", "wind.paris", "temp.rome", "rain.oslo"]:
            producer.send(subject, [subject.encode(), b"x"])
        first = await consumer.recv()
        second = await consumer.recv()
        self.assertEqual(
            first, Delivery("STREAM_DELIVER", "producer", "weather", "temp.paris", "",
                            (b"temp.paris", b"x"))
        )
        self.assertEqual(second.subject, "temp.rome")
        await self.round_trip(producer, consumer)
        self.assertEqual(consumer.pending(), 0)

    async def test_removeConsumer(self) -> None:
        """After remove_consumer the stream's messages stop coming."""
        consumer = await self.client()
        producer = await self.client()
        await consumer.set_consumer("weather", "")
        await producer.set_producer("weather")
        producer.send("a", [])
        self.assertEqual((await consumer.recv()).subject, "a")
        await consumer.remove_consumer("weather")
        producer.send("b", [])
        await self.round_trip(producer, consumer)
        self.assertEqual(consumer.pending(), 0)

    async def test_mailboxToLateOwner(self) -> None:
        """A letter sent before its owner connects is delivered when it does."""
        sender = await self.client("sender")
        sender.sendto("late", "hello", [b"one", b"two"])
        await self.round_trip(sender)
        late = await self.client("late")
        self.assertEqual(
            await late.recv(),
            Delivery("MAILBOX_DELIVER", "sender", "late", "hello", "", (b"one", b"two")),
        )

    async def test_serviceRequestReply(self) -> None:
        """A worker gets the request and its sendto reply reaches the requester."""
        worker = await self.client("worker")
        requester = await self.client("requester")
        await worker.set_worker("echo", "^ping")
        requester.sendfor("echo", "ping.1", [b"payload"], tracker="", timeout_ms=5000)
        request = await worker.recv()
        self.assertEqual(
            request, Delivery("SERVICE_DELIVER", "requester", "echo", "ping.1", "", (b"payload",))
        )
        worker.sendto(request.sender, request.subject, request.content)
        reply = await requester.recv()
        self.assertEqual(
            reply, Delivery("MAILBOX_DELIVER", "worker", "requester", "ping.1", "", (b"payload",))
        )

    async def test_creditThrottles(self) -> None:
        """After credit(2) only two letters arrive, until more credit is given."""
        owner = await self.client("owner")
        sender = await self.client("sender")
        owner.credit(2)
        await self.round_trip(owner)
        for n in range(5):
            sender.sendto("owner", f"letter {n}", [b"x"])
        await self.round_trip(sender, owner)
        self.assertEqual(owner.pending(), 2)
        owner.credit(2)
        await self.round_trip(owner)
        self.assertEqual(owner.pending(), 4)
        owner.credit(10)
        subjects = [(await owner.recv()).subject for _ in range(5)]
        self.assertEqual(subjects, [f"letter {n}" for n in range(5)])

    async def test_confirmForwardedToSender(self) -> None:
        """The recipient's CONFIRM of a tracked letter reaches the letter's sender."""
        owner = await self.client("owner")
        sender = await self.client("sender")
        sender.sendto("owner", "order", [b"42"], tracker="order-42")
        letter = await owner.recv()
        self.assertEqual(letter.tracker, "order-42")
        owner.confirm(letter.tracker, 200, "shipped")
        self.assertEqual(await sender.recv_confirm(), Confirmation("order-42", 200, "shipped"))

    async def test_badPatternRefused(self) -> None:
        """An invalid regular expression fails set_consumer with MalamuteError 300."""
        client = await self.client()
        error = await failure_of(client.set_consumer("s", "("), MalamuteError)
        self.assertEqual(error.code, 300)
        self.assertIn("pattern", error.reason)
        # The connection is still usable.
        await client.set_consumer("s", "ok")

    async def test_onDeliveryCallback(self) -> None:
        """With on_delivery set, deliveries go to the callback and not to recv()."""
        got: list[Delivery] = []
        consumer = await self.client(on_delivery=got.append)
        producer = await self.client()
        await consumer.set_consumer("s", "")
        await producer.set_producer("s")
        for n in range(100):
            producer.send(str(n), [])
        await wait_for(lambda: len(got) == 100)
        self.assertEqual([d.subject for d in got], [str(n) for n in range(100)])
        self.assertEqual(consumer.pending(), 0)


class RecoveryTests(ClientTestCase):
    async def test_brokerRestartReplays(self) -> None:
        """
        After a broker restart the clients meet ERROR 500, open again and
        replay: the consumer gets stream messages on its old subscription
        and the worker gets requests, with nothing subscribed again.
        """
        consumer = await self.client("consumer")
        producer = await self.client("producer")
        worker = await self.client("worker")
        await consumer.set_consumer("weather", r"^temp\.")
        await producer.set_producer("weather")
        await worker.set_worker("echo", "")
        await self.restart_broker()
        await wait_for(
            lambda: all(c.reconnects == 1 and c.state is ClientState.CONNECTED
                        for c in (consumer, producer, worker))
        )
        producer.send("wind.x", [b"no"])
        producer.send("temp.x", [b"yes"])
        delivery = await consumer.recv()
        self.assertEqual((delivery.subject, delivery.content), ("temp.x", (b"yes",)))
        consumer.sendfor("echo", "again", [b"1"])
        self.assertEqual((await worker.recv()).subject, "again")

    async def test_lostAndBack(self) -> None:
        """
        A broker gone for longer than the client's timeout: the client counts
        the connection as lost, keeps pinging, and reconnects when a broker
        comes back on the endpoint.
        """
        consumer = await self.client("consumer", timeout=0.5)
        await consumer.set_consumer("s", "")
        self.stop_broker()
        await wait_for(lambda: consumer.state is ClientState.DISCONNECTED)
        await self.assertFailure(consumer.set_consumer("t", ""), BrokerUnreachableError)
        await self.restart_broker()
        await wait_for(lambda: consumer.state is ClientState.CONNECTED)
        self.assertEqual(consumer.reconnects, 1)
        producer = await self.client()
        await producer.set_producer("s")
        producer.send("back", [])
        self.assertEqual((await consumer.recv()).subject, "back")


class PlainTests(ClientTestCase):
    def extra_settings(self) -> dict[str, object]:
        passwords = Path(self.mktemp())
        passwords.write_text("admin = secret\n")
        return {"mechanism": "plain", "passwords": passwords}

    async def test_plainAccepted(self) -> None:
        """A client with the right PLAIN credentials connects and works."""
        client = await self.client("me", plain=("admin", "secret"))
        await client.set_producer("s")

    async def test_plainRefused(self) -> None:
        """Wrong credentials never get an answer: connect() times out."""
        await self.assertFailure(
            MalamuteClient.connect(_reactor, self.endpoint, plain=("admin", "wrong"),
                                   timeout=0.3, heartbeat=0.1, context=self.context),
            BrokerUnreachableError,
        )
