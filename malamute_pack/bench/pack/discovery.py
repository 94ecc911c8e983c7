"""
The pack benchmark's second part: N brokers started at once in a pack
found by beacons or gossip, timed from their logs until every one has
logged every other joined (L{discover}), with their memory and, at the
largest N, the traffic figures (L{malamute_pack.bench.pack.traffic});
L{DiscoveryResult} holds one run and makes its table row.

Tests: ``tests/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.bench.brokerprocess import BrokerProcess
from malamute_pack.bench.netns import Lan
from malamute_pack.bench.pack.brokers import follow, notable_lines, pack_arguments, running
from malamute_pack.bench.pack.common import BROKER_TIMEOUT_MS, CLIENT_ENDPOINT, PackBenchError
from malamute_pack.bench.pack.figures import median, show
from malamute_pack.bench.pack.logs import DiscoveryWatch
from malamute_pack.bench.pack.traffic import TrafficResult, measure_traffic


@dataclass
class DiscoveryResult:
    mode: str
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
    options: argparse.Namespace, lan: Lan, mode: str, n: int, directory: Path, traffic: bool
) -> DiscoveryResult:
    """Start C{n} brokers at once in a pack found by C{mode}; time their discovery."""
    hosts = lan.hosts[:n]
    pack = f"bench-{mode}-{n}"
    brokers = {
        host.name: BrokerProcess(
            directory / f"{mode}-{n}" / host.name,
            bind=CLIENT_ENDPOINT,
            netns=host.name,
            timeout_ms=BROKER_TIMEOUT_MS,
            args=pack_arguments(mode, pack, host, hosts[0]),
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
            raise PackBenchError(f"{mode} n={n}: brokers never reachable: {slow}")
        sizes = [rss_mb(b.pid) for b in brokers.values()]
        known = [s for s in sizes if s is not None]
        result = DiscoveryResult(
            mode,
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
            result.traffic = measure_traffic(options, mode, hosts, brokers)
        result.notable = notable_lines(brokers)
    return result
