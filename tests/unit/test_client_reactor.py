"""
Tests for L{malamute_pack.client.reactor_client}: the Twisted client against
a real broker service in the test's reactor, over tcp on loopback, with its
journal in the test's temporary directory. The version 2 tests at the end
cover what protocol version 2 adds: STORED ids, reading from a position,
credit without loss, DONE and redelivery, resuming after a broker restart.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypeVar, cast

import zmq
from twisted.application.service import MultiService
from twisted.internet import reactor
from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IReactorFDSet, IReactorTime
from twisted.internet.task import deferLater
from twisted.trial.unittest import TestCase

from malamute_pack.broker.limits import Limits
from malamute_pack.client.core import ClientState
from malamute_pack.client.errors import (
    BadEndpointError,
    BrokerUnreachableError,
    ClientClosedError,
    MalamuteError,
)
from malamute_pack.client.events import Confirmation, Delivery
from malamute_pack.client.reactor_client import MalamuteClient
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.tap import makeBrokerService
from malamute_pack.transport.router import RouterService
from tests.support import wait_for

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


async def stored(d: Deferred[int] | None) -> int:
    """The id a version 2 send's Deferred fires with."""
    assert d is not None, "a version 2 client's sendto/sendfor return a Deferred"
    return await d


class ClientTestCase(TestCase):
    """A broker per test on tcp://127.0.0.1 (a port of its choosing) and clients."""

    broker_timeout_ms = 3000

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.destroy, 0)
        self.data_dir = Path(self.mktemp())
        self.broker: MultiService | None = None
        self.endpoint = self.start_broker("tcp://127.0.0.1:*")
        self.addCleanup(lambda: Deferred.fromCoroutine(self.stop_broker()))

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

    async def stop_broker(self) -> None:
        """Stop the broker and wait until it has closed its journal."""
        if self.broker is not None:
            broker, self.broker = self.broker, None
            await broker.stopService()

    async def restart_broker(self) -> None:
        """
        A new broker on the same endpoint and data directory: it forgets
        every client, and keeps what its journal holds.
        """
        await self.stop_broker()
        end = time.monotonic() + 5
        while True:
            try:
                self.start_broker(self.endpoint)
                return
            except zmq.ZMQError as e:
                # The old listener is closed by libzmq's I/O thread, a moment later.
                if e.errno != zmq.EADDRINUSE or time.monotonic() > end:
                    raise
                await self.stop_broker()
                await deferLater(_clock, 0.05)

    async def client(self, address: str = "", **options: object) -> MalamuteClient:
        options.setdefault("heartbeat", 0.1)
        options.setdefault("timeout", 2.0)
        client = await MalamuteClient.connect(
            _reactor,
            self.endpoint,
            address,
            context=self.context,
            **options,  # type: ignore[arg-type]
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
        await self.stop_broker()
        await self.assertFailure(
            MalamuteClient.connect(
                _reactor, self.endpoint, timeout=0.3, heartbeat=0.1, context=self.context
            ),
            BrokerUnreachableError,
        )

    async def test_connectCancelled(self) -> None:
        """
        connect() cancelled before the broker answered fails with
        CancelledError, and the half-open client is gone at once: no timer
        left for its 30 s timeout (trial would find it), and its socket closed.
        """
        await self.stop_broker()
        connecting = MalamuteClient.connect(
            _reactor, self.endpoint, timeout=30.0, heartbeat=0.1, context=self.context
        )
        await deferLater(_clock, 0.05)
        connecting.cancel()
        await self.assertFailure(connecting, CancelledError)

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
        """
        A consumer with C{^temp\\.} gets exactly the temperature messages, in
        order (version 1: STREAM_DELIVER).
        """
        consumer = await self.client("consumer", version=1)
        producer = await self.client("producer", version=1)
        await consumer.set_consumer("weather", r"^temp\.")
        await producer.set_producer("weather")
        for subject in ["temp.paris", "wind.paris", "temp.rome", "rain.oslo"]:
            producer.send(subject, [subject.encode(), b"x"])
        first = await consumer.recv()
        second = await consumer.recv()
        self.assertEqual(
            first,
            Delivery(
                "STREAM_DELIVER", "producer", "weather", "temp.paris", "", (b"temp.paris", b"x")
            ),
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
        """A letter sent before its owner connects is delivered when it does (version 1)."""
        sender = await self.client("sender", version=1)
        sender.sendto("late", "hello", [b"one", b"two"])
        await self.round_trip(sender)
        late = await self.client("late", version=1)
        self.assertEqual(
            await late.recv(),
            Delivery("MAILBOX_DELIVER", "sender", "late", "hello", "", (b"one", b"two")),
        )

    async def test_serviceRequestReply(self) -> None:
        """A worker gets the request and its sendto reply reaches the requester (version 1)."""
        worker = await self.client("worker", version=1)
        requester = await self.client("requester", version=1)
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
            lambda: all(
                c.reconnects == 1 and c.state is ClientState.CONNECTED
                for c in (consumer, producer, worker)
            )
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
        await self.stop_broker()
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
            MalamuteClient.connect(
                _reactor,
                self.endpoint,
                plain=("admin", "wrong"),
                timeout=0.3,
                heartbeat=0.1,
                context=self.context,
            ),
            BrokerUnreachableError,
        )


class Version2Tests(ClientTestCase):
    async def test_sendsReturnStoredIds(self) -> None:
        """
        sendto and sendfor fire with the ids the broker stored the messages
        under; the recipients' deliveries carry those ids, with the version 1
        command names.
        """
        sender = await self.client("sender")
        worker = await self.client("worker")
        await worker.set_worker("echo", "")
        letter_id = await stored(sender.sendto("owner", "hello", [b"1"]))
        request_id = await stored(sender.sendfor("echo", "ping", [b"2"]))
        self.assertNotEqual(letter_id, request_id)
        owner = await self.client("owner")
        self.assertEqual(
            await owner.recv(),
            Delivery("MAILBOX_DELIVER", "sender", "owner", "hello", "", (b"1",), id=letter_id),
        )
        self.assertEqual(
            await worker.recv(),
            Delivery("SERVICE_DELIVER", "sender", "echo", "ping", "", (b"2",), id=request_id),
        )

    async def test_version1Unchanged(self) -> None:
        """A version 1 client's sends return None; reading from a position raises."""
        client = await self.client("old", version=1)
        self.assertIsNone(client.sendto("owner", "s", []))
        self.assertRaises(ValueError, client.set_consumer, "s", "", mlm.EARLIEST)

    async def test_earliestHistoryThenLive(self) -> None:
        """
        A reader from EARLIEST gets the stream's history, then the messages
        written after, in order, each once, with sequence and timestamp.
        """
        producer = await self.client("producer")
        await producer.set_producer("weather")
        for n in range(3):
            producer.send(f"old.{n}", [])
        await self.round_trip(producer)
        reader = await self.client("reader")
        await reader.set_consumer("weather", "", mlm.EARLIEST)
        got = [await reader.recv() for _ in range(3)]
        for n in range(2):
            producer.send(f"new.{n}", [])
        got += [await reader.recv() for _ in range(2)]
        self.assertEqual(
            [(d.sequence, d.subject) for d in got],
            [(1, "old.0"), (2, "old.1"), (3, "old.2"), (4, "new.0"), (5, "new.1")],
        )
        stamps = [d.timestamp for d in got]
        assert all(t is not None for t in stamps)
        self.assertEqual(stamps, sorted(cast(list[float], stamps)))
        self.assertLess(abs(cast(float, stamps[0]) - time.time()), 60)
        await self.round_trip(producer, reader)
        self.assertEqual((reader.pending(), reader.duplicates), (0, 0))

    async def test_twoPatternsFromEarliest(self) -> None:
        """
        Two patterns read from EARLIEST on one stream (the second moves the
        stream's position back) give every matching record of the history
        exactly once.
        """
        producer = await self.client("producer")
        await producer.set_producer("weather")
        for subject in ("temp.a", "wind.b", "rain.c", "temp.d", "wind.e"):
            producer.send(subject, [])
        await self.round_trip(producer)
        reader = await self.client("reader")
        await reader.set_consumer("weather", "^temp", mlm.EARLIEST)
        await reader.set_consumer("weather", "^wind", mlm.EARLIEST)
        got = [await reader.recv() for _ in range(4)]
        self.assertEqual(
            sorted((d.sequence or 0, d.subject) for d in got),
            [(1, "temp.a"), (2, "wind.b"), (4, "temp.d"), (5, "wind.e")],
        )
        await self.round_trip(reader)
        self.assertEqual(reader.pending(), 0)

    async def test_creditExhaustedThenMore(self) -> None:
        """
        A reader out of credit gets no more; more credit delivers every
        message it missed, in order, without gap or duplicate.
        """
        reader = await self.client("reader")
        reader.credit(3)
        await reader.set_consumer("s", "")
        producer = await self.client("producer")
        await producer.set_producer("s")
        for n in range(10):
            producer.send(str(n), [])
        await self.round_trip(producer, reader)
        self.assertEqual(reader.pending(), 3)
        reader.credit(100)
        got = [await reader.recv() for _ in range(10)]
        self.assertEqual([d.sequence for d in got], list(range(1, 11)))
        self.assertEqual([d.subject for d in got], [str(n) for n in range(10)])
        self.assertEqual((reader.gaps, reader.duplicates), (0, 0))

    async def test_mailboxRedeliveredWithoutDone(self) -> None:
        """
        A letter its owner received but did not answer with DONE is
        delivered again, same id, when the owner connects again; once
        answered it is gone.
        """
        sender = await self.client("sender")
        letter_id = await stored(sender.sendto("owner", "important", [b"x"]))
        first = await self.client("owner", auto_done=False)
        delivery = await first.recv()
        self.assertEqual(delivery.id, letter_id)
        await first.close()
        second = await self.client("owner", auto_done=False)
        self.assertEqual(await second.recv(), delivery)
        second.done(delivery)
        await self.round_trip(second)
        await second.close()
        third = await self.client("owner")
        await self.round_trip(third)
        self.assertEqual(third.pending(), 0)

    async def test_autoDoneOnRecv(self) -> None:
        """With auto_done (the default) recv() answers the letter: it is not delivered again."""
        sender = await self.client("sender")
        await stored(sender.sendto("owner", "once", []))
        first = await self.client("owner")
        self.assertEqual((await first.recv()).subject, "once")
        await first.close()
        second = await self.client("owner")
        await self.round_trip(sender, second)
        self.assertEqual(second.pending(), 0)

    async def test_redeliveryAfterRestartDropped(self) -> None:
        """
        After a broker restart the letter the owner holds unanswered comes
        again from the journal; the same client drops it as a duplicate,
        and its later DONE reaches the new broker.
        """
        sender = await self.client("sender")
        await stored(sender.sendto("owner", "held", [b"x"]))
        owner = await self.client("owner", auto_done=False)
        delivery = await owner.recv()
        await self.restart_broker()
        await wait_for(lambda: owner.duplicates == 1)
        self.assertEqual((owner.reconnects, owner.pending()), (1, 0))
        owner.done(delivery)
        await self.round_trip(owner)
        await owner.close()
        again = await self.client("owner")
        await self.round_trip(again)
        self.assertEqual(again.pending(), 0)

    async def test_sendWhileBrokerDownStoredAfterReconnect(self) -> None:
        """
        A letter sent while the broker is down reaches the restarted broker,
        which does not know the sender (ERROR 500); it is sent again after
        the reconnection and its Deferred fires with the id it was stored
        under.
        """
        sender = await self.client("sender")
        await self.stop_broker()
        pending = sender.sendto("owner", "meanwhile", [b"1"])
        await self.restart_broker()
        letter_id = await stored(pending)
        self.assertEqual(sender.reconnects, 1)
        owner = await self.client("owner")
        delivery = await owner.recv()
        self.assertEqual((delivery.subject, delivery.id), ("meanwhile", letter_id))

    async def test_resumeAfterRestart(self) -> None:
        """
        A consumer that finds the broker restarted resumes after the last
        record it saw: it gets the matching messages written while it had
        not noticed yet, with sequence numbers continuing those before the
        restart, and nothing twice.
        """
        # A long heartbeat: the consumer notices the restart only at its next command.
        consumer = await self.client("consumer", heartbeat=30.0, timeout=60.0)
        await consumer.set_consumer("weather", r"^temp\.")
        producer = await self.client("producer")
        await producer.set_producer("weather")
        for n in range(3):
            producer.send(f"temp.{n}", [])
        before = [await consumer.recv() for _ in range(3)]
        await self.restart_broker()
        await wait_for(lambda: producer.reconnects == 1 and producer.state is ClientState.CONNECTED)
        for subject in ("temp.3", "wind.4", "temp.5"):
            producer.send(subject, [])
        await self.round_trip(producer)
        self.assertEqual(consumer.reconnects, 0)
        await consumer.remove_consumer("barrier")  # meets ERROR 500: reopen, resume
        after = [await consumer.recv() for _ in range(2)]
        self.assertEqual(consumer.reconnects, 1)
        self.assertEqual(
            [(d.sequence, d.subject) for d in before + after],
            [(1, "temp.0"), (2, "temp.1"), (3, "temp.2"), (4, "temp.3"), (6, "temp.5")],
        )
        await self.round_trip(producer, consumer)
        self.assertEqual((consumer.pending(), consumer.duplicates), (0, 0))


class ConsumerTests(ClientTestCase):
    async def test_consumeCommitResume(self) -> None:
        """
        A durable consumer commits what it processed (the Deferred fires
        with the position on disk); a new client consuming under the same
        name, after a broker restart, gets the records after it.
        """
        producer = await self.client("producer")
        await producer.set_producer("orders")
        for n in range(5):
            producer.send(f"o{n}", [b"x"])
        first = await self.client("first")
        await first.consume("orders", "", "billing")
        got = [await first.recv() for _ in range(3)]
        self.assertEqual([d.sequence for d in got], [1, 2, 3])
        self.assertEqual(await first.commit("orders", 3), 3)
        # Closed first: a client that reconnects resumes its consumer, and
        # the later of two connections consuming under one name takes it
        # over, so a reconnecting "first" could take 4 and 5 from "second".
        await first.close()
        await self.restart_broker()
        second = await self.client("second")
        await second.consume("orders", "", "billing")
        self.assertEqual([(await second.recv()).sequence for _ in range(2)], [4, 5])

    async def test_commitPastTheEnd(self) -> None:
        """
        A commit past the stream's last record (a number the broker never
        gave) fails with the broker's refusal, at once, and the commits
        after it get their own answers: the position the broker made
        durable.
        """
        producer = await self.client("producer")
        await producer.set_producer("orders")
        for n in range(5):
            producer.send(f"o{n}", [b"x"])
        consumer = await self.client("consumer")
        await consumer.consume("orders", "", "billing")
        got = [await consumer.recv() for _ in range(5)]
        self.assertEqual([d.sequence for d in got], [1, 2, 3, 4, 5])
        past = consumer.commit("orders", 99)
        again = consumer.commit("orders", 5)
        # Without an answer the commit would fail at its deadline (30 s);
        # the test fails sooner.
        past.addTimeout(5, _clock)
        with self.assertRaises(MalamuteError) as caught:
            await past
        self.assertIn("past the last record", str(caught.exception))
        self.assertEqual(await again, 5)

    async def test_commitRefused(self) -> None:
        """A commit on a stream the client does not consume fails with the broker's reason."""
        client = await self.client("c")
        with self.assertRaises(MalamuteError) as caught:
            await client.commit("orders", 3)
        self.assertEqual(caught.exception.code, 300)


class RefusalTests(ClientTestCase):
    def extra_settings(self) -> dict[str, object]:
        return {"limits": Limits(mailbox_max_messages=1)}

    async def test_refusedSendFails(self) -> None:
        """A letter to a full mailbox fails its Deferred with MalamuteError 300."""
        sender = await self.client("sender")
        await stored(sender.sendto("absent", "first", []))
        error = await failure_of(
            cast(Deferred[int], sender.sendto("absent", "second", [])), MalamuteError
        )
        self.assertEqual(error.code, mlm.FAILED)
