"""
Tests for L{malamute_pack.bench.scale}: the idle clients' subscriptions
(every kind, none matching the bench subject), how clients and
subscriptions are shared out, the broker config that lets a broker of ours
hold them, the open-files limit, collecting answers over many sockets at
once on real sockets, the scale line's figures, and, as a slow system test,
a small ``--scenario scale`` run against a real broker.
"""

from __future__ import annotations

import resource
import subprocess
import sys

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import load, scale
from malamute_pack.bench.scenarios import SCENARIOS, Result
from malamute_pack.matching import parse_pattern
from malamute_pack.protocol import mlm
from malamute_pack.settings import from_zpl
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, fresh_ipc_endpoint
from malamute_pack.zpl import parse_zpl
from tests.support import skip_slow

SCALE_KEYS = [
    "scenario",
    "journal",
    "clients",
    "subscriptions",
    "n",
    "rss_base_mib",
    "rss_per_client_kib",
    "rss_per_subscription_b",
    "with_msgs_per_s",
    "without_msgs_per_s",
    "ratio",
    "lost",
    "refused",
    "connect_secs",
    "subscribe_secs",
    "rss_subscribed_mib",
    "rss_closed_mib",
    "before_msgs_per_s",
    "after_msgs_per_s",
]


class SubscriptionTests(SynchronousTestCase):
    def test_noneMatchesTheBenchSubject(self) -> None:
        """
        Every idle client's subscription is a pattern our broker accepts,
        none wants the bench subject, and no two are the same.
        """
        reads = [scale.subscription(client, slot) for client in range(30) for slot in range(10)]
        for read in reads:
            self.assertFalse(parse_pattern(read.pattern).matches("bench"), read)
        self.assertEqual(len({(r.stream, r.pattern) for r in reads}), len(reads))

    def test_everyKindOnEveryStream(self) -> None:
        """
        The subscriptions mix every pattern kind (v1 regular expressions
        included) and spread over the streams, the bench stream among them.
        """
        reads = [scale.subscription(client, slot) for client in range(6) for slot in range(12)]
        kinds = {parse_pattern(r.pattern).kind for r in reads}
        self.assertEqual(kinds, {"regex", "prefix", "topic", "mqtt", "nats", "fields"})
        self.assertEqual({r.stream for r in reads}, set(scale.STREAMS))
        self.assertIn("bench", scale.STREAMS)

    def test_theyMatchWhatTheySay(self) -> None:
        """Each pattern is live: it matches a subject made for it (so the index holds it)."""
        for offset in range(6):
            read = scale.subscription(offset, 0)
            tag = f"c{offset}s0"
            subject = {
                "regex": f"{tag}.x",
                "prefix": f"{tag}.y",
                "topic": f"{tag}.a.x",
                "mqtt": f"{tag}/a/x",
                "nats": f"{tag}.a",
                "fields": f"{tag}=1",
            }[parse_pattern(read.pattern).kind]
            self.assertTrue(parse_pattern(read.pattern).matches(subject), (read, subject))


class SharesTests(SynchronousTestCase):
    def test_spread(self) -> None:
        """Shares are as even as whole numbers allow, the larger first, summing to the total."""
        self.assertEqual(scale.spread(10, 4), [3, 3, 2, 2])
        self.assertEqual(scale.spread(8, 4), [2, 2, 2, 2])
        self.assertEqual(scale.spread(2, 4), [1, 1, 0, 0])

    def test_brokerConfig(self) -> None:
        """
        The config lets a broker of ours hold the idle clients and the
        bench's own besides, and each client's subscriptions; it never
        lowers a default limit.
        """
        settings = from_zpl(parse_zpl(scale.broker_config(10_000, 100_000)))
        self.assertEqual(settings.limits.max_clients, 10_000 + scale.CLIENT_MARGIN)
        self.assertEqual(settings.limits.max_subscriptions, 1000)
        small = from_zpl(parse_zpl(scale.broker_config(10, 50_000)))
        self.assertEqual(small.limits.max_clients, 10_000)
        self.assertEqual(small.limits.max_subscriptions, 5000)

    def test_raiseFdLimit(self) -> None:
        """Raising the open-files limit to what it is, or less, leaves it at least that."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.assertEqual(scale.raise_fd_limit(soft), soft)
        self.assertGreaterEqual(scale.raise_fd_limit(min(soft, 64)), 64)
        self.assertEqual(resource.getrlimit(resource.RLIMIT_NOFILE), (soft, hard))


class CollectTests(SynchronousTestCase):
    """L{scale.collect} over DEALERs answered by a ROUTER, on real sockets."""

    def setUp(self) -> None:
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.addCleanup(self.router.close)
        endpoint = fresh_ipc_endpoint("scale-test")
        self.router.bind(endpoint)
        self.dealers = []
        self.routes = []
        for _ in range(3):
            dealer = self.context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            self.addCleanup(dealer.close)
            dealer.connect(endpoint)
            dealer.send(b"hello")
            self.dealers.append(dealer)
            self.routes.append(self.router.recv_multipart()[0])

    def answer(self, dealer: int, *messages: mlm.Message) -> None:
        for message in messages:
            self.router.send_multipart([self.routes[dealer], *mlm.encode(message)])

    def test_okErrorAndPong(self) -> None:
        """
        OKs and ERRORs answer, the first ERROR's reason is kept, PONGs do
        not count; all answered, nothing is missing.
        """
        self.answer(0, mlm.Ok(), mlm.Ok())
        self.answer(1, mlm.ConnectionPong(), mlm.Ok(), mlm.Error(300, "too many clients"))
        self.answer(2, mlm.Error(400, "bad pattern"), mlm.Ok())
        phase = scale.collect(self.dealers, 2, 5.0)
        self.assertEqual(phase, scale.Phase(4, 2, "300 too many clients", 0))

    def test_missing(self) -> None:
        """Answers that do not come by the timeout are counted missing."""
        self.answer(0, mlm.Ok())
        phase = scale.collect(self.dealers, 1, 0.3)
        self.assertEqual((phase.ok, phase.missing), (1, 2))

    def test_phasesAdd(self) -> None:
        """Phases of several swarms add up, the first reason kept."""
        total = scale.Phase(1, 0, "", 2) + scale.Phase(2, 1, "x", 0) + scale.Phase(0, 1, "y", 1)
        self.assertEqual(total, scale.Phase(3, 2, "x", 3))


def _stream_result(rate: int, lost: int = 0) -> Result:
    """A stream_1to1 result of C{rate} messages in one second."""
    reports = (
        load.Report(received=rate - lost, last_receipt=2.0),
        load.Report(sent=rate, first_send=1.0),
    )
    return Result(SCENARIOS["stream_1to1"], rate, reports, True)


class FiguresTests(SynchronousTestCase):
    def test_scaleLine(self) -> None:
        """
        Memory per client is the growth over OPEN, per subscription the
        growth over the READs; the ratio is the run with the clients over
        the mean of the runs before and after them.
        """
        mib = 1024 * 1024
        result = scale.ScaleResult(
            clients=1000,
            subscriptions=10_000,
            n=100,
            rss=(100 * mib, 100 * mib + 1000 * 8192, 100 * mib + 1000 * 8192 + 10_000 * 300, 0),
            before=_stream_result(1000),
            within=_stream_result(900, lost=2),
            after=_stream_result(1200),
            phases=(scale.Phase(1000), scale.Phase(9999, 1, "x"), scale.Phase(1000)),
            connect_secs=1.234,
            subscribe_secs=5.0,
            journal=True,
        )
        fields = dict(token.split("=", 1) for token in result.line().split())
        self.assertEqual(list(fields), SCALE_KEYS)
        self.assertEqual(
            {k: fields[k] for k in SCALE_KEYS[5:12]},
            {
                "rss_base_mib": "100.0",
                "rss_per_client_kib": "8.00",
                "rss_per_subscription_b": "300",
                "with_msgs_per_s": "900",
                "without_msgs_per_s": "1100",
                "ratio": "0.82",
                "lost": "2",
            },
        )
        self.assertEqual((fields["refused"], fields["connect_secs"]), ("1", "1.23"))


class ScaleCommandTests(SynchronousTestCase):
    skip = skip_slow

    def test_smallScale(self) -> None:
        """
        ``--scenario scale`` with 200 clients and 2000 subscriptions
        against the bench's own broker prints its line: every client
        opened and subscribed, nothing refused or lost, the broker's memory
        and both throughputs measured.
        """
        options = ["--clients", "200", "--subscriptions", "2000", "--messages", "5000"]
        options += ["--journal", "on"]
        result = subprocess.run(
            [sys.executable, "-m", "malamute_pack.bench", "--scenario", "scale", *options],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=180,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        (line,) = result.stdout.splitlines()
        fields = dict(token.split("=", 1) for token in line.split())
        self.assertEqual(list(fields), SCALE_KEYS, line)
        self.assertEqual(
            (fields["clients"], fields["subscriptions"], fields["lost"], fields["refused"]),
            ("200", "2000", "0", "0"),
        )
        for key in ("rss_base_mib", "with_msgs_per_s", "without_msgs_per_s", "ratio"):
            self.assertGreater(float(fields[key]), 0, line)
