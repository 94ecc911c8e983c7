"""
Tests for the pair benchmark, L{malamute_pack.bench.pair}: its options,
its figures and lines (pure), its setups' arguments, and, as slow system
tests, the command itself run with tiny counts against real brokers.
"""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from collections import Counter
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.bench.pair import (
    ASYNC,
    CURVE,
    CURVE_MODES,
    MEASURES,
    MODES,
    SINGLE,
    SYNC,
    FailoverResult,
    LoadReport,
    SetupBrokers,
    Switch,
    ThroughputResult,
    check_letters,
    link_endpoints,
    pair_arguments,
    parse,
)
from malamute_pack.bench.pair.command import DEFAULT_KILLS, DEFAULT_ROUNDS
from malamute_pack.testing.brokerprocess import PROJECT_ROOT, BrokerError
from malamute_pack.transport.curve import load_client_keys
from tests.support import skip_slow

RUN_KEYS = ["round", "mode", "scenario"]
THROUGHPUT_KEYS = [
    "measure",
    "single_per_s",
    "sync_per_s",
    "async_per_s",
    "sync_ratio",
    "async_ratio",
    "lost",
]
CURVE_KEYS = ["measure", "open_per_s", "curve_per_s", "curve_ratio", "lost"]
KILL_KEYS = ["kill", "killed", "failover_s", "kill_to_ack_s", "rejoin_s"]
SUMMARY_KEYS = [
    "kills",
    "median_s",
    "max_s",
    "sent",
    "acked",
    "lost",
    "duplicates",
    "unacked_delivered",
    "unknown",
    "refused",
]


def _bench(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "malamute_pack.bench", "pair", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _fields(line: str) -> tuple[str, list[tuple[str, str]]]:
    """A line's kind (its first word) and its C{name=value} fields in order."""
    kind, *tokens = line.split()
    return kind, [tuple(token.split("=", 1)) for token in tokens]  # type: ignore[misc]


def _run(rnd: int, mode: str, scenario: str, rate: float, lost: int = 0) -> dict[str, str]:
    return {
        "round": str(rnd),
        "mode": mode,
        "scenario": scenario,
        "n": "100",
        "secs": "1.000",
        "msgs_per_s": f"{rate:.0f}",
        "lost": str(lost),
    }


class OptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """Both parts run, every measure, sync fail-over, the default rounds and kills."""
        options = parse([])
        self.assertIsNone(options.only)
        self.assertEqual(options.measure, list(MEASURES))
        self.assertEqual(options.replication, SYNC)
        self.assertEqual((options.rounds, options.kills), (DEFAULT_ROUNDS, DEFAULT_KILLS))
        self.assertFalse(options.curve)
        self.assertTrue(parse(["--curve"]).curve)

    def test_countsAtLeastOne(self) -> None:
        """Rounds, counts, the window and kills below 1 are refused."""
        for option in ("--rounds", "--letters", "--messages", "--appended", "--window", "--kills"):
            with (
                contextlib.redirect_stderr(io.StringIO()),
                self.assertRaises(SystemExit, msg=option),
            ):
                parse([option, "0"])

    def test_timesPositive(self) -> None:
        """The client timeout, the dwell and the step timeout must be positive."""
        for option in ("--client-timeout", "--dwell", "--step-timeout"):
            with (
                contextlib.redirect_stderr(io.StringIO()),
                self.assertRaises(SystemExit, msg=option),
            ):
                parse([option, "0"])

    def test_heartbeatFloor(self) -> None:
        """A pair heartbeat under the broker's 10 ms floor is refused."""
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            parse(["--pair-heartbeat", "5"])


class SetupTests(SynchronousTestCase):
    def test_linkEndpointsFresh(self) -> None:
        """Each pair gets two abstract ipc names of its own, no port."""
        first, second = link_endpoints(), link_endpoints()
        self.assertEqual(len(set(first + second)), 4)
        for endpoint in first + second:
            self.assertTrue(endpoint.startswith("ipc://@/malamute-bench-pair-"), endpoint)

    def test_pairArguments(self) -> None:
        """A pair broker's options name its role, both link ends, the replication."""
        self.assertEqual(
            pair_arguments("backup", "ipc://@/b", "ipc://@/a", ASYNC, 250),
            [
                "--pair",
                "backup",
                "--pair-bind",
                "ipc://@/b",
                "--pair-connect",
                "ipc://@/a",
                "--pair-replication",
                "async",
                "--pair-heartbeat",
                "250",
            ],
        )

    def test_pairBrokersCrossConnected(self) -> None:
        """Each broker of a pair connects to the endpoint its partner binds."""
        setup = SetupBrokers(Path(self.mktemp()), SYNC)
        primary, backup = (setup.brokers[n].command() for n in ("primary", "backup"))

        def value(command: list[str], option: str) -> str:
            return command[command.index(option) + 1]

        self.assertEqual(value(primary, "--pair-connect"), value(backup, "--pair-bind"))
        self.assertEqual(value(backup, "--pair-connect"), value(primary, "--pair-bind"))
        self.assertEqual(setup.active, "primary")

    def test_curvePairKeyed(self) -> None:
        """
        A CURVE setup is a sync pair whose brokers each have a key pair in
        their data directory (the secret readable by its owner only) and
        are given the partner's public certificate with --pair-key.
        """
        setup = SetupBrokers(Path(self.mktemp()), CURVE)
        for role, partner in (("primary", "backup"), ("backup", "primary")):
            command = setup.brokers[role].command()
            self.assertEqual(command[command.index("--pair-replication") + 1], SYNC)
            key = Path(command[command.index("--pair-key") + 1])
            self.assertEqual(key, setup.brokers[partner].data_dir / "curve" / "server.key")
            self.assertEqual(len(load_client_keys(key)), 1)
            secret = setup.brokers[role].data_dir / "curve" / "server.key_secret"
            self.assertEqual(secret.stat().st_mode & 0o077, 0)

    def test_unknownMode(self) -> None:
        """A setup that is none of single, sync and async is refused."""
        self.assertRaises(ValueError, SetupBrokers, Path(self.mktemp()), "quorum")

    def test_singleHasNoPartner(self) -> None:
        """Killing the active of a single broker is refused: nothing would take over."""
        setup = SetupBrokers(Path(self.mktemp()), SINGLE)
        self.assertEqual(list(setup.brokers), [SINGLE])
        self.assertRaises(BrokerError, setup.kill_active)


class ThroughputFiguresTests(SynchronousTestCase):
    def test_mediansAndRatios(self) -> None:
        """
        Per measure, each setup's median over the rounds and its ratio to
        the single broker's median; losses are summed over every run.
        """
        result = ThroughputResult(
            [
                _run(1, SINGLE, "mailbox_durable", 1000),
                _run(1, SYNC, "mailbox_durable", 500, lost=2),
                _run(1, ASYNC, "mailbox_durable", 900),
                _run(2, SINGLE, "mailbox_durable", 3000),
                _run(2, SYNC, "mailbox_durable", 700),
                _run(2, ASYNC, "mailbox_durable", 1100),
                _run(3, SINGLE, "mailbox_durable", 2000),
                _run(3, SYNC, "mailbox_durable", 600),
                _run(3, ASYNC, "mailbox_durable", 1000),
            ]
        )
        self.assertEqual(
            result.summary(),
            [
                {
                    "measure": "mailbox_durable",
                    "single_per_s": "2000",
                    "sync_per_s": "600",
                    "async_per_s": "1000",
                    "sync_ratio": "0.30",
                    "async_ratio": "0.50",
                    "lost": "2",
                }
            ],
        )

    def test_linesParse(self) -> None:
        """One pair_throughput line per measure played, in order, with every key."""
        runs = [
            _run(1, mode, measure, rate)
            for measure in ("stream_append", "stream_1to1")
            for mode, rate in zip(MODES, (10, 8, 9), strict=True)
        ]
        lines = ThroughputResult(runs).lines()
        self.assertEqual(len(lines), 2)
        measures = []
        for line in lines:
            kind, fields = _fields(line)
            self.assertEqual(kind, "pair_throughput")
            self.assertEqual([k for k, _ in fields], THROUGHPUT_KEYS)
            values = dict(fields)
            measures.append(values["measure"])
            self.assertEqual((values["sync_ratio"], values["async_ratio"]), ("0.80", "0.90"))
        self.assertEqual(measures, ["stream_1to1", "stream_append"])

    def test_curveRatio(self) -> None:
        """
        A CURVE comparison's summary: per measure, the open link's sync
        pair's median, the CURVE link's, and the ratio of the two.
        """
        result = ThroughputResult.curve()
        result.runs += [
            _run(1, SYNC, "stream_1to1", 1000),
            _run(1, CURVE, "stream_1to1", 800),
            _run(2, CURVE, "stream_1to1", 950),
            _run(2, SYNC, "stream_1to1", 1100, lost=1),
            _run(3, SYNC, "stream_1to1", 1050),
            _run(3, CURVE, "stream_1to1", 1000),
        ]
        self.assertEqual(
            result.summary(),
            [
                {
                    "measure": "stream_1to1",
                    "open_per_s": "1050",
                    "curve_per_s": "950",
                    "curve_ratio": "0.90",
                    "lost": "1",
                }
            ],
        )
        kind, fields = _fields(result.lines()[0])
        self.assertEqual((kind, [k for k, _ in fields]), ("pair_curve", CURVE_KEYS))


class FailoverFiguresTests(SynchronousTestCase):
    def test_switchTime(self) -> None:
        """A fail-over lasts from the old broker's last acknowledgement to the new one's first."""
        self.assertAlmostEqual(Switch("tcp://a", "tcp://b", 10.25, 12.75, 5).secs, 2.5)

    def test_lettersChecked(self) -> None:
        """
        An acknowledged letter the consumer did not get is lost; one got
        twice is a duplicate; one got but never acknowledged is counted
        apart (a send cut short by the fail-over, stored all the same).
        """
        report = LoadReport(sent=6, acked=(0, 1, 2, 4), unknown=1, refused=1, switches=2)
        received = Counter({0: 1, 1: 2, 3: 1, 4: 1})
        result = FailoverResult()
        check_letters(result, report, received)
        self.assertEqual(
            (result.sent, result.acked, result.lost, result.duplicates, result.unacked_delivered),
            (6, 4, 1, 1, 1),
        )
        self.assertEqual((result.unknown, result.refused), (1, 1))

    def test_linesParse(self) -> None:
        """A line per kill with its keys, then the summary with the median and maximum."""
        result = FailoverResult(
            kills=[
                {
                    "kill": str(n),
                    "killed": who,
                    "failover_s": secs,
                    "kill_to_ack_s": secs,
                    "rejoin_s": "2.000",
                }
                for n, who, secs in ((1, "primary", "2.100"), (2, "backup", "3.300"))
            ]
            + [
                {
                    "kill": "3",
                    "killed": "primary",
                    "failover_s": "2.000",
                    "kill_to_ack_s": "2.000",
                    "rejoin_s": "2.000",
                }
            ],
            sent=10,
            acked=9,
        )
        lines = result.lines()
        for line in lines[:-1]:
            kind, fields = _fields(line)
            self.assertEqual((kind, [k for k, _ in fields]), ("pair_failover", KILL_KEYS))
        kind, fields = _fields(lines[-1])
        self.assertEqual((kind, [k for k, _ in fields]), ("pair_failover_summary", SUMMARY_KEYS))
        values = dict(fields)
        self.assertEqual((values["median_s"], values["max_s"]), ("2.100", "3.300"))
        self.assertEqual((values["kills"], values["acked"], values["lost"]), ("3", "9", "0"))

    def test_noKills(self) -> None:
        """With no kill measured the times show as '-', not a crash."""
        summary = FailoverResult().summary()
        self.assertEqual((summary["median_s"], summary["max_s"]), ("-", "-"))


class CommandTests(SynchronousTestCase):
    """The command against real brokers, with tiny counts."""

    skip = skip_slow

    def test_throughputLines(self) -> None:
        """
        One round with tiny counts: a pair_run line for each measure on
        each setup (single, sync, async, in that order), nothing lost, then
        a pair_throughput line per measure whose figures parse and whose
        ratios are the medians' over the single broker's; exit 0, which
        includes every broker stopping cleanly.
        """
        result = _bench(
            "--only",
            "throughput",
            "--rounds",
            "1",
            "--letters",
            "300",
            "--messages",
            "1000",
            "--appended",
            "2500",
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        runs = [_fields(line) for line in lines if line.startswith("pair_run ")]
        self.assertEqual(
            [(dict(f)["mode"], dict(f)["scenario"]) for _, f in runs],
            [(mode, measure) for mode in MODES for measure in MEASURES],
            result.stdout,
        )
        for _, fields in runs:
            self.assertEqual([k for k, _ in fields][:3], RUN_KEYS)
            values = dict(fields)
            self.assertEqual(values["lost"], "0", fields)
            self.assertGreater(float(values["msgs_per_s"]), 0, fields)
        summaries = [_fields(line) for line in lines if line.startswith("pair_throughput ")]
        self.assertEqual([dict(f)["measure"] for _, f in summaries], list(MEASURES))
        for _, fields in summaries:
            self.assertEqual([k for k, _ in fields], THROUGHPUT_KEYS)
            values = dict(fields)
            for mode in (SYNC, ASYNC):
                ratio = float(values[f"{mode}_per_s"]) / float(values["single_per_s"])
                self.assertEqual(values[f"{mode}_ratio"], f"{ratio:.2f}", fields)
        self.assertEqual(len(lines), len(runs) + len(summaries), result.stdout)

    def test_curveLines(self) -> None:
        """
        --curve with two rounds of tiny counts: the sync pair with an open
        link and the one with a CURVE link (whose brokers log that their
        link is CURVE), the open one first in round 1 and the CURVE one in
        round 2, nothing lost; then a pair_curve line per measure whose
        ratio is the medians'; exit 0.
        """
        directory = Path(self.mktemp()).resolve()
        result = _bench(
            "--only",
            "throughput",
            "--curve",
            "--rounds",
            "2",
            "--letters",
            "300",
            "--messages",
            "1000",
            "--appended",
            "2500",
            "--directory",
            str(directory),
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        runs = [dict(_fields(line)[1]) for line in lines if line.startswith("pair_run ")]
        order = [CURVE_MODES, CURVE_MODES[::-1]]
        self.assertEqual(
            [(r["round"], r["mode"], r["scenario"]) for r in runs],
            [
                (str(number), mode, measure)
                for number, modes in enumerate(order, start=1)
                for mode in modes
                for measure in MEASURES
            ],
            result.stdout,
        )
        self.assertEqual({r["lost"] for r in runs}, {"0"})
        summaries = [_fields(line) for line in lines if line.startswith("pair_curve ")]
        self.assertEqual([dict(f)["measure"] for _, f in summaries], list(MEASURES))
        for _, fields in summaries:
            self.assertEqual([k for k, _ in fields], CURVE_KEYS)
            values = dict(fields)
            # The rates are printed rounded, the ratio is of the exact ones.
            ratio = float(values["curve_per_s"]) / float(values["open_per_s"])
            self.assertLessEqual(abs(float(values["curve_ratio"]) - ratio), 0.011, fields)
        for role in ("primary", "backup"):
            log = (directory / "throughput" / CURVE / role / "broker.log").read_text()
            self.assertIn("pair link: CURVE, admitting only the partner key", log)
            open_log = (directory / "throughput" / SYNC / role / "broker.log").read_text()
            self.assertIn("pair link: open:", open_log)

    def test_failoverLines(self) -> None:
        """
        Two kills of the active under load (the primary, then the backup
        that took over): a pair_failover line for each with a fail-over
        time that parses and is positive, then the summary: two kills,
        letters acknowledged, none of them lost; exit 0.
        """
        result = _bench("--only", "failover", "--kills", "2", "--dwell", "0.5")
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(len(lines), 3, result.stdout)
        killed = []
        for line in lines[:2]:
            kind, fields = _fields(line)
            self.assertEqual((kind, [k for k, _ in fields]), ("pair_failover", KILL_KEYS))
            values = dict(fields)
            killed.append(values["killed"])
            self.assertGreater(float(values["failover_s"]), 0, line)
            self.assertGreater(float(values["rejoin_s"]), 0, line)
        self.assertEqual(killed, ["primary", "backup"])
        kind, fields = _fields(lines[2])
        self.assertEqual((kind, [k for k, _ in fields]), ("pair_failover_summary", SUMMARY_KEYS))
        values = dict(fields)
        self.assertEqual((values["kills"], values["lost"]), ("2", "0"), lines[2])
        self.assertGreater(int(values["acked"]), 0)
        self.assertLessEqual(float(values["median_s"]), float(values["max_s"]))
