"""
Tests for L{malamute_pack.ops.management}: the C{$broker} service answers
each request with a MAILBOX message to the requester (subject, tracker,
JSON body), over an in-memory session, over MLM sessions of the model, and
over a real socket of a real broker process with the blocking client;
unknown subjects and admin are answered with an error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.access import AccessControl, parse_access
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.limits import Limits, check_name
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.ops.management import ERROR_SUBJECT, SERVICE, ManagementSession, answer
from malamute_pack.ops.stats import SECTIONS, Statistics
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.broker_support import BrokerHarness
from tests.memory_session import InMemorySession
from tests.support import skip_slow

OPS = b"ops"


class AnswerTests(SynchronousTestCase):
    def setUp(self) -> None:
        clock = Clock()
        self.stats = Statistics(clock, Broker(clock, BrokerConfig()), None, Settings())

    def test_sections(self) -> None:
        """Every section's answer is its name and its JSON."""
        for name in SECTIONS:
            subject, body = answer(self.stats, name)
            self.assertEqual(subject, name)
            expected = json.loads(json.dumps(self.stats.section(name)))
            if name == "overview":  # its memory and uptime move on
                self.assertEqual(set(json.loads(body)), set(expected))
            else:
                self.assertEqual(json.loads(body), expected)

    def test_unknown(self) -> None:
        """An unknown subject is answered with subject error and the sections known."""
        subject, body = answer(self.stats, "nonsense")
        self.assertEqual(subject, ERROR_SUBJECT)
        self.assertIn("unknown section 'nonsense'", json.loads(body)["error"])

    def test_adminRefused(self) -> None:
        """Admin actions are not offered over MLM."""
        for request in ("admin", "admin/purge/bob"):
            subject, body = answer(self.stats, request)
            self.assertEqual(subject, ERROR_SUBJECT)
            self.assertIn("not offered over MLM", json.loads(body)["error"])

    def test_nameIsLegal(self) -> None:
        """The service's name passes the broker's checks on names."""
        check_name("service address", SERVICE, Limits().max_address)


class MemorySessionTests(SynchronousTestCase):
    """The service as an in-memory session (a party like any other) sees it."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.broker = Broker(self.clock, BrokerConfig())
        self.stats = Statistics(self.clock, self.broker, None, Settings())
        self.service = ManagementSession(self.clock, self.broker, self.stats)
        self.service.attach()

    def test_answeredByMail(self) -> None:
        """
        A request to $broker is answered with a letter to the requester's
        mailbox: subject and tracker of the request, the section as JSON.
        """
        session = InMemorySession("ops")
        self.broker.receive(session, mlm.ConnectionOpen(address="ops"))
        self.broker.receive(session, mlm.ServiceSend(SERVICE, "overview", "t-1", 0, [b""]))
        self.clock.advance(0)
        (letter,) = session.letters
        self.assertEqual(
            (letter.kind.value, letter.address, letter.subject, letter.tracker),
            ("mailbox", "ops", "overview", "t-1"),
        )
        (body,) = letter.content
        overview = json.loads(body)
        self.assertEqual(overview["clients"], 1)
        self.assertEqual(overview["counters"]["service_requests"], 1)
        self.assertEqual(self.service.answered, 1)

    def test_anonymousUnanswered(self) -> None:
        """An anonymous requester has no mailbox: counted, nothing sent, nothing broken."""
        session = InMemorySession("anonymous")
        self.broker.receive(session, mlm.ConnectionOpen(address=""))
        self.broker.receive(session, mlm.ServiceSend(SERVICE, "overview", "", 0, [b""]))
        self.clock.advance(0)
        self.assertEqual(session.letters, [])
        self.assertEqual((self.service.unanswerable, self.service.answered), (1, 0))

    def test_accessControl(self) -> None:
        """Asking $broker is a service call like any other: the ACL's call right applies."""
        self.broker.access = AccessControl(self.clock, parse_access(["ops call: $broker"]))
        allowed = InMemorySession("ops", user="ops")
        refused = InMemorySession("eve", user="eve")
        for session in (allowed, refused):
            self.broker.receive(session, mlm.ConnectionOpen(address=session.name))
            self.broker.receive(session, mlm.ServiceSend(SERVICE, "limits", "", 0, [b""]))
        self.clock.advance(0)
        self.assertEqual([letter.subject for letter in allowed.letters], ["limits"])
        self.assertEqual(refused.letters, [])
        self.assertEqual(self.broker.counters.by_reason, {"not allowed": 1})

    def test_offeredAndWithdrawn(self) -> None:
        """
        Attached, the service has one worker, an internal connection; once
        detached none, and requests wait in its queue.
        """
        service = self.broker.post.services[SERVICE]
        self.assertEqual(service.offers.owner_count(), 1)
        (internal,) = [c for c in self.stats.clients() if c["internal"]]
        self.assertEqual(internal["version"], None)
        self.service.detach()
        self.assertEqual(service.offers.owner_count(), 0)
        self.assertEqual(self.stats.clients(), [])


class MlmTests(SynchronousTestCase):
    """The service over the model's MLM sessions, journaled."""

    def setUp(self) -> None:
        path = Path(self.mktemp()) / "journal.sqlite"
        self.h = BrokerHarness(BrokerConfig(timeout=3600.0), path)
        self.addCleanup(self.h.close)
        self.stats = Statistics(self.h.clock, self.h.broker, self.h.journal, Settings())
        self.service = ManagementSession(self.h.clock, self.h.broker, self.stats)
        self.service.attach()
        self.addCleanup(self.service.detach)

    def ask(self, subject: str, version: int = 1) -> mlm.Message:
        h = self.h
        h.open(OPS, "ops", version=version)
        h.send(OPS, mlm.ServiceSend(SERVICE, subject, "t-7", 0, [b""]))
        h.clock.advance(0)
        got = [m for m in h.take(OPS) if isinstance(m, mlm.MailboxDeliver | mlm.MailboxRecord)]
        self.assertEqual(len(got), 1, got)
        return got[0]

    def test_version1(self) -> None:
        """A version 1 client gets MAILBOX_DELIVER with the streams section."""
        reply = self.ask("streams")
        assert isinstance(reply, mlm.MailboxDeliver)
        self.assertEqual((reply.address, reply.subject, reply.tracker), ("ops", "streams", "t-7"))
        self.assertEqual(json.loads(reply.content[0]), [])

    def test_version2(self) -> None:
        """A version 2 client gets MAILBOX_RECORD, and its DONE ends the letter."""
        reply = self.ask("journal", version=2)
        assert isinstance(reply, mlm.MailboxRecord)
        journal: dict[str, Any] = json.loads(reply.content[0])
        self.assertIs(journal["enabled"], True)
        self.assertEqual(self.h.command(OPS, mlm.Done(reply.id)), [])

    def test_error(self) -> None:
        """An unknown subject is answered with subject error."""
        reply = self.ask("nonsense")
        assert isinstance(reply, mlm.MailboxDeliver)
        self.assertEqual(reply.subject, ERROR_SUBJECT)
        self.assertIn("error", json.loads(reply.content[0]))


class RealBrokerTests(SynchronousTestCase):
    """C{$broker} of a real broker process, asked with the blocking client."""

    skip = skip_slow

    def test_overviewOverSocket(self) -> None:
        """The blocking client asks $broker for sections and gets them by mail."""
        broker = BrokerProcess(Path(self.mktemp()))
        self.addCleanup(broker.stop)
        broker.start()
        client = BlockingClient(broker.endpoint, "ops-cli", timeout=10.0)
        self.addCleanup(client.close)
        for section in ("overview", "clients", "nonsense"):
            client.sendfor(SERVICE, section, [b""], tracker=f"t-{section}")
            delivery = client.recv(timeout=10.0)
            assert delivery is not None, f"no answer to {section}"
            self.assertEqual(delivery.address, "ops-cli")
            self.assertEqual(delivery.tracker, f"t-{section}")
            body = json.loads(delivery.content[0])
            if section == "overview":
                self.assertEqual(delivery.subject, "overview")
                self.assertEqual(body["clients"], 1)
                self.assertEqual(body["endpoints"], [broker.endpoint])
            elif section == "clients":
                addresses = {c["address"] for c in body if not c["internal"]}
                self.assertEqual(addresses, {"ops-cli"})
            else:
                self.assertEqual(delivery.subject, ERROR_SUBJECT)
