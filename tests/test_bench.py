"""
Tests for L{malamute_pack.bench}: the figures a scenario's reports make, and
short real runs of ``python -m malamute_pack.bench`` (a broker process and
load processes), which are slow system tests.
"""


from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench import load
from malamute_pack.bench.scenarios import SCENARIOS, Result
from tests.support import skip_slow

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["scenario", "n", "secs", "msgs_per_s", "lost"]
KEYS = {
    "stream_1to1": COMMON,
    "stream_fanout10": [*COMMON, "delivered_per_s"],
    "mailbox": COMMON,
    "service_rr": [*COMMON, "avg_rtt_us"],
}


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malamute_pack.bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _fields(line: str) -> list[tuple[str, str]]:
    return [tuple(token.split("=", 1)) for token in line.split()]  # type: ignore[misc]


class FiguresTests(SynchronousTestCase):
    def test_fanoutFigures(self) -> None:
        """
        Time runs from the earliest send to the latest counted receipt; lost
        is n per counting role minus what they counted; the fan-out line
        adds deliveries per second.
        """
        scenario = SCENARIOS["stream_fanout10"]
        reports = [load.Report(received=100, last_receipt=12.0) for _ in range(10)]
        reports[3] = load.Report(received=90, last_receipt=11.0)
        reports.append(load.Report(sent=100, first_send=10.0))
        line = Result(scenario, 100, tuple(reports)).line()
        self.assertEqual(
            line,
            "scenario=stream_fanout10 n=100 secs=2.000 msgs_per_s=50 lost=10 "
            "delivered_per_s=495",
        )

    def test_roundTripFigures(self) -> None:
        """The service line gives round trips per second and the mean round trip."""
        scenario = SCENARIOS["service_rr"]
        reports = (
            load.Report(sent=4),
            load.Report(sent=4, received=4, first_send=1.0, last_receipt=3.0, rtt_total=0.002),
        )
        self.assertEqual(
            Result(scenario, 4, reports).line(),
            "scenario=service_rr n=4 secs=2.000 msgs_per_s=2 lost=0 avg_rtt_us=500.0",
        )

    def test_nothingReceived(self) -> None:
        """With no receipt at all there is no duration: rates are 0 and all is lost."""
        scenario = SCENARIOS["mailbox"]
        reports = (load.Report(), load.Report(sent=5, first_send=1.0))
        self.assertEqual(
            Result(scenario, 5, reports).line(),
            "scenario=mailbox n=5 secs=0.000 msgs_per_s=0 lost=5",
        )


class BenchCommandTests(SynchronousTestCase):
    skip = skip_slow

    def test_everyScenarioPrintsItsLine(self) -> None:
        """
        A default run with 2000 messages prints one line per scenario with
        exactly that scenario's keys, loses nothing, and exits 0 (which
        includes the broker process shutting down cleanly on SIGTERM).
        """
        result = _bench("--messages", "2000")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual([_fields(line)[0][1] for line in lines], list(KEYS))
        for line in lines:
            fields = _fields(line)
            self.assertEqual([k for k, _ in fields], KEYS[fields[0][1]], line)
            values = dict(fields)
            self.assertEqual(values["n"], "2000", line)
            self.assertEqual(values["lost"], "0", line)
            self.assertGreater(float(values["secs"]), 0, line)
            self.assertGreater(float(values["msgs_per_s"]), 0, line)

    def test_profileIsWrittenAndPrinted(self) -> None:
        """
        With C{--profile} the broker runs under cProfile, shuts down cleanly
        so the profile file is written, and the command prints its top 25
        functions by own time after the scenario's line.
        """
        profile = Path(self.mktemp()).resolve()
        result = _bench(
            "--messages", "2000", "--scenario", "stream_1to1", "--profile", str(profile)
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertTrue(profile.stat().st_size > 0)
        lines = result.stdout.splitlines()
        self.assertTrue(lines[0].startswith("scenario=stream_1to1 "), lines[0])
        self.assertIn("Ordered by: internal time", result.stdout)
        self.assertIn("List reduced from", result.stdout)
        table = result.stdout.split("filename:lineno(function)", 1)[1]
        rows = [row for row in table.splitlines() if re.match(r"\s*\d", row)]
        self.assertEqual(len(rows), 25, table)
