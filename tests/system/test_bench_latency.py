"""
Tests for L{malamute_pack.bench.latency}: the paced sender's schedule (a
pure function of time), the stamped payload, the latency line's figures,
both roles against a scripted broker side on real sockets, and, as a slow
system test, a short ``--scenario latency`` run against a real broker.
"""

from __future__ import annotations

import subprocess
import sys
from time import monotonic

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import latency, load
from malamute_pack.bench.scenarios import LATENCY, SCENARIOS, Result
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import PROJECT_ROOT
from tests.support import skip_slow
from tests.system.test_bench import BrokerSide

LATENCY_KEYS = [
    "scenario",
    "journal",
    "rate",
    "n",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "lost",
    "achieved_per_s",
    "behind",
]


def simulate(rate: int, n: int, lateness: float = 0.0) -> list[tuple[float, int]]:
    """
    The paced sender's loop on a fake clock: each wake-up's time and how
    many messages have been sent by then, every wake-up C{lateness}
    seconds after the time it asked for.
    """
    elapsed, sent, wakes = 0.0, 0, []
    while sent < n:
        sent = latency.due(elapsed, rate, n)
        wakes.append((elapsed, sent))
        elapsed = latency.next_wake(elapsed, sent, rate) + lateness
    return wakes


class ScheduleTests(SynchronousTestCase):
    def test_due(self) -> None:
        """Message M is due at M / rate: one at once, then one more each 1/rate seconds."""
        self.assertEqual(latency.due(-0.1, 1000, 10), 0)
        self.assertEqual(latency.due(0.0, 1000, 10), 1)
        self.assertEqual(latency.due(0.0009, 1000, 10), 1)
        self.assertEqual(latency.due(0.001, 1000, 10), 2)
        self.assertEqual(latency.due(0.001, 50_000, 1000), 51)
        self.assertEqual(latency.due(5.0, 1000, 10), 10)

    def test_nextWake(self) -> None:
        """
        A sender wakes when its next message is due, but at most once a
        tick: at a high rate it sends a burst each tick.
        """
        self.assertAlmostEqual(latency.next_wake(0.0002, 1, 1000), 0.001)
        self.assertAlmostEqual(latency.next_wake(0.001, 51, 50_000), 0.002)
        self.assertAlmostEqual(latency.next_wake(0.0, 1, 10), 0.1)

    def test_lowRateOneByOne(self) -> None:
        """At 1000 msgs/s on time, the sender wakes once a message, each one sent when due."""
        wakes = simulate(1000, 50)
        self.assertEqual([sent for _, sent in wakes], list(range(1, 51)))
        for (elapsed, _), expected in zip(wakes, range(50), strict=True):
            self.assertAlmostEqual(elapsed, expected / 1000)

    def test_highRateInTicks(self) -> None:
        """At 50,000 msgs/s it sends some 50 messages a tick, a tick apart."""
        wakes = simulate(50_000, 1000)
        self.assertEqual(len(wakes), 21)
        self.assertEqual([sent for _, sent in wakes[:3]], [1, 51, 101])
        self.assertAlmostEqual(wakes[1][0] - wakes[0][0], latency.TICK)

    def test_lateWakeUpsCatchUp(self) -> None:
        """
        Woken late every time, the sender sends what fell due meanwhile, so
        the last message still goes out when the rate says (plus at most
        one lateness), not n latenesses later.
        """
        wakes = simulate(1000, 100, lateness=0.0004)
        last_time, last_sent = wakes[-1]
        self.assertEqual(last_sent, 100)
        self.assertLess(last_time, 99 / 1000 + 0.0004 + latency.TICK)

    def test_achievedAndBehind(self) -> None:
        """The achieved rate runs first to last send; short of 98% of the rate is behind."""
        self.assertEqual(latency.achieved(1001, 10.0, 11.0), 1000)
        self.assertEqual(latency.achieved(1, 10.0, 10.0), 0)
        self.assertEqual(latency.achieved(5, None, None), 0)
        self.assertFalse(latency.behind(1000, 990))
        self.assertTrue(latency.behind(1000, 970))
        self.assertFalse(latency.behind(0, 0))

    def test_stamp(self) -> None:
        """A payload is 100 bytes and carries its send time exactly."""
        payload = latency.stamped(1234.5678)
        self.assertEqual(len(payload), latency.PAYLOAD_BYTES)
        self.assertEqual(latency.stamp_of(payload), 1234.5678)


class FiguresTests(SynchronousTestCase):
    def test_latencyLine(self) -> None:
        """
        The latency line gives the rate, the reader's latency percentiles
        in microseconds, what it lost, the rate the writer achieved and
        whether it fell behind.
        """
        scenario = SCENARIOS[LATENCY]
        samples = [i / 1e6 for i in range(1, 1001)]
        reports = (
            load.Report(received=1000, last_receipt=12.0, samples=samples),
            load.Report(sent=1001, first_send=10.0, last_send=11.0),
        )
        self.assertEqual(
            Result(scenario, 1001, reports, journal=True, rate=1000).line(),
            "scenario=latency journal=on rate=1000 n=1001 p50_us=500 p99_us=990 p999_us=999 "
            "max_us=1000 lost=1 achieved_per_s=1000 behind=0",
        )

    def test_behindFlag(self) -> None:
        """A writer that achieved well under its rate is flagged behind=1."""
        scenario = SCENARIOS[LATENCY]
        reports = (
            load.Report(received=11, samples=[0.001] * 11),
            load.Report(sent=11, first_send=0.0, last_send=1.0),
        )
        figures = Result(scenario, 11, reports, rate=50).figures()
        self.assertEqual((figures["achieved_per_s"], figures["behind"]), ("10", "1"))


class RoleTests(SynchronousTestCase):
    """The two roles against a scripted broker side on real sockets."""

    def test_paceSendsStampedMessages(self) -> None:
        """
        The writer sends its n messages, each its STREAM_SEND header with a
        payload stamped with a send time between its first and last send,
        in order.
        """
        side = BrokerSide(self)
        header = mlm.encode_header(mlm.StreamSend("bench"))
        role = load.Role("writer", latency.pace, frames=(header,))
        report = latency.pace(side.link, role, load.Job(20, rate=5000))
        self.assertEqual(report.sent, 20)
        assert report.first_send is not None and report.last_send is not None
        got = side.received()
        self.assertEqual(len(got), 20)
        stamps = []
        for message in got:
            assert isinstance(message, mlm.StreamSend)
            self.assertEqual(message.subject, "bench")
            stamps.append(latency.stamp_of(message.content[0]))
        self.assertEqual(stamps, sorted(stamps))
        self.assertTrue(report.first_send <= stamps[0] and stamps[-1] == report.last_send)

    def test_readTakesLatencies(self) -> None:
        """
        The reader takes receipt time minus the payload's time for each
        STREAM_DELIVER, skips anything else, and gives up after its idle
        time with what it has.
        """
        side = BrokerSide(self)
        sent_at = monotonic() - 0.05
        deliver = mlm.StreamDeliver("bench", "writer", "bench", [latency.stamped(sent_at)])
        side.send(deliver, mlm.ConnectionPong(), deliver)
        role = load.Role("reader", latency.read, counts=mlm.StreamDeliver.ID)
        report = latency.read(side.link, role, load.Job(3, idle=0.3))
        self.assertEqual(report.received, 2)
        self.assertEqual(len(report.samples), 2)
        for sample in report.samples:
            self.assertTrue(0.05 <= sample < 60, sample)


class LatencyCommandTests(SynchronousTestCase):
    skip = skip_slow

    def test_lowRate(self) -> None:
        """
        ``--scenario latency`` at 200 msgs/s for 200 messages (one second)
        against the bench's own journal-on broker prints one latency line
        with its keys, ordered percentiles, nothing lost and the rate kept.
        """
        options = ["--rates", "200", "--messages", "200", "--journal", "on"]
        result = subprocess.run(
            [sys.executable, "-m", "malamute_pack.bench", "--scenario", "latency", *options],
            cwd=PROJECT_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        (line,) = result.stdout.splitlines()
        fields = dict(token.split("=", 1) for token in line.split())
        self.assertEqual(list(fields), LATENCY_KEYS, line)
        self.assertEqual((fields["rate"], fields["n"], fields["lost"]), ("200", "200", "0"))
        percentiles = [int(fields[k]) for k in ("p50_us", "p99_us", "p999_us", "max_us")]
        self.assertEqual(percentiles, sorted(percentiles), line)
        self.assertGreater(percentiles[0], 0, line)
        self.assertGreater(int(fields["achieved_per_s"]), 0, line)
