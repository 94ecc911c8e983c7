"""
Tests for L{malamute_pack.ops.metrics}: the Prometheus text of a real
broker's statistics (a broker model with real MLM sessions and traffic),
parsed back with C{prometheus_client}'s own parser: the figures the API
gives, counters as C{*_total}, per-stream and per-mailbox labels, the
label sets bounded with the rest summed into C{other}, and a private
registry per renderer.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import zmq
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from twisted.internet import reactor
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.ops.metrics import MAX_LABEL_SETS, OTHER, MetricsRenderer, bounded
from malamute_pack.pack.feature import FEATURE as PACK
from malamute_pack.pack.service import PackService
from malamute_pack.protocol import mlm
from malamute_pack.settings import PackSettings
from malamute_pack.transport.curve import KeyPair, LinkCurve
from malamute_pack.transport.zap import CLIENT_DOMAIN, KeyAllowList, ZapHandler
from tests.ops_support import WRITER, busy_broker


def samples(text: str) -> dict[str, list[Sample]]:
    """The samples of every family in C{text}, by sample name."""
    found: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


def value(found: dict[str, list[Sample]], metric: str, /, **labels: str) -> float:
    """The value of the one sample C{metric} with C{labels}."""
    matching = [s.value for s in found.get(metric, []) if s.labels == labels]
    if len(matching) != 1:
        raise AssertionError(f"{len(matching)} samples {metric}{labels}: {found.get(metric)}")
    return matching[0]


class RenderTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.harness, self.statistics = busy_broker(self)
        self.found = samples(MetricsRenderer(self.statistics).render().decode())

    def test_overviewFigures(self) -> None:
        """The overview's counters are C{*_total} counters and its counts gauges."""
        counters = self.statistics.overview()["counters"]
        self.assertEqual(value(self.found, "malamute_stream_messages_total"), 3)
        self.assertEqual(
            value(self.found, "malamute_mailbox_messages_total"), counters["mailbox_messages"]
        )
        self.assertEqual(value(self.found, "malamute_service_requests_total"), 1)
        self.assertEqual(value(self.found, "malamute_clients"), 2)
        self.assertEqual(value(self.found, "malamute_streams"), 1)
        self.assertEqual(value(self.found, "malamute_mailboxes"), 1)
        self.assertEqual(value(self.found, "malamute_services"), 1)
        self.assertIn("malamute_uptime_seconds", self.found)
        self.assertIn("malamute_build_info", self.found)

    def test_perStream(self) -> None:
        """Each stream has its messages, deliveries, writers and readers under its label."""
        self.assertEqual(
            value(self.found, "malamute_stream_messages_written_total", stream="weather"), 3
        )
        self.assertEqual(
            value(self.found, "malamute_stream_messages_delivered_total", stream="weather"), 3
        )
        self.assertEqual(value(self.found, "malamute_stream_writers", stream="weather"), 1)
        self.assertEqual(value(self.found, "malamute_stream_readers", stream="weather"), 1)

    def test_perMailboxAndService(self) -> None:
        """Mailbox and service depths are gauges under their names."""
        self.assertEqual(value(self.found, "malamute_mailbox_depth", address="inbox"), 2)
        self.assertEqual(value(self.found, "malamute_mailbox_bytes", address="inbox"), 10)
        self.assertEqual(value(self.found, "malamute_service_depth", service="echo"), 1)
        self.assertEqual(value(self.found, "malamute_service_workers", service="echo"), 0)

    def test_journalAndLimits(self) -> None:
        """A broker without a journal says so; its limits are gauges by config name."""
        self.assertEqual(value(self.found, "malamute_journal_enabled"), 0)
        limits = self.statistics.limits()["limits"]
        self.assertEqual(
            value(self.found, "malamute_limit", name="max-clients"), limits["max-clients"]
        )

    def test_processFigures(self) -> None:
        """The process's own figures come with them."""
        self.assertIn("process_resident_memory_bytes", self.found)

    def test_loginsRefused(self) -> None:
        """The API's refused logins are a counter when there is an API."""
        found = samples(MetricsRenderer(self.statistics, lambda: 4).render().decode())
        self.assertEqual(value(found, "malamute_http_logins_refused_total"), 4)
        self.assertNotIn("malamute_http_logins_refused_total", self.found)

    def test_zap(self) -> None:
        """
        With a ZAP handler, its answers are counters by domain and its
        throttle's waiting refusals and tracked pairs are gauges; without
        one there is no such family.
        """
        clock = self.harness.clock
        zap = ZapHandler(clock, zmq.Context.instance(), {"admin": "secret"})  # type: ignore[arg-type]
        self.statistics.zap = zap
        for _ in range(3):  # a first refusal is answered at once, the next two wait
            zap.answer([b"p", b"", b"1.0", b"1", CLIENT_DOMAIN, b"10.0.0.1", b"", b"NULL"])
        found = samples(MetricsRenderer(self.statistics).render().decode())
        self.assertEqual(value(found, "malamute_zap_refused_total", domain="client"), 3)
        self.assertEqual(value(found, "malamute_zap_throttled_total", domain="client"), 2)
        self.assertEqual(value(found, "malamute_zap_hurried_total", domain="client"), 0)
        self.assertEqual(value(found, "malamute_zap_accepted_total", domain="client"), 0)
        self.assertEqual(value(found, "malamute_zap_pending"), 2)
        self.assertEqual(value(found, "malamute_zap_tracked"), 1)
        self.assertNotIn("malamute_zap_pending", self.found)
        self.harness.clock.advance(10)

    def test_pack(self) -> None:
        """
        A broker in a CURVE pack shows its members, the nodes it turned
        away, by reason, and its consumer groups across the pack; one in no
        pack shows no such family.
        """
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        public, secret = zmq.curve_keypair()
        data_dir = Path(self.mktemp())
        data_dir.mkdir()
        service = PackService(
            reactor,
            context,
            self.harness.broker,
            None,
            PackSettings(
                name="p", gossip_bind=("tcp://127.0.0.1:*",), peer_endpoint="tcp://127.0.0.1:*"
            ),
            data_dir,
            LinkCurve(KeyPair(public, secret), KeyAllowList("pack peer", {}, "keys")),
        )
        service.startService()
        self.addCleanup(service.stopService)
        self.statistics.show("pack", PACK.shown(service, PackSettings(name="p")))
        assert service.zyre is not None
        stranger, _ = zmq.curve_keypair()
        service.zyre.node.discovered(b"s" * 16, "tcp://127.0.0.1:1", stranger)
        service.zyre.node.discovered(b"o" * 16, "tcp://127.0.0.1:2", None)
        found = samples(MetricsRenderer(self.statistics).render().decode())
        self.assertEqual(value(found, "malamute_pack_members"), 0)
        self.assertEqual(value(found, "malamute_pack_refused_total", reason="not_listed"), 1)
        self.assertEqual(value(found, "malamute_pack_refused_total", reason="no_key"), 1)
        self.assertEqual(value(found, "malamute_pack_owner_claims_total", outcome="learned"), 0)
        self.assertEqual(value(found, "malamute_pack_group_memberships"), 0)
        self.assertEqual(value(found, "malamute_pack_group_events_total", event="moved"), 0)
        self.assertNotIn("malamute_pack_members", self.found)

    def test_liveFigures(self) -> None:
        """Each render reads the statistics afresh."""
        self.harness.send(WRITER, mlm.StreamSend("temp.9", [b"y"]))
        found = samples(MetricsRenderer(self.statistics).render().decode())
        self.assertEqual(value(found, "malamute_stream_messages_total"), 4)

    def test_privateRegistries(self) -> None:
        """Two renderers (two brokers in one process) do not collide."""
        first = MetricsRenderer(self.statistics)
        second = MetricsRenderer(self.statistics)
        for renderer in (first, second):
            self.assertEqual(value(samples(renderer.render().decode()), "malamute_streams"), 1)
        self.assertNotIn(b"malamute_streams", generate_latest(REGISTRY))


class JournalMetricsTests(SynchronousTestCase):
    def test_journal(self) -> None:
        """A journaling broker's journal figures are counters and gauges."""
        directory = Path(self.mktemp())
        directory.mkdir()
        harness, statistics = busy_broker(self, directory / "journal.sqlite")
        harness.settle()
        found = samples(MetricsRenderer(statistics).render().decode())
        journal = statistics.journal()
        self.assertEqual(value(found, "malamute_journal_enabled"), 1)
        self.assertEqual(
            value(found, "malamute_journal_records_written_total"), journal["records_written"]
        )
        self.assertGreaterEqual(journal["records_written"], 3)
        self.assertEqual(value(found, "malamute_journal_size_bytes"), journal["size_bytes"])
        if journal["commit_latency_ms"] is not None:
            self.assertEqual(
                value(found, "malamute_journal_commit_latency_seconds", quantile="1"),
                journal["commit_latency_ms"]["max"] / 1000,
            )


class ConsumerMetricsTests(SynchronousTestCase):
    def test_consumer(self) -> None:
        """A consumer's position and lag are gauges labelled STREAM/NAME."""
        directory = Path(self.mktemp())
        directory.mkdir()
        harness, statistics = busy_broker(self, directory / "journal.sqlite")
        harness.settle()
        found = samples(MetricsRenderer(statistics).render().decode())
        self.assertEqual(value(found, "malamute_consumer_position", consumer="weather/billing"), 2)
        self.assertEqual(value(found, "malamute_consumer_lag", consumer="weather/billing"), 1)


class BoundedTests(SynchronousTestCase):
    COLUMNS = (
        ("depth", "depth", False, "", "sum"),
        ("oldest_s", "oldest_seconds", False, "", "max"),
    )

    def rows(self, n: int) -> Iterable[dict[str, object]]:
        return (
            {"address": f"box{i:05d}", "depth": 1, "oldest_s": float(i), "connected": False}
            for i in range(n)
        )

    def test_underTheBound(self) -> None:
        """Up to the bound every name has its own label set; nulls are left out."""
        rows = list(self.rows(3))
        rows[0]["oldest_s"] = None
        found = bounded(rows, "address", self.COLUMNS)
        self.assertEqual(sorted(found), ["box00000", "box00001", "box00002"])
        self.assertEqual(found["box00000"], {"depth": 1})

    def test_overTheBoundSummedIntoOther(self) -> None:
        """Past the bound, the last names in sorted order are summed (ages: the maximum)."""
        found = bounded(self.rows(MAX_LABEL_SETS + 10), "address", self.COLUMNS)
        self.assertEqual(len(found), MAX_LABEL_SETS)
        self.assertEqual(found[OTHER], {"depth": 11, "oldest_s": MAX_LABEL_SETS + 9})
        self.assertIn("box00000", found)
        self.assertNotIn(f"box{MAX_LABEL_SETS:05d}", found)

    def test_nameOther(self) -> None:
        """A real name C{other} is counted in that bucket, never twice."""
        rows = [*self.rows(MAX_LABEL_SETS + 1), {"address": OTHER, "depth": 5}]
        found = bounded(rows, "address", self.COLUMNS)
        self.assertEqual(len(found), MAX_LABEL_SETS)
        self.assertEqual(found[OTHER]["depth"], 2 + 5)

    def test_renderedBounded(self) -> None:
        """A broker with more mailboxes than the bound renders at most the bound per family."""
        harness, statistics = busy_broker(self)
        for n in range(MAX_LABEL_SETS + 5):
            harness.send(WRITER, mlm.MailboxSend(f"many.{n:05d}", "s", "", 0, [b"z"]))
        found = samples(MetricsRenderer(statistics).render().decode())
        depths = found["malamute_mailbox_depth"]
        self.assertEqual(len(depths), MAX_LABEL_SETS)
        self.assertEqual(sum(s.value for s in depths), MAX_LABEL_SETS + 5 + 2)
        # 1006 mailboxes: the first 999 by name, the last 7 summed.
        self.assertEqual(value(found, "malamute_mailbox_depth", address=OTHER), 7)
