"""
The pack benchmark's second part: N brokers started at once in a pack
found by beacons or gossip, open or CURVE (the keys of
L{malamute_pack.bench.pack.keys}), timed from their logs until every one
has logged every other joined (L{discover}), with their memory and, at the
largest N, the traffic figures (L{malamute_pack.bench.pack.traffic});
L{DiscoveryResult} holds one run and makes its table row, and
L{discovery_comparisons} the medians of many runs open and CURVE.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.bench.pack.brokers import follow, notable_lines, pack_arguments, running
from malamute_pack.bench.pack.common import (
    BROKER_TIMEOUT_MS,
    CLIENT_ENDPOINT,
    CURVE,
    OPEN,
    PackBenchError,
)
from malamute_pack.bench.pack.figures import Comparison, median, show
from malamute_pack.bench.pack.keys import PackKeys
from malamute_pack.bench.pack.logs import DiscoveryWatch
from malamute_pack.bench.pack.traffic import TrafficResult, measure_traffic
from malamute_pack.testing.brokerprocess import BrokerProcess
from malamute_pack.testing.netns import Lan


@dataclass
class DiscoveryResult:
    mode: str
    security: str
    round: int
    brokers: int
    start_secs: float | None
    discovery_secs: float | None
    formation_secs: float | None
    broker_secs: dict[str, float]
    missing: dict[str, list[str]]
    left: list[tuple[str, str]]
    rss_mb_max: float | None
    notable: list[str] = field(default_factory=list)
    traffic: TrafficResult | None = None

    @property
    def complete(self) -> bool:
        return not self.missing

    def row(self) -> list[str]:
        return [
            self.mode,
            self.security,
            show(self.round),
            show(self.brokers),
            show(self.start_secs, 2),
            show(self.discovery_secs, 3),
            show(median(list(self.broker_secs.values())), 3),
            show(self.formation_secs, 2),
            show(self.rss_mb_max, 1),
            "yes" if self.complete else "NO",
        ]


DISCOVERY_HEADERS = [
    "discovery",
    "security",
    "round",
    "brokers",
    "start_s",
    "discovery_s",
    "median_broker_s",
    "formed_s",
    "rss_mb_max",
    "complete",
]


def rss_mb(pid: int) -> float | None:
    """A process's resident memory in MB, None if it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return int(found[1]) / 1024 if found else None


def discover(
    options: argparse.Namespace,
    lan: Lan,
    mode: str,
    n: int,
    directory: Path,
    traffic: bool,
    keys: PackKeys | None = None,
    number: int = 1,
) -> DiscoveryResult:
    """
    Start C{n} brokers at once in a pack found by C{mode}, CURVE with
    C{keys} (else open); time their discovery. C{number} is the round's.
    """
    hosts = lan.hosts[:n]
    security = OPEN if keys is None else CURVE
    pack = f"bench-{mode}-{n}-{security}"
    brokers = {
        host.name: BrokerProcess(
            directory / f"{mode}-{n}-{security}-{number}" / host.name,
            bind=CLIENT_ENDPOINT,
            netns=host.name,
            timeout_ms=BROKER_TIMEOUT_MS,
            args=pack_arguments(mode, pack, host, hosts[0], keys),
        )
        for host in hosts
    }
    watch = DiscoveryWatch(pack, list(brokers))
    with running(list(brokers.values())):
        launched = time.monotonic()
        for broker in brokers.values():
            broker.launch()
        follow(brokers, watch, lambda: watch.complete, options.discovery_timeout)
        if watch.all_reachable is None:
            slow = sorted(set(brokers) - set(watch.reachable))
            raise PackBenchError(f"{mode} {security} n={n}: brokers never reachable: {slow}")
        sizes = [rss_mb(b.pid) for b in brokers.values()]
        known = [s for s in sizes if s is not None]
        result = DiscoveryResult(
            mode,
            security,
            number,
            n,
            watch.all_reachable - launched,
            watch.discovery_secs(),
            watch.formation_secs(),
            watch.broker_secs(),
            watch.missing(),
            list(watch.left),
            max(known) if known else None,
        )
        if traffic and watch.complete:
            result.traffic = measure_traffic(options, mode, hosts, brokers, security)
        result.notable = notable_lines(brokers)
    return result


def discovery_comparisons(results: Sequence[DiscoveryResult]) -> list[Comparison]:
    """
    Per discovery mode and pack size, in the order first run: discovery_s
    and formed_s in the open and the CURVE packs (the runs that completed),
    then the traffic figures (the median broker's) of the runs that have
    them.
    """
    comparisons = []
    cases = dict.fromkeys((r.mode, r.brokers) for r in results)
    for mode, n in cases:
        runs = [r for r in results if (r.mode, r.brokers) == (mode, n)]
        for figure, label in (("discovery_secs", "discovery_s"), ("formation_secs", "formed_s")):
            values = {
                security: [
                    value
                    for value in (getattr(r, figure) for r in runs if r.security == security)
                    if value is not None
                ]
                for security in (OPEN, CURVE)
            }
            comparisons.append(Comparison(label, f"{mode} n={n}", values[OPEN], values[CURVE], 3))
        traffic = {r.security: r.traffic.figures() for r in runs if r.traffic is not None}
        if OPEN in traffic and CURVE in traffic:
            comparisons += [
                Comparison(label, f"{mode} n={n}", [value], [traffic[CURVE][label]])
                for label, value in traffic[OPEN].items()
            ]
    return comparisons
