"""
Tests for L{malamute_pack.ops.stats} and L{malamute_pack.ops.rates}: every
section's keys and values after real traffic through a real broker model
(MLM sessions on a clock, with and without a real journal), rates from the
clock, and the history's bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import zmq
from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig
from malamute_pack.ops.rates import HISTORY, Rates
from malamute_pack.ops.service import OperationsService
from malamute_pack.ops.stats import SECTIONS, Statistics, broker_version
from malamute_pack.protocol import mlm
from malamute_pack.settings import Settings
from malamute_pack.tap import Options, makeBrokerService
from tests.broker_support import BrokerHarness
from tests.ops_support import COUNTERS, RATES, SCHEMA

W, R, M, B, S = b"writer", b"reader", b"mailer", b"bob", b"server"

OVERVIEW_KEYS = SCHEMA["overview"]
COUNTER_KEYS = COUNTERS
RATE_KEYS = RATES
CLIENT_KEYS = SCHEMA["clients"]
STREAM_KEYS = SCHEMA["streams"]
JOURNAL_KEYS = SCHEMA["journal"]


class StatisticsCase(SynchronousTestCase):
    """A broker model on a clock (a journal when C{journaled}), and its statistics."""

    journaled = False
    limits = Limits()

    def setUp(self) -> None:
        path = Path(self.mktemp()) / "journal.sqlite" if self.journaled else None
        self.h = BrokerHarness(
            BrokerConfig(timeout=3600.0, limits=self.limits),
            path,
            JournalConfig(prune_interval_s=3600),
        )
        self.addCleanup(self.h.close)
        self.h.clock.advance(1000.0)
        self.stats = Statistics(self.h.clock, self.h.broker, self.h.journal, Settings())
        self.addCleanup(self.stats.stop)

    def traffic(self) -> None:
        """A writer and a reader on stream "s" (3 messages), mail for bob, a request."""
        h = self.h
        h.open(W, "writer")
        h.command(W, mlm.StreamWrite("s"))
        h.open(R, "reader", version=2)
        h.command(R, mlm.StreamRead("s", ""))
        for subject in ("a", "b", "c"):
            h.send(W, mlm.StreamSend(subject, [b"12345"]))
        h.open(M, "mailer")
        h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        h.send(M, mlm.ServiceSend("svc", "job", "", 0, [b"work"]))
        h.settle()

    def refresh(self) -> None:
        """Take a sample and let the journal's totals come back."""
        self.stats.sample()
        self.h.clock.run_thread_calls(lambda: not self.stats.refreshing)


class OverviewTests(StatisticsCase):
    def test_overview(self) -> None:
        """
        The overview has every key, counts what the model holds and
        counts each kind of traffic.
        """
        self.traffic()
        overview = self.stats.overview()
        self.assertEqual(set(overview), OVERVIEW_KEYS)
        self.assertEqual(set(overview["counters"]), COUNTER_KEYS)
        self.assertEqual(set(overview["rates"]), RATE_KEYS)
        self.assertEqual(overview["version"], broker_version())
        self.assertEqual(overview["endpoints"], ["ipc://@/malamute"])
        self.assertIs(overview["journal"], False)
        self.assertEqual(
            (overview["clients"], overview["streams"], overview["mailboxes"]), (3, 1, 1)
        )
        self.assertEqual(overview["services"], 1)
        self.assertIsInstance(overview["rss_bytes"], int)
        self.assertGreater(overview["pid"], 0)
        self.assertEqual(overview["started"], 1000.0)
        self.h.clock.advance(5.0)
        self.assertEqual(self.stats.overview()["uptime_s"], 5.0)
        self.assertEqual(
            overview["counters"],
            {
                "stream_messages": 3,
                "stream_deliveries": 3,
                "mailbox_messages": 1,
                "service_requests": 1,
                "delivered_letters": 0,
                "refused": 0,
                "malformed": 0,
                "expired_clients": 0,
            },
        )

    def test_everySectionIsJson(self) -> None:
        """Every section named in SECTIONS is there, and encodes as JSON."""
        self.traffic()
        self.stats.start()
        self.h.clock.advance(1.0)
        for name in SECTIONS:
            json.dumps(self.stats.section(name))
        self.assertRaises(KeyError, self.stats.section, "nonsense")

    def test_optionalPartsDisabled(self) -> None:
        """Without a pack, a pair or bridges, their sections say they are not enabled."""
        self.assertEqual(self.stats.pack_status(), {"enabled": False})
        self.assertEqual(self.stats.pair_status(), {"enabled": False})
        self.assertEqual(self.stats.bridges_status(), {"enabled": False})

    def test_boundEndpoints(self) -> None:
        """The endpoints are what C{bound} gives, once set."""
        self.stats.bound = lambda: ["tcp://127.0.0.1:5555"]
        self.assertEqual(self.stats.overview()["endpoints"], ["tcp://127.0.0.1:5555"])


class RateTests(StatisticsCase):
    def test_ratesFromTheClock(self) -> None:
        """
        Rates are the counters' increase per second over the last 5 s of
        samples taken every second on the clock; the history has one entry
        a second with the rate over that second.
        """
        h = self.h
        h.open(W, "writer")
        h.command(W, mlm.StreamWrite("s"))
        self.stats.start()  # a sample at once
        for _ in range(10):
            h.send(W, mlm.StreamSend("x", [b"."]))
        h.clock.advance(1.0)
        for _ in range(20):
            h.send(W, mlm.StreamSend("x", [b"."]))
        h.clock.advance(1.0)
        self.assertEqual(self.stats.rates()["stream_messages"], 15.0)
        history = self.stats.history()
        self.assertEqual([e["stream_messages"] for e in history], [10.0, 20.0])
        self.assertEqual([e["t"] for e in history], [1001.0, 1002.0])
        self.assertEqual(set(history[0]), {"t"} | RATE_KEYS)
        self.assertEqual(self.stats.streams()[0]["rate"], 15.0)
        h.clock.advance(6.0)
        self.assertEqual(self.stats.rates()["stream_messages"], 0.0)

    def test_historyBounded(self) -> None:
        """The history keeps the last 300 one-second samples."""
        self.stats.start()
        for _ in range(HISTORY + 50):
            self.h.clock.advance(1.0)
        history = self.stats.history()
        self.assertEqual(len(history), HISTORY)
        self.assertEqual(history[-1]["t"], 1000.0 + HISTORY + 50)

    def test_stopStopsSampling(self) -> None:
        """After stop, no more samples are taken."""
        self.stats.start()
        self.h.clock.advance(1.0)
        self.stats.stop()
        self.h.clock.advance(5.0)
        self.assertEqual(len(self.stats.history()), 1)

    def test_noSampleNoRate(self) -> None:
        """Before two samples every rate is 0.0."""
        self.assertEqual(self.stats.rates(), dict.fromkeys(RATE_KEYS, 0.0))
        rates = Rates()
        rates.add(1.0, {"n": 5})
        self.assertEqual(rates.rates(), {"n": 0.0})


class ClientTests(StatisticsCase):
    def test_clients(self) -> None:
        """
        Each client's address, protocol version, credit, subscriptions,
        deliveries owed, letters held and age are shown.
        """
        h = self.h
        h.open(S, "server", version=2)
        h.command(S, mlm.ServiceOffer("svc", ".*"))
        h.command(S, mlm.StreamRead("s", "a.*"))
        h.command(S, mlm.StreamRead("s", "b.*"))
        h.send(S, mlm.Credit(10))
        h.clock.advance(3.0)
        h.open(M, "mailer")
        h.send(M, mlm.ServiceSend("svc", "job", "", 0, [b"work"]))
        h.send(M, mlm.MailboxSend("server", "hi", "", 0, [b"hello"]))
        h.clock.advance(2.0)
        clients = {c["address"]: c for c in self.stats.clients()}
        self.assertEqual(set(clients), {"server", "mailer"})
        server, mailer = clients["server"], clients["mailer"]
        self.assertEqual(set(server), CLIENT_KEYS)
        self.assertEqual(server["id"], S.hex())
        self.assertEqual((server["version"], mailer["version"]), (2, 1))
        self.assertEqual((server["credit"], mailer["credit"]), (8, None))
        self.assertEqual(server["subscriptions"], 3)
        self.assertEqual(server["held"], 2)
        self.assertEqual((server["connected_s"], mailer["connected_s"]), (5.0, 2.0))
        self.assertIs(server["internal"], False)
        self.assertIsNone(server["user"])

    def test_queued(self) -> None:
        """A client's deliveries owed: its mail waiting (out of credit)."""
        h = self.h
        h.open(B, "bob", version=2)
        h.send(B, mlm.Credit(1))
        h.open(M, "mailer")
        for _ in range(3):
            h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        clients = {c["address"]: c for c in self.stats.clients()}
        self.assertEqual(clients["bob"]["queued"], 2)
        self.assertEqual(clients["bob"]["credit"], 0)


class QueueTests(StatisticsCase):
    def test_mailboxes(self) -> None:
        """A mailbox's depth, bytes, the age of its oldest letter and whether its owner is here."""
        h = self.h
        h.open(M, "mailer")
        h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        h.clock.advance(4.0)
        h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"abc"]))
        h.clock.advance(1.0)
        self.assertEqual(
            self.stats.mailboxes(),
            [{"address": "bob", "depth": 2, "bytes": 8, "oldest_s": 5.0, "connected": False}],
        )

    def test_emptyMailbox(self) -> None:
        """An empty mailbox has no oldest letter; its owner connected shows."""
        h = self.h
        h.open(M, "mailer")
        h.send(M, mlm.MailboxSend("bob", "hi", "", 0, [b"hello"]))
        h.open(B, "bob")
        self.assertEqual(
            self.stats.mailboxes(),
            [{"address": "bob", "depth": 0, "bytes": 0, "oldest_s": None, "connected": True}],
        )

    def test_services(self) -> None:
        """A service's queue, its workers and their offers."""
        h = self.h
        h.open(M, "mailer")
        h.send(M, mlm.ServiceSend("svc", "job", "", 0, [b"work"]))
        h.clock.advance(2.0)
        found = self.stats.services()
        self.assertEqual(
            found,
            [
                {
                    "name": "svc",
                    "depth": 1,
                    "bytes": 4,
                    "oldest_s": 2.0,
                    "workers": 0,
                    "offers": 0,
                }
            ],
        )
        h.open(S, "server")
        h.command(S, mlm.ServiceOffer("svc", "x.*"))
        h.command(S, mlm.ServiceOffer("svc", "y.*"))
        h.open(B, "bob")
        h.command(B, mlm.ServiceOffer("svc", "z.*"))
        (service,) = self.stats.services()
        self.assertEqual((service["workers"], service["offers"]), (2, 3))


class LimitTests(StatisticsCase):
    limits = Limits(max_clients=1)

    def test_limits(self) -> None:
        """Limits are named as the config file spells them; refusals by reason."""
        self.h.open(W, "writer")
        self.h.send(R, mlm.ConnectionOpen(address="reader"))
        limits = self.stats.limits()
        self.assertEqual(set(limits), {"limits", "refused"})
        self.assertEqual(limits["limits"]["max-clients"], 1)
        self.assertEqual(limits["limits"]["mailbox-max-bytes"], Limits().mailbox_max_bytes)
        self.assertNotIn("max_clients", limits["limits"])
        self.assertEqual(limits["refused"], {"too many clients": 1})
        self.assertEqual(self.stats.overview()["refused_by_reason"], {"too many clients": 1})
        self.assertEqual(self.stats.overview()["counters"]["refused"], 1)


class NoJournalTests(StatisticsCase):
    def test_streamsWithoutJournal(self) -> None:
        """Without a journal, nothing is retained: no first sequence number, 0 records."""
        self.traffic()
        (stream,) = self.stats.streams()
        self.assertEqual(set(stream), STREAM_KEYS)
        self.assertEqual(
            stream,
            {
                "name": "s",
                "writers": 1,
                "readers": 1,
                "messages": 3,
                "deliveries": 3,
                "rate": 0.0,
                "first_seq": None,
                "last_seq": 3,
                "retained_records": 0,
                "retained_bytes": 0,
                "compact": None,
                "last_values": None,
                "last_values_not_kept": None,
            },
        )

    def test_journalDisabled(self) -> None:
        """Without a journal, its section says so, every other value null."""
        journal = self.stats.journal()
        self.assertTrue(set(journal) >= JOURNAL_KEYS)
        self.assertIs(journal.pop("enabled"), False)
        self.assertEqual(set(journal.values()), {None})


class JournalTests(StatisticsCase):
    journaled = True

    def test_streamsRetained(self) -> None:
        """With a journal, a stream's retained range, records and bytes come from it."""
        self.traffic()
        self.refresh()
        (stream,) = self.stats.streams()
        self.assertEqual(
            (stream["first_seq"], stream["last_seq"], stream["retained_records"]), (1, 3, 3)
        )
        self.assertGreaterEqual(stream["retained_bytes"], 15)

    def test_journalSection(self) -> None:
        """The journal's file, its commit latency and its counters."""
        self.traffic()
        journal: dict[str, Any] = self.stats.journal()
        self.assertTrue(set(journal) >= JOURNAL_KEYS)
        self.assertIs(journal["enabled"], True)
        assert self.h.journal is not None
        self.assertEqual(journal["path"], str(self.h.journal.path))
        self.assertGreater(journal["size_bytes"], 0)
        self.assertEqual((journal["pending_bytes"], journal["errors"]), (0, 0))
        self.assertGreaterEqual(journal["batches"], 1)
        self.assertGreaterEqual(journal["records_written"], 5)
        self.assertGreater(journal["bytes_written"], 0)
        latency = journal["commit_latency_ms"]
        self.assertEqual(set(latency), {"p50", "p99", "max"})
        self.assertLessEqual(latency["p50"], latency["max"])

    def test_commitLatencyFromTheClock(self) -> None:
        """A batch's commit latency is the time from its hand-over to its report."""
        h = self.h
        h.open(W, "writer")
        h.command(W, mlm.StreamWrite("s"))
        h.send(W, mlm.StreamSend("a", [b"."]))
        h.clock.advance(0)  # handed over now
        h.clock.advance(0.25)  # reported later
        h.settle()
        assert h.journal is not None
        self.assertIn(0.25, h.journal.commit_latencies)
        self.assertEqual(self.stats.journal()["commit_latency_ms"]["max"], 250.0)


class OptionalPartsTests(SynchronousTestCase):
    """The pack's, the pair's and the bridges' sections, from the tap's services."""

    def statistics(self, *args: str) -> Statistics:
        options = Options()
        options.parseOptions(["-d", self.mktemp(), "-e", "tcp://127.0.0.1:9999", *args])
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        top = makeBrokerService(options["settings"], reactor, context)
        operations = top.getServiceNamed("operations")
        assert isinstance(operations, OperationsService)
        return operations.statistics

    def test_pair(self) -> None:
        """A pair's section is what its service's status says."""
        stats = self.statistics(
            "--pair",
            "primary",
            "--pair-bind",
            "tcp://127.0.0.1:7001",
            "--pair-connect",
            "tcp://127.0.0.1:7002",
        )
        pair = stats.pair_status()
        json.dumps(pair)
        self.assertEqual(
            (pair["enabled"], pair["role"], pair["state"], pair["replication"]),
            (True, "primary", "starting", "sync"),
        )

    def test_packNotRunning(self) -> None:
        """A pack not running yet has its name and no members."""
        stats = self.statistics(
            "--pack",
            "wolves",
            "--gossip-connect",
            "tcp://127.0.0.1:7003",
            "--peer-endpoint",
            "tcp://127.0.0.1:*",
        )
        self.assertEqual(
            stats.pack_status(),
            {"enabled": True, "running": False, "name": "wolves", "members": []},
        )

    def test_bridges(self) -> None:
        """The bridges' section is what their service's status says."""
        stats = self.statistics("--bridge-out", "weather:temp.*=tcp://127.0.0.1:7002")
        bridges = stats.bridges_status()
        json.dumps(bridges)
        self.assertIs(bridges["enabled"], True)
        self.assertEqual(set(bridges), {"enabled", "outbound", "inbound"})
