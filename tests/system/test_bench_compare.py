"""
Tests for L{malamute_pack.bench.compare} (the order of the brokers in each
round, medians, ratios and the comparison lines) and
L{malamute_pack.bench.plays} (what a broker can play), and, as a slow
system test, a short ``--compare`` run against a second broker of ours.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench.compare import compare_lines, median, order, ratio
from malamute_pack.bench.plays import Target, skip_reason
from malamute_pack.bench.scenarios import SCENARIOS
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, BrokerProcess
from tests.support import skip_slow


def _run(scenario: str, broker: str, **figures: str) -> dict[str, str]:
    return {"scenario": scenario, "broker": broker, **figures}


class OrderTests(SynchronousTestCase):
    def test_alternates(self) -> None:
        """Ours plays first in even rounds, the other broker in odd ones."""
        self.assertEqual(
            [order(r) for r in range(4)],
            [("ours", "other"), ("other", "ours"), ("ours", "other"), ("other", "ours")],
        )


class MedianRatioTests(SynchronousTestCase):
    def test_median(self) -> None:
        """The median keeps the figures' precision; of an even count it is the mean of the two."""
        self.assertEqual(median(["300", "100", "200"]), "200")
        self.assertEqual(median(["100", "201"]), "150")
        self.assertEqual(median(["1.25", "0.5", "2.0"]), "1.25")

    def test_ratio(self) -> None:
        """A ratio has two decimals and is 0, not an error, over nothing."""
        self.assertEqual(ratio("150", "100"), "1.50")
        self.assertEqual(ratio("5", "0"), "0")


class CompareLinesTests(SynchronousTestCase):
    def test_throughput(self) -> None:
        """
        A scenario run against both brokers gets a line of medians, the
        ratio ours over other and the rounds; lines come in the order the
        scenarios first ran.
        """
        runs = [
            _run("mailbox", "ours", msgs_per_s="100"),
            _run("stream_1to1", "other", msgs_per_s="50"),
            _run("mailbox", "other", msgs_per_s="400"),
            _run("stream_1to1", "ours", msgs_per_s="100"),
            _run("mailbox", "other", msgs_per_s="200"),
            _run("mailbox", "ours", msgs_per_s="300"),
            _run("mailbox", "ours", msgs_per_s="200"),
        ]
        self.assertEqual(
            compare_lines(runs),
            [
                "compare scenario=mailbox ours_msgs_per_s=200 other_msgs_per_s=300 ratio=0.67 "
                "rounds=2",
                "compare scenario=stream_1to1 ours_msgs_per_s=100 other_msgs_per_s=50 ratio=2.00 "
                "rounds=1",
            ],
        )

    def test_oneSidedIsNotCompared(self) -> None:
        """A scenario that ran against one broker only (skipped on the other) gets no line."""
        runs = [_run("mailbox_durable", "ours", msgs_per_s="100")] * 3
        self.assertEqual(compare_lines(runs), [])

    def test_fanoutDeliveries(self) -> None:
        """Fan-out compares deliveries per second too, ours over other."""
        runs = [
            _run("stream_fanout10", "ours", msgs_per_s="10", delivered_per_s="100"),
            _run("stream_fanout10", "other", msgs_per_s="20", delivered_per_s="200"),
        ]
        self.assertEqual(
            compare_lines(runs),
            [
                "compare scenario=stream_fanout10 ours_msgs_per_s=10 other_msgs_per_s=20 "
                "ratio=0.50 ours_delivered_per_s=100 other_delivered_per_s=200 "
                "delivered_ratio=0.50 rounds=1"
            ],
        )

    def test_percentilesOtherOverOurs(self) -> None:
        """
        Service round trips compare their p50 and p99 as other over ours,
        so that above 1 means ours is better, as for throughput.
        """
        runs = [
            _run("service_rr", "ours", msgs_per_s="1000", p50_us="400", p99_us="1000"),
            _run("service_rr", "other", msgs_per_s="2000", p50_us="200", p99_us="3000"),
        ]
        self.assertEqual(
            compare_lines(runs),
            [
                "compare scenario=service_rr ours_msgs_per_s=1000 other_msgs_per_s=2000 "
                "ratio=0.50 ours_p50_us=400 other_p50_us=200 p50_ratio_other_over_ours=0.50 "
                "ours_p99_us=1000 other_p99_us=3000 p99_ratio_other_over_ours=3.00 rounds=1"
            ],
        )

    def test_latencyPerRate(self) -> None:
        """Latency is compared rate by rate: its achieved rate and its percentiles."""
        runs = []
        for rate, ours_p99 in (("1000", "100"), ("50000", "900")):
            for broker, p99 in (("ours", ours_p99), ("other", "300")):
                runs.append(
                    _run(
                        "latency",
                        broker,
                        rate=rate,
                        achieved_per_s=rate,
                        p50_us="50",
                        p99_us=p99,
                        p999_us=p99,
                    )
                )
        lines = compare_lines(runs)
        self.assertEqual(len(lines), 2)
        self.assertTrue(lines[0].startswith("compare scenario=latency rate=1000 "), lines[0])
        self.assertIn(" p99_ratio_other_over_ours=3.00 ", lines[0])
        self.assertTrue(lines[1].startswith("compare scenario=latency rate=50000 "), lines[1])
        self.assertIn(" ours_achieved_per_s=50000 other_achieved_per_s=50000 ratio=1.00 ", lines[1])
        self.assertIn(" p99_ratio_other_over_ours=0.33 ", lines[1])

    def test_scale(self) -> None:
        """Scale compares its throughput with the clients, its own ratio and memory."""
        rows = (("ours", "900", "0.90", "8.00"), ("other", "600", "0.95", "4.00"))
        runs = [
            _run(
                "scale",
                broker,
                with_msgs_per_s=rate,
                ratio=own,
                rss_per_client_kib=kib,
                rss_per_subscription_b="100",
            )
            for broker, rate, own, kib in rows
        ]
        self.assertEqual(
            compare_lines(runs),
            [
                "compare scenario=scale ours_msgs_per_s=900 other_msgs_per_s=600 ratio=1.50 "
                "ours_with_over_without=0.90 other_with_over_without=0.95 "
                "ours_rss_per_client_kib=8.00 other_rss_per_client_kib=4.00 "
                "rss_per_client_ratio_other_over_ours=0.50 ours_rss_per_subscription_b=100 "
                "other_rss_per_subscription_b=100 rounds=1"
            ],
        )

    def test_scaleMemoryFromTheFirstRound(self) -> None:
        """
        Scale's memory figures come from each broker's first run alone (a
        later run on the same process reuses what the first freed); its
        throughput is still the median of every round.
        """
        rows = (
            ("ours", "900", "29.00", "2000"),
            ("other", "600", "28.00", "900"),
            ("other", "700", "14.00", "400"),
            ("ours", "1000", "15.00", "500"),
            ("ours", "1100", "14.50", "450"),
            ("other", "800", "13.00", "300"),
        )
        runs = [
            _run(
                "scale",
                broker,
                with_msgs_per_s=rate,
                ratio="1.00",
                rss_per_client_kib=kib,
                rss_per_subscription_b=per_read,
            )
            for broker, rate, kib, per_read in rows
        ]
        [line] = compare_lines(runs)
        self.assertIn(" ours_msgs_per_s=1000 other_msgs_per_s=700 ", line)
        self.assertIn(" ours_rss_per_client_kib=29.00 other_rss_per_client_kib=28.00 ", line)
        self.assertIn(" rss_per_client_ratio_other_over_ours=0.97 ", line)
        self.assertIn(" ours_rss_per_subscription_b=2000 other_rss_per_subscription_b=900 ", line)
        self.assertTrue(line.endswith(" rounds=3"), line)


class SkipTests(SynchronousTestCase):
    def test_extensions(self) -> None:
        """A broker without our extensions cannot play mailbox_durable, and says why."""
        other = Target("ipc://@/x", extensions=False)
        self.assertIn("protocol version 2", skip_reason(SCENARIOS["mailbox_durable"], other))
        self.assertEqual(skip_reason(SCENARIOS["mailbox"], other), "")
        self.assertEqual(skip_reason(SCENARIOS["mailbox_durable"], Target("ipc://@/x")), "")

    def test_scaleNeedsPid(self) -> None:
        """Scale needs the broker's pid, for its memory figures."""
        self.assertIn("pid", skip_reason(SCENARIOS["scale"], Target("ipc://@/x")))
        self.assertEqual(skip_reason(SCENARIOS["scale"], Target("ipc://@/x", pid=1)), "")


class CompareCommandTests(SynchronousTestCase):
    skip = skip_slow

    def test_againstAnotherBrokerOfOurs(self) -> None:
        """
        ``--compare EP --rounds 2`` against a second broker of ours plays
        each scenario against both, alternating (ours, other; other,
        ours), each line naming its broker (only ours with a journal key);
        it skips mailbox_durable against the other with a reason, and
        prints a comparison line per scenario and latency rate.
        """
        with BrokerProcess(Path(self.mktemp())) as other:
            scenarios = ["--scenario", "stream_1to1", "--scenario", "mailbox_durable"]
            scenarios += ["--scenario", "latency", "--rates", "500"]
            options = ["--compare", other.endpoint, "--rounds", "2", "--messages", "500"]
            result = subprocess.run(
                [sys.executable, "-m", "malamute_pack.bench", *options, *scenarios],
                cwd=PROJECT_ROOT,
                capture_output=True,
                text=True,
                timeout=180,
            )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        heads = [" ".join(line.split()[: 2 if line.startswith("compare") else 3]) for line in lines]
        self.assertEqual(
            heads,
            [
                "scenario=stream_1to1 broker=ours journal=on",
                "scenario=stream_1to1 broker=other n=500",
                "scenario=stream_1to1 broker=other n=500",
                "scenario=stream_1to1 broker=ours journal=on",
                "compare scenario=stream_1to1",
                "# skipped scenario=mailbox_durable",
                "scenario=mailbox_durable broker=ours journal=on",
                "scenario=mailbox_durable broker=ours journal=on",
                "scenario=latency broker=ours journal=on",
                "scenario=latency broker=other rate=500",
                "scenario=latency broker=other rate=500",
                "scenario=latency broker=ours journal=on",
                "compare scenario=latency",
            ],
            result.stdout,
        )
        self.assertIn("protocol version 2", lines[5])
        self.assertTrue(lines[12].startswith("compare scenario=latency rate=500 "), lines[12])
        for line in (lines[4], lines[12]):
            self.assertTrue(line.endswith(" rounds=2"), line)
        for line in lines[:4] + lines[6:12]:
            self.assertIn(" lost=0", line)
