"""
The pack benchmark's first part: two brokers in a pack (beacons) on hosts A
and B play stream_1to1, service_rr and stream_group1 (a consumer group's
one member, its home on A or B) cross-host (the roles of L{REMOTE_ROLES}
on B) and single-host (every role on A), in alternating rounds
(L{measure_pair}); L{PairResult} holds every round's figures and makes
their medians, ratios and tables.

With both securities asked (C{--security open --security curve}) the two
packs run side by side on the same two hosts: an open one and a CURVE one
(L{malamute_pack.bench.pack.keys}), each broker with its own client
endpoint (L{client_endpoint}) and each pack on its own beacon port
(L{BEACON_PORTS}), so each hears only its own beacons, as on a LAN of its
own (on one port each would ignore the other's beacons, and the CURVE
brokers would log the open ones as refused). Every play is then made in
both packs one after the other, the order alternating round by round (as
the placements' is), without restarting a broker between them: the two
figures of a comparison are taken minutes apart at most, from brokers
that have run as long. L{PairResult.comparisons} gives per measure and
placement the medians in each pack and the ratio CURVE/open.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.pack.brokers import follow, notable_lines, pack_arguments, running
from malamute_pack.bench.pack.common import (
    BEACON,
    BROKER_TIMEOUT_MS,
    CLIENT_ENDPOINT,
    CROSS_HOST,
    CURVE,
    GROUP,
    OPEN,
    SERVICE,
    SINGLE_HOST,
    STREAM,
    PackBenchError,
    progress,
)
from malamute_pack.bench.pack.figures import Comparison, median, ratio, show, table
from malamute_pack.bench.pack.keys import PackKeys
from malamute_pack.bench.pack.logs import DiscoveryWatch
from malamute_pack.bench.pack.roles import NamespaceContext, settled
from malamute_pack.testing.brokerprocess import BrokerProcess
from malamute_pack.testing.netns import Lan

# The roles that run on host B in the cross-host runs (every other on A).
REMOTE_ROLES: dict[str, tuple[str, ...]] = {
    STREAM: ("reader-0",),
    SERVICE: ("worker",),
    GROUP: ("reader-0",),
}
# Each pack's beacon port (None: the default, 5670).
BEACON_PORTS: dict[str, int | None] = {OPEN: None, CURVE: 5671}
# The measures of the summaries: scenario, figure, label, decimals shown.
MEASURES = (
    (STREAM, "msgs_per_s", "stream_1to1 msgs/s", 0),
    (SERVICE, "msgs_per_s", "service_rr trips/s", 0),
    (SERVICE, "avg_rtt_us", "service_rr avg_rtt_us", 1),
    (GROUP, "msgs_per_s", "stream_group1 msgs/s", 0),
)


def client_endpoint(security: str) -> str:
    """The client endpoint of the brokers of the C{security} pack (each host's own)."""
    return f"{CLIENT_ENDPOINT}-{security}"


@dataclass
class PairResult:
    """
    The two-broker runs: every round's figures, by security, scenario and
    placement (a round's figures without a security are an open pack's).
    """

    rounds: list[dict[str, str]] = field(default_factory=list)
    notable: list[str] = field(default_factory=list)

    def values(
        self, scenario: str, placement: str, figure: str, security: str = OPEN
    ) -> list[float]:
        return [
            float(r[figure])
            for r in self.rounds
            if r["scenario"] == scenario
            and r["placement"] == placement
            and r.get("security", OPEN) == security
            and figure in r
        ]

    @property
    def securities(self) -> list[str]:
        """The securities measured, in the order first played."""
        return list(dict.fromkeys(r.get("security", OPEN) for r in self.rounds))

    def summary(self, security: str = OPEN) -> list[dict[str, Any]]:
        """Per measure, the medians on both placements and their ratio, in one pack."""
        rows = []
        for scenario, figure, label, _ in MEASURES:
            cross = median(self.values(scenario, CROSS_HOST, figure, security))
            single = median(self.values(scenario, SINGLE_HOST, figure, security))
            lost = {
                placement: sum(self.values(scenario, placement, "lost", security))
                for placement in (CROSS_HOST, SINGLE_HOST)
            }
            rows.append(
                {
                    "security": security,
                    "measure": label,
                    CROSS_HOST: cross,
                    SINGLE_HOST: single,
                    "ratio": ratio(cross, single),
                    "lost_cross_host": lost[CROSS_HOST],
                    "lost_single_host": lost[SINGLE_HOST],
                }
            )
        return rows

    def lines(self, security: str = OPEN) -> list[str]:
        rows = [
            [
                row["measure"],
                show(row[CROSS_HOST], 1 if "rtt" in row["measure"] else 0),
                show(row[SINGLE_HOST], 1 if "rtt" in row["measure"] else 0),
                show(row["ratio"], 2),
                show(int(row["lost_cross_host"])),
                show(int(row["lost_single_host"])),
            ]
            for row in self.summary(security)
        ]
        headers = ["measure", CROSS_HOST, SINGLE_HOST, "ratio", "lost_cross", "lost_single"]
        return table(headers, rows)

    def comparisons(self) -> list[Comparison]:
        """Per measure and placement, the values in the open and the CURVE pack."""
        return [
            Comparison(
                label,
                placement,
                self.values(scenario, placement, figure, OPEN),
                self.values(scenario, placement, figure, CURVE),
                digits,
            )
            for scenario, figure, label, digits in MEASURES
            for placement in (CROSS_HOST, SINGLE_HOST)
        ]


def _joined(brokers: Mapping[str, BrokerProcess], pack: str, timeout: float) -> None:
    """Wait until each broker of C{pack} has logged every other joined."""
    watch = DiscoveryWatch(pack, list(brokers))
    follow(brokers, watch, lambda: watch.complete, timeout)
    if not watch.complete:
        raise PackBenchError(f"the brokers of pack {pack} did not join: {watch.missing()}")


def measure_pair(options: argparse.Namespace, directory: Path) -> PairResult:
    """
    Two brokers in a pack, or two in each pack of C{options.security}: the
    stream and service rounds, cross-host and single-host.
    """
    lan = Lan(f"{options.prefix}t", options.subnet, 2)
    result = PairResult()
    securities: list[str] = options.security
    with lan:
        first, second = lan.hosts
        keys = None
        if CURVE in securities:
            keys = PackKeys.make(directory / "pair" / "keys", [h.name for h in lan.hosts])
        packs: dict[str, dict[str, BrokerProcess]] = {}
        for security in securities:
            packs[security] = {
                host.name: BrokerProcess(
                    directory / "pair" / security / host.name,
                    bind=client_endpoint(security),
                    netns=host.name,
                    timeout_ms=BROKER_TIMEOUT_MS,
                    args=pack_arguments(
                        BEACON,
                        f"bench-pair-{security}",
                        host,
                        first,
                        keys if security == CURVE else None,
                        BEACON_PORTS[security],
                    ),
                )
                for host in lan.hosts
            }
        everyone = [broker for brokers in packs.values() for broker in brokers.values()]
        with running(everyone):
            for broker in everyone:
                broker.start()
            for security, brokers in packs.items():
                _joined(brokers, f"bench-pair-{security}", options.discovery_timeout)
            for number in range(1, options.rounds + 1):
                # Alternate which placement and which pack go first: drift
                # (a growing journal, a warming cache) is shared out evenly.
                placements = (CROSS_HOST, SINGLE_HOST)
                order = list(securities)
                if number % 2 == 0:
                    placements = placements[::-1]
                    order.reverse()
                plays = (
                    (STREAM, options.messages),
                    (SERVICE, options.round_trips),
                    (GROUP, options.messages),
                )
                for name, n in plays:
                    for placement in placements:
                        remote = REMOTE_ROLES[name] if placement == CROSS_HOST else ()
                        for security in order:
                            context = NamespaceContext(
                                {role: second.name for role in remote}, first.name
                            )
                            played = scenarios.run(
                                settled(scenarios.SCENARIOS[name]),
                                client_endpoint(security),
                                load.Job(n),
                                context,
                                True,
                            )
                            figures = {
                                "round": str(number),
                                "security": security,
                                "placement": placement,
                            }
                            figures |= played.figures()
                            result.rounds.append(figures)
                            progress(" ".join(f"{k}={v}" for k, v in figures.items()))
            result.notable = notable_lines(
                {
                    f"{name} ({security})": broker
                    for security, brokers in packs.items()
                    for name, broker in brokers.items()
                }
            )
    return result
