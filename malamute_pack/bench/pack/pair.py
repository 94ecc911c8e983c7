"""
The pack benchmark's first part: two brokers in a pack (beacons) on hosts A
and B play stream_1to1 and service_rr cross-host (the roles of
L{REMOTE_ROLES} on B) and single-host (every role on A), in alternating
rounds (L{measure_pair}); L{PairResult} holds every round's figures and
makes their medians, ratios and table.

Tests: ``tests/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.brokerprocess import BrokerProcess
from malamute_pack.bench.netns import Lan
from malamute_pack.bench.pack.brokers import follow, notable_lines, pack_arguments, running
from malamute_pack.bench.pack.common import (
    BEACON,
    BROKER_TIMEOUT_MS,
    CLIENT_ENDPOINT,
    CROSS_HOST,
    SERVICE,
    SINGLE_HOST,
    STREAM,
    PackBenchError,
    progress,
)
from malamute_pack.bench.pack.figures import median, ratio, show, table
from malamute_pack.bench.pack.logs import DiscoveryWatch
from malamute_pack.bench.pack.roles import NamespaceContext, settled

# The roles that run on host B in the cross-host runs (every other on A).
REMOTE_ROLES: dict[str, tuple[str, ...]] = {STREAM: ("reader-0",), SERVICE: ("worker",)}


@dataclass
class PairResult:
    """The two-broker runs: every round's figures, by scenario and placement."""

    rounds: list[dict[str, str]] = field(default_factory=list)
    notable: list[str] = field(default_factory=list)

    def values(self, scenario: str, placement: str, figure: str) -> list[float]:
        return [
            float(r[figure])
            for r in self.rounds
            if r["scenario"] == scenario and r["placement"] == placement and figure in r
        ]

    def summary(self) -> list[dict[str, Any]]:
        """Per measure, the medians on both placements and their ratio."""
        rows = []
        for scenario, figure, label in (
            (STREAM, "msgs_per_s", "stream_1to1 msgs/s"),
            (SERVICE, "msgs_per_s", "service_rr trips/s"),
            (SERVICE, "avg_rtt_us", "service_rr avg_rtt_us"),
        ):
            cross = median(self.values(scenario, CROSS_HOST, figure))
            single = median(self.values(scenario, SINGLE_HOST, figure))
            rows.append(
                {
                    "measure": label,
                    CROSS_HOST: cross,
                    SINGLE_HOST: single,
                    "ratio": ratio(cross, single),
                    "lost_cross_host": sum(self.values(scenario, CROSS_HOST, "lost")),
                    "lost_single_host": sum(self.values(scenario, SINGLE_HOST, "lost")),
                }
            )
        return rows

    def lines(self) -> list[str]:
        rows = [
            [
                row["measure"],
                show(row[CROSS_HOST], 1 if "rtt" in row["measure"] else 0),
                show(row[SINGLE_HOST], 1 if "rtt" in row["measure"] else 0),
                show(row["ratio"], 2),
                show(int(row["lost_cross_host"])),
                show(int(row["lost_single_host"])),
            ]
            for row in self.summary()
        ]
        headers = ["measure", CROSS_HOST, SINGLE_HOST, "ratio", "lost_cross", "lost_single"]
        return table(headers, rows)


def measure_pair(options: argparse.Namespace, directory: Path) -> PairResult:
    """Two brokers in a pack: the stream and service rounds, cross-host and single-host."""
    lan = Lan(f"{options.prefix}t", options.subnet, 2)
    result = PairResult()
    pack = "bench-pair"
    with lan:
        first, second = lan.hosts
        brokers = {
            host.name: BrokerProcess(
                directory / "pair" / host.name,
                bind=CLIENT_ENDPOINT,
                netns=host.name,
                timeout_ms=BROKER_TIMEOUT_MS,
                args=pack_arguments(BEACON, pack, host, first),
            )
            for host in lan.hosts
        }
        with running(list(brokers.values())):
            for broker in brokers.values():
                broker.start()
            watch = DiscoveryWatch(pack, list(brokers))
            follow(brokers, watch, lambda: watch.complete, options.discovery_timeout)
            if not watch.complete:
                raise PackBenchError(f"the two brokers did not join: {watch.missing()}")
            for number in range(1, options.rounds + 1):
                # Alternate which placement goes first: drift (a growing
                # journal, a warming cache) is shared out evenly.
                placements = (CROSS_HOST, SINGLE_HOST)
                if number % 2 == 0:
                    placements = placements[::-1]
                for name, n in ((STREAM, options.messages), (SERVICE, options.round_trips)):
                    for placement in placements:
                        remote = REMOTE_ROLES[name] if placement == CROSS_HOST else ()
                        context = NamespaceContext(
                            {role: second.name for role in remote}, first.name
                        )
                        played = scenarios.run(
                            settled(scenarios.SCENARIOS[name]),
                            CLIENT_ENDPOINT,
                            load.Job(n),
                            context,
                            True,
                        )
                        figures = {"round": str(number), "placement": placement}
                        figures |= played.figures()
                        result.rounds.append(figures)
                        progress(" ".join(f"{k}={v}" for k, v in figures.items()))
            result.notable = notable_lines(brokers)
    return result
