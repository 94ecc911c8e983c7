"""
``python -m malamute_pack.bench pack``, the command line of the pack
benchmark: its options and their defaults (L{parse}; the figures of a
default run in L{EPILOG}, shown by C{--help}), the report it prints as
tables or as one JSON document (L{PackReport}: per security, and with an
open and a CURVE pack measured, every figure compared), the discovery
rounds (L{measure_discovery}), and L{main}, which runs the parts asked for
and prints the brokers' warnings as it goes.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from malamute_pack.bench import scenarios
from malamute_pack.bench.pack.common import (
    CROSS_HOST,
    CURVE,
    DISCOVERIES,
    OPEN,
    SECURITIES,
    SINGLE_HOST,
    PackBenchError,
    progress,
)
from malamute_pack.bench.pack.discovery import (
    DISCOVERY_HEADERS,
    DiscoveryResult,
    discover,
    discovery_comparisons,
)
from malamute_pack.bench.pack.figures import Comparison, comparison_lines, median, show, table
from malamute_pack.bench.pack.keys import PackKeys
from malamute_pack.bench.pack.pair import PairResult, measure_pair
from malamute_pack.testing.brokerprocess import BrokerError
from malamute_pack.testing.netns import Lan, NetnsError, netns_available

DEFAULT_PREFIX = "mpg1"
DEFAULT_SUBNET = "10.77.41"
DEFAULT_BROKERS = (4, 8, 16)
DEFAULT_ROUNDS = 3
DEFAULT_MESSAGES = 100_000
DEFAULT_ROUND_TRIPS = 3_000
DEFAULT_ENTRIES = 100
DEFAULT_TRAFFIC_SECS = 5.0
DEFAULT_DISCOVERY_TIMEOUT = 60.0
DEFAULT_DISCOVERY_ROUNDS = 1

_PREFIX = re.compile(r"^mp[a-z0-9]{0,3}$")

EPILOG = """\
Measured with the defaults on the project's 2-core VM (every broker, load
process and the bridge on it; other test runs shared it, load average 4-7):

  two brokers, beacons, journal on, medians of 3 rounds (cross / single host):
    stream_1to1  13991 / 25743 msgs/s (0.54)
    service_rr     391 / 760 round trips/s (0.51), avg RTT 2.55 / 1.31 ms
  discovery, N brokers started at once: from the last one's 'reachable' line
  until all have joined all (in brackets: from the first one's):
    beacons  N=4 0.010 s (0.05), N=8 0.021 s (0.20), N=16 0.021 s (0.65)
    gossip   N=4 0.022 s (0.07), N=8 0.131 s (0.35), N=16 0.177 s (0.37)
  traffic, 16 brokers, what each sends its 15 peers (eth0 tx, median broker,
  beacons / gossip):
    directory  535 / 511 B per address (36 / 34 B per address and peer)
    interest   751 / 835 B per (stream, pattern) (50 / 56 B per pair and peer)
    idle       166 / 696 B/s (the gossip server: 2579 B/s)

CURVE against open, in one sitting (--security open --security curve --rounds 9
--discovery-rounds 9 --brokers 16 --entries 0, 11 minutes; load average 2-17),
medians of 9 rounds each, CURVE / open (ratio):
  two brokers, beacons, journal on, cross host (single host: the control)
    stream_1to1  28689 / 30423 msgs/s (0.94; single host 0.93)
    service_rr     685 / 718 round trips/s (0.95; single host 1.00)
  discovery, 16 brokers started at once, discovery_s (formed_s)
    beacons  0.114 / 0.037 s (0.93 / 1.10)
    gossip   0.138 / 0.075 s (1.27 / 0.82)
"""


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want numbers separated by commas: {text!r}") from None
    if not sizes or any(not 2 <= n <= 254 for n in sizes):
        raise argparse.ArgumentTypeError(f"want 2 to 254 brokers each: {text!r}")
    return sizes


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench pack",
        description="Measure a pack of brokers on hosts made as network namespaces (root).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        choices=("pair", "discovery"),
        help="run only the two-broker rounds or only discovery (default both)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="R",
        help=f"rounds of each placement, alternating (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        metavar="N",
        help=f"stream_1to1 messages per round (default {DEFAULT_MESSAGES})",
    )
    parser.add_argument(
        "--round-trips",
        type=int,
        default=DEFAULT_ROUND_TRIPS,
        metavar="N",
        help=f"service_rr round trips per round (default {DEFAULT_ROUND_TRIPS})",
    )
    parser.add_argument(
        "--brokers",
        type=_sizes,
        default=list(DEFAULT_BROKERS),
        metavar="N,N,...",
        help="pack sizes for discovery (default 4,8,16); traffic is measured at the largest",
    )
    parser.add_argument(
        "--discovery",
        action="append",
        choices=DISCOVERIES,
        help="how the brokers find each other (repeatable; default both)",
    )
    parser.add_argument(
        "--discovery-rounds",
        type=int,
        default=DEFAULT_DISCOVERY_ROUNDS,
        metavar="R",
        help=f"discovery runs of each mode, size and security (default "
        f"{DEFAULT_DISCOVERY_ROUNDS}; with more, medians too)",
    )
    parser.add_argument(
        "--security",
        action="append",
        choices=SECURITIES,
        help="an open pack, or a CURVE one (--pack-keys): repeatable, and with both every "
        "figure is measured in each, the order alternating round by round, and their medians "
        "compared (default open)",
    )
    parser.add_argument(
        "--entries",
        type=int,
        default=DEFAULT_ENTRIES,
        metavar="E",
        help=f"addresses and (stream, pattern) readers per broker for the traffic figures "
        f"(default {DEFAULT_ENTRIES}; 0: no traffic figures)",
    )
    parser.add_argument(
        "--traffic-secs",
        type=float,
        default=DEFAULT_TRAFFIC_SECS,
        metavar="S",
        help=f"each traffic window, the idle one included (default {DEFAULT_TRAFFIC_SECS})",
    )
    parser.add_argument(
        "--discovery-timeout",
        type=float,
        default=DEFAULT_DISCOVERY_TIMEOUT,
        metavar="S",
        help=f"give up on a pack's discovery after S seconds (default {DEFAULT_DISCOVERY_TIMEOUT})",
    )
    parser.add_argument(
        "--prefix",
        default=DEFAULT_PREFIX,
        help=f"namespace names start with this (mp and up to 3 more; default {DEFAULT_PREFIX})",
    )
    parser.add_argument(
        "--subnet",
        default=DEFAULT_SUBNET,
        help=f"the hosts' /24, three octets (default {DEFAULT_SUBNET})",
    )
    parser.add_argument(
        "--directory",
        type=Path,
        metavar="DIR",
        help="keep the brokers' directories and logs here (default: a temporary one, removed)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead")
    args = parser.parse_args(argv)
    for name in ("rounds", "discovery_rounds", "messages", "round_trips"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.entries < 0:
        parser.error("--entries must be at least 0")
    if args.traffic_secs <= 0 or args.discovery_timeout <= 0:
        parser.error("--traffic-secs and --discovery-timeout must be positive")
    if not _PREFIX.match(args.prefix):
        parser.error(f"--prefix {args.prefix!r}: want mp and up to 3 more letters or digits")
    try:
        ipaddress.IPv4Network(f"{args.subnet}.0/24")
    except ValueError:
        parser.error(f"--subnet {args.subnet!r}: want three octets, as {DEFAULT_SUBNET}")
    args.discovery = args.discovery or list(DISCOVERIES)
    args.security = list(dict.fromkeys(args.security or [OPEN]))
    return args


DISCOVERY_MEDIAN_HEADERS = [
    "discovery",
    "security",
    "brokers",
    "runs",
    "complete",
    "start_s",
    "discovery_s",
    "formed_s",
]


@dataclass
class PackReport:
    pair: PairResult | None = None
    discovery: list[DiscoveryResult] = field(default_factory=list)

    def comparisons(self) -> list[Comparison]:
        """Every figure measured in both an open and a CURVE pack (none without both)."""
        measured = {r.security for r in self.discovery}
        if self.pair is not None:
            measured |= set(self.pair.securities)
        if not {OPEN, CURVE} <= measured:
            return []
        found = self.pair.comparisons() if self.pair is not None else []
        return found + discovery_comparisons(self.discovery)

    def discovery_medians(self) -> list[list[str]]:
        """Per mode, security and size with more than one run: the medians' row."""

        def mid(values: list[float | None]) -> float | None:
            return median([v for v in values if v is not None])

        rows = []
        cases = dict.fromkeys((r.mode, r.security, r.brokers) for r in self.discovery)
        for case in cases:
            mode, security, n = case
            runs = [r for r in self.discovery if (r.mode, r.security, r.brokers) == case]
            if len(runs) < 2:
                continue
            rows.append(
                [
                    mode,
                    security,
                    show(n),
                    show(len(runs)),
                    show(sum(r.complete for r in runs)),
                    show(mid([r.start_secs for r in runs]), 2),
                    show(mid([r.discovery_secs for r in runs]), 3),
                    show(mid([r.formation_secs for r in runs]), 2),
                ]
            )
        return rows

    def lines(self, options: argparse.Namespace) -> list[str]:
        lines = []
        if self.pair is not None:
            for security in self.pair.securities:
                lines.append(
                    f"# two brokers in a pack ({security}, beacons), journal on, {options.rounds} "
                    f"rounds of each placement alternating: medians, ratio "
                    f"{CROSS_HOST}/{SINGLE_HOST}"
                )
                lines += self.pair.lines(security)
        if self.discovery:
            lines.append(
                "# discovery: N brokers started at once; start_s: until the last one's "
                "'reachable' line; discovery_s: from then until every broker logged all N-1 "
                "others joined (median_broker_s: each broker's own); formed_s: the same from "
                "the first 'reachable' line"
            )
            lines += table(DISCOVERY_HEADERS, [r.row() for r in self.discovery])
            medians = self.discovery_medians()
            if medians:
                lines.append("# discovery, medians of the runs (complete ones) of each case")
                lines += table(DISCOVERY_MEDIAN_HEADERS, medians)
        for result in self.discovery:
            traffic = result.traffic
            if traffic is None:
                continue
            lines.append(
                f"# traffic, {traffic.mode} {traffic.security} pack of {traffic.brokers}: each "
                f"broker's eth0 tx for {traffic.entries} addresses (dir) then {traffic.entries} "
                f"(stream, pattern) readers (int), windows of {traffic.window_secs:g}s or more, "
                f"idle rate taken off"
            )
            lines += traffic.lines()
        comparisons = self.comparisons()
        if comparisons:
            lines.append(
                f"# {CURVE} against {OPEN}: the medians of each figure's values in either pack "
                f"(samples: how many each), measured alternating, ratio {CURVE}/{OPEN}"
            )
            lines += comparison_lines(comparisons)
        return lines

    def as_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {}
        if self.pair is not None:
            document["pair"] = {
                "summary": [row for s in self.pair.securities for row in self.pair.summary(s)],
                "rounds": self.pair.rounds,
                "notable": self.pair.notable,
            }
        document["discovery"] = [dataclasses.asdict(r) for r in self.discovery]
        document["comparison"] = [c.as_json() for c in self.comparisons()]
        return document


def measure_discovery(options: argparse.Namespace, directory: Path) -> list[DiscoveryResult]:
    """
    Discovery, C{options.discovery_rounds} rounds: per mode and size, a
    run in each pack of C{options.security}, the order alternating round
    by round; the traffic figures at the largest size, in the first round.
    """
    results = []
    largest = max(options.brokers)
    lan = Lan(f"{options.prefix}d", options.subnet, largest)
    with lan:
        keys = None
        if CURVE in options.security:
            keys = PackKeys.make(directory / "discovery-keys", [h.name for h in lan.hosts])
        for number in range(1, options.discovery_rounds + 1):
            order = list(options.security)
            if number % 2 == 0:
                order.reverse()
            for mode in options.discovery:
                for n in options.brokers:
                    for security in order:
                        progress(f"discovery round={number} {mode} {security} n={n}...")
                        traffic = options.entries > 0 and n == largest and number == 1
                        result = discover(
                            options,
                            lan,
                            mode,
                            n,
                            directory,
                            traffic,
                            keys if security == CURVE else None,
                            number,
                        )
                        results.append(result)
                        cells = zip(DISCOVERY_HEADERS, result.row(), strict=True)
                        progress(" ".join(f"{name}={cell}" for name, cell in cells))
                        for line in result.notable:
                            progress(f"log: {line}")
                        for broker, peer in result.left:
                            progress(f"{broker} saw {peer} leave during discovery")
                        for broker, peers in result.missing.items():
                            progress(f"{broker} never saw {', '.join(peers)} join")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    reason = netns_available()
    if reason is not None:
        print(f"bench pack: {reason}: run it as root with iproute2", file=sys.stderr)
        return 2
    report = PackReport()
    with tempfile.TemporaryDirectory(prefix="malamute-bench-pack-") as scratch:
        directory = (options.directory or Path(scratch)).resolve()
        try:
            if options.only != "discovery":
                report.pair = measure_pair(options, directory)
                for line in report.pair.notable:
                    progress(f"log: {line}")
            if options.only != "pair":
                report.discovery = measure_discovery(options, directory)
        except (PackBenchError, scenarios.BenchError, BrokerError, NetnsError) as e:
            print(f"bench pack: {e}", file=sys.stderr)
            return 1
    if options.json:
        print(json.dumps(report.as_json(), indent=2), flush=True)
    else:
        for line in report.lines(options):
            print(line, flush=True)
    return 0
