"""
Tests for L{malamute_pack.ops.service} and its wiring in the tap: the
options and config keys (C{--http}, C{--stats-interval}), the service's
start and stop (statistics, C{$broker}, the counters' log line), readiness,
the management API listening on a real port with its one log line, and a
real broker process started with both options.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
from pathlib import Path

import zmq
from twisted.internet import reactor
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import ServerFactory
from twisted.logger import formatEvent
from twisted.python import usage
from twisted.trial.unittest import SynchronousTestCase, TestCase
from twisted.web.client import Agent, readBody

from malamute_pack import settings as _settings
from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import Journal
from malamute_pack.ops.management import SERVICE
from malamute_pack.ops.service import OperationsService, stats_line
from malamute_pack.startup import StartupError
from malamute_pack.tap import Options, makeBrokerService
from malamute_pack.testing.brokerprocess import BrokerProcess
from malamute_pack.transport.router import RouterService
from malamute_pack.zpl import load_zpl
from tests.clock_support import ThreadedClock
from tests.support import capture_log, skip_slow

LOCAL_HTTP = "tcp:0:interface=127.0.0.1"


def parse(*args: str) -> _settings.Settings:
    options = Options()
    options.parseOptions(list(args))
    result = options["settings"]
    assert isinstance(result, _settings.Settings)
    return result


def messages(events: list[dict[str, object]]) -> list[str]:
    return [formatEvent(event) for event in events]


class OptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """By default there is no management API and no counters' line."""
        found = parse()
        self.assertIsNone(found.http)
        self.assertIsNone(found.stats_interval)

    def test_options(self) -> None:
        """--http takes a strports endpoint, --stats-interval seconds."""
        found = parse("--http", LOCAL_HTTP, "--stats-interval", "2.5")
        self.assertEqual(found.http, LOCAL_HTTP)
        self.assertEqual(found.stats_interval, 2.5)

    def test_configKeys(self) -> None:
        """malamute/http/endpoint and malamute/stats/interval set them; options win."""
        path = Path(self.mktemp())
        path.write_text(
            "malamute\n    http\n        endpoint = tcp:8180\n    stats\n        interval = 10\n"
        )
        found = _settings.from_zpl(load_zpl(path))
        self.assertEqual((found.http, found.stats_interval), ("tcp:8180", 10.0))
        found = parse("-c", str(path), "--stats-interval", "1")
        self.assertEqual((found.http, found.stats_interval), ("tcp:8180", 1.0))

    def test_badInterval(self) -> None:
        """An interval that is not a positive number of seconds is refused, saying so."""
        for value in ("soon", "0", "-1", "inf"):
            e = self.assertRaises(usage.UsageError, parse, "--stats-interval", value)
            self.assertIn("--stats-interval", str(e))

    def test_badHttpEndpoint(self) -> None:
        """An --http that is no server endpoint is refused when the service is made."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        found = dataclasses.replace(parse("-d", self.mktemp()), http="nonsense:8180", journal=False)
        e = self.assertRaises(usage.UsageError, makeBrokerService, found, reactor, context)
        self.assertIn("--http 'nonsense:8180'", str(e))

    def test_operationsInTheTap(self) -> None:
        """The tap's operations start after the broker and its sockets."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        top = makeBrokerService(parse("-d", self.mktemp()), reactor, context)
        operations = top.getServiceNamed("operations")
        assert isinstance(operations, OperationsService)
        names = [service.name for service in top]
        self.assertGreater(names.index("operations"), names.index("broker"))
        self.assertGreater(names.index("operations"), names.index("router"))
        self.assertIsNone(operations.statistics.pair)
        self.assertIsNone(operations.statistics.pack)


class ServiceTests(SynchronousTestCase):
    """The service on a clock, with a model and no sockets."""

    def setUp(self) -> None:
        self.clock = ThreadedClock()
        self.broker = Broker(self.clock, BrokerConfig())

    def make(self, **changes: object) -> OperationsService:
        found = dataclasses.replace(_settings.Settings(), **changes)  # type: ignore[arg-type]
        return OperationsService(self.clock, self.broker, None, found)

    def test_startAndStop(self) -> None:
        """
        Started, it samples the counters and offers $broker; stopped, it
        does neither.
        """
        service = self.make()
        service.startService()
        self.assertEqual(self.broker.post.services[SERVICE].offers.owner_count(), 1)
        for _ in range(3):
            self.clock.advance(1.0)
        self.assertEqual(len(service.statistics.history()), 3)
        service.stopService()
        self.assertEqual(self.broker.post.services[SERVICE].offers.owner_count(), 0)
        self.clock.advance(3.0)
        self.assertEqual(len(service.statistics.history()), 3)
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_statsInterval(self) -> None:
        """With a stats interval, one info line of counters every interval."""
        events = capture_log(self)
        service = self.make(stats_interval=2.0)
        service.startService()
        self.addCleanup(service.stopService)
        self.clock.advance(1.0)
        self.assertEqual([m for m in messages(events) if m.startswith("stats:")], [])
        self.clock.advance(1.0)
        self.clock.advance(2.0)
        lines = [m for m in messages(events) if m.startswith("stats:")]
        self.assertEqual(len(lines), 2)
        self.assertEqual(
            lines[0],
            "stats: 0 clients, 0 streams; stream messages 0/s, deliveries 0/s,"
            " mailbox messages 0/s, service requests 0/s",
        )

    def test_noStatsLine(self) -> None:
        """Without an interval, no counters' line."""
        events = capture_log(self)
        service = self.make()
        service.startService()
        self.addCleanup(service.stopService)
        self.clock.advance(60.0)
        self.assertEqual([m for m in messages(events) if m.startswith("stats:")], [])

    def test_statsLineWithJournal(self) -> None:
        """With a journal, the line says what it has pending; counts take plurals."""
        journal = Journal(Path(self.mktemp()) / "j.sqlite", self.clock)
        found = OperationsService(self.clock, self.broker, journal, _settings.Settings())
        self.assertTrue(
            stats_line(found.statistics).endswith("; journal pending 0 writes (0 bytes)")
        )

    def test_ready(self) -> None:
        """Ready once started, its routers bound and its journal open; else why not."""
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(context.term)
        router = RouterService(
            reactor, context, self.broker, Limits(), ["tcp://127.0.0.1:*"], "null", None
        )
        journal = Journal(Path(self.mktemp()) / "j.sqlite", self.clock)
        service = OperationsService(
            self.clock, self.broker, journal, _settings.Settings(), [router]
        )
        self.assertEqual(service.ready(), "the broker is starting")
        service.startService()
        self.addCleanup(service.stopService)
        self.assertEqual(service.ready(), "not bound to tcp://127.0.0.1:* yet")
        router.bound = ["tcp://127.0.0.1:5555"]
        self.assertEqual(service.ready(), "the journal is not open")
        self.assertEqual(service.statistics.overview()["endpoints"], ["tcp://127.0.0.1:5555"])
        without = OperationsService(self.clock, self.broker, None, _settings.Settings(), [router])
        without.startService()
        self.addCleanup(without.stopService)
        self.assertIsNone(without.ready())


class HttpTests(TestCase):
    """The management API on a real port of the real reactor."""

    def setUp(self) -> None:
        self.broker = Broker(reactor, BrokerConfig())

    async def get(self, url: str) -> tuple[int, bytes]:
        response = await Agent(reactor).request(b"GET", url.encode())
        return response.code, await readBody(response)

    def start(self, http: str) -> OperationsService:
        found = dataclasses.replace(_settings.Settings(), http=http)
        service = OperationsService(reactor, self.broker, None, found)
        service.startService()
        self.addCleanup(service.stopService)
        return service

    def test_listens(self) -> Deferred[None]:
        """
        With --http it listens, logs exactly one line with the real port,
        and serves the API and the health checks.
        """
        events = capture_log(self)
        service = self.start(LOCAL_HTTP)

        async def check() -> None:
            assert service._listening is not None
            await service._listening
            lines = [m for m in messages(events) if m.startswith("management API at")]
            self.assertEqual(len(lines), 1)
            match = re.fullmatch(r"management API at (http://127\.0\.0\.1:(\d+)/)", lines[0])
            assert match is not None, lines
            self.assertNotEqual(match.group(2), "0")
            self.assertEqual(service.url, match.group(1))
            code, body = await self.get(match.group(1) + "api/overview")
            self.assertEqual(code, 200)
            self.assertEqual(json.loads(body)["clients"], 0)
            code, _ = await self.get(match.group(1) + "healthz")
            self.assertEqual(code, 200)
            code, _ = await self.get(match.group(1) + "readyz")
            self.assertEqual(code, 200)

        return ensureDeferred(check())

    def test_portInUse(self) -> None:
        """
        A port that cannot be had fails the start with one line naming the
        endpoint and the fix: the broker does not run without the API it
        was asked for.
        """
        taken = reactor.listenTCP(0, ServerFactory(), interface="127.0.0.1")
        self.addCleanup(taken.stopListening)
        port = taken.getHost().port  # type: ignore[attr-defined]
        found = dataclasses.replace(_settings.Settings(), http=f"tcp:{port}:interface=127.0.0.1")
        service = OperationsService(reactor, self.broker, None, found)
        self.addCleanup(service.stopService)
        error = self.assertRaises(StartupError, service.startService)
        self.assertIn(f"cannot listen on tcp:{port}:interface=127.0.0.1", str(error))
        self.assertIn("give --http another endpoint", str(error))
        self.assertIsNone(service.url)


class RealBrokerTests(SynchronousTestCase):
    """A broker process started with --http and --stats-interval."""

    skip = skip_slow

    def test_httpAndStatsLine(self) -> None:
        """It logs its management API's URL, serves it, and logs counters every second."""
        broker = BrokerProcess(
            Path(self.mktemp()), args=("--http", LOCAL_HTTP, "--stats-interval", "1")
        )
        self.addCleanup(broker.stop)
        broker.start()
        url = broker.http_url
        with urllib.request.urlopen(url + "api/overview", timeout=10) as response:
            overview = json.loads(response.read())
        self.assertEqual(overview["endpoints"], [broker.endpoint])
        self.assertIs(overview["journal"], True)
        broker.wait_log(r"stats: \d+ clients?, \d+ streams?; .*; journal pending", 10.0)
