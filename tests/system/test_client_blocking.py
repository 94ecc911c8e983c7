"""
Tests for L{malamute_pack.client.blocking}: the blocking client against a
broker running as a real process (``twistd malamute``).
"""

from __future__ import annotations

import time
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.core import ClientState
from malamute_pack.client.errors import ClientClosedError, MalamuteError
from malamute_pack.client.events import Delivery
from malamute_pack.protocol import mlm
from malamute_pack.testing import brokerprocess
from tests.support import skip_slow

ROOT = brokerprocess.PROJECT_ROOT


class BrokerProcess(brokerprocess.BrokerProcess):
    """
    The broker process for client tests (here and in
    ``tests/system/test_client_examples.py``): on a free tcp port of loopback,
    serving once constructed.
    """

    def __init__(self, directory: Path, timeout_ms: int = 3000) -> None:
        super().__init__(directory, bind=brokerprocess.ANY_TCP_PORT, timeout_ms=timeout_ms)
        self.start()


class BlockingClientTests(SynchronousTestCase):
    """The blocking client against one broker process per test."""

    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()), timeout_ms=600)
        self.addCleanup(self.broker.stop)

    def client(self, address: str = "", version: int = 2) -> BlockingClient:
        client = BlockingClient(
            self.broker.endpoint, address, timeout=10.0, heartbeat=0.1, version=version
        )
        self.addCleanup(client.close)
        return client

    def test_requestReply(self) -> None:
        """
        A service request reaches the worker and its reply reaches the
        requester (version 1: SERVICE_DELIVER and MAILBOX_DELIVER).
        """
        worker = self.client("worker", version=1)
        requester = self.client("requester", version=1)
        worker.set_worker("echo", "")
        requester.sendfor("echo", "ping", [b"payload"])
        request = worker.recv(timeout=5)
        assert request is not None
        self.assertEqual(
            request, Delivery("SERVICE_DELIVER", "requester", "echo", "ping", "", (b"payload",))
        )
        worker.sendto(request.sender, "pong", request.content)
        reply = requester.recv(timeout=5)
        self.assertEqual(
            reply, Delivery("MAILBOX_DELIVER", "worker", "requester", "pong", "", (b"payload",))
        )

    def test_stream(self) -> None:
        """A consumer with a regex gets the matching stream messages only."""
        consumer = self.client("consumer")
        producer = self.client("producer")
        consumer.set_consumer("weather", r"^temp\.")
        producer.set_producer("weather")
        producer.send("wind.oslo", [b"3"])
        producer.send("temp.oslo", [b"-2"])
        delivery = consumer.recv(timeout=5)
        assert delivery is not None
        self.assertEqual((delivery.subject, delivery.content), ("temp.oslo", (b"-2",)))
        self.assertIsNone(consumer.recv(timeout=0.1))

    def test_errorRaised(self) -> None:
        """An ERROR reply raises MalamuteError; the client stays usable."""
        client = self.client()
        error = self.assertRaises(MalamuteError, client.set_consumer, "s", "(")
        self.assertEqual(error.code, 300)
        client.set_consumer("s", "fine")

    def test_heartbeatsWhileBlocked(self) -> None:
        """
        Blocked in recv() for longer than the broker's timeout (0.6 s), the
        client keeps answering heartbeats: the broker does not expire it.
        """
        client = self.client()
        client.set_consumer("s", "")
        self.assertIsNone(client.recv(timeout=1.5))
        client.set_producer("t")
        self.assertEqual(client.reconnects, 0)

    def test_expiredClientReplays(self) -> None:
        """
        A script that leaves the client alone past the broker's timeout is
        expired; its next command meets ERROR 500, and the client opens
        again, replays its subscription and carries on.
        """
        consumer = self.client("consumer")
        consumer.set_consumer("weather", "")
        time.sleep(1.5)  # no heartbeats: the broker expires the consumer
        consumer.set_producer("elsewhere")
        self.assertEqual(consumer.reconnects, 1)
        producer = self.client()
        producer.set_producer("weather")
        producer.send("after", [])
        delivery = consumer.recv(timeout=5)
        assert delivery is not None
        self.assertEqual(delivery.subject, "after")

    def test_contextManagerCloses(self) -> None:
        """Leaving the with block closes the client."""
        with BlockingClient(self.broker.endpoint, timeout=10.0) as client:
            client.set_producer("s")
        self.assertIs(client.state, ClientState.CLOSED)
        self.assertRaises(ClientClosedError, client.recv, 0.1)

    def test_storedIdAndDone(self) -> None:
        """
        With version 2, sendto returns the id the letter was stored under;
        recv() returns it with that id and answers DONE, so an owner
        connecting later gets nothing more.
        """
        sender = self.client("sender")
        letter_id = sender.sendto("owner", "hello", [b"x"])
        assert isinstance(letter_id, int)
        owner = self.client("owner")
        self.assertEqual(
            owner.recv(timeout=5),
            Delivery("MAILBOX_DELIVER", "sender", "owner", "hello", "", (b"x",), id=letter_id),
        )
        owner.close()
        again = self.client("owner")
        self.assertIsNone(again.recv(timeout=0.2))

    def test_readFromEarliest(self) -> None:
        """A reader from EARLIEST gets what was written before it subscribed, numbered."""
        producer = self.client("producer")
        producer.set_producer("weather")
        for n in range(3):
            producer.send(f"temp.{n}", [])
        producer.set_producer("weather")  # a round trip: the messages are written
        reader = self.client("reader")
        reader.set_consumer("weather", "", mlm.EARLIEST)
        got = [reader.recv(timeout=5) for _ in range(3)]
        self.assertEqual(
            [(d.sequence, d.subject) for d in got if d is not None],
            [(1, "temp.0"), (2, "temp.1"), (3, "temp.2")],
        )
