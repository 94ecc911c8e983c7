"""
The brokers of the multicast benchmark (L{malamute_pack.bench.multicast}),
each a real ``twistd malamute`` process with its journal
(L{BrokerProcess}) on a host of a L{Lan}:

- A, on host 1, bound on C{tcp://SUBNET.1:}L{PORT} (the endpoint receivers
  repair from), publishes the stream C{bench} on the group
  (L{outbound_arguments});
- B and C, on hosts 2 and 3, each on a fresh abstract ipc name (its own
  host's), receive the group into their own stream C{bench}
  (L{inbound_arguments}).

L{MulticastBrokers} starts them for one run and stops them with SIGTERM:
each bridge logs its counters as it stops (C{multicast bridge status:
{json}}), which L{bridge_status} reads back from the log.

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from malamute_pack.bench.pack.brokers import stop_all
from malamute_pack.testing.brokerprocess import BrokerProcess, Started
from malamute_pack.testing.netns import Lan

PREFIX = "mpb"
SUBNET = "10.77.62"
HOSTS = 3
GROUP = "239.192.62.1"
GROUP_PORT = 5555
# A's client port: its namespace is new, so the port is free.
PORT = 9000
SENDER = "A"
RECEIVERS = ("B", "C")
# The host (from 1) of each broker.
HOST_OF = {SENDER: 1, "B": 2, "C": 3}

# The brokers' heartbeat timeout for clients: no load process is expired.
BROKER_TIMEOUT_MS = 600_000

_STATUS = re.compile(r"multicast bridge status: (\{.*\})\s*$", re.MULTILINE)
# What an inbound bridge logs as it starts a repair over TCP (malamute_pack/multicast/inbound.py).
_REPAIR_STARTED = re.compile(r"lost records after \d+: repair from ")


def group_url(interface: str) -> str:
    """The benchmark's group, PGM in UDP, on C{interface}."""
    return f"epgm://{interface};{GROUP}:{GROUP_PORT}"


def outbound_arguments(stream: str, url: str, rate_kbps: int) -> list[str]:
    """The C{twistd malamute} options that publish C{stream} on C{url} at C{rate_kbps}."""
    return ["--bridge-out", f"{stream}={url}", "--bridge-rate", str(rate_kbps)]


def inbound_arguments(url: str, stream: str) -> list[str]:
    """The C{twistd malamute} options that receive C{url} into C{stream}."""
    return ["--bridge-in", f"{url}={stream}"]


def bridge_status(log: str) -> dict[str, Any] | None:
    """
    The last C{multicast bridge status: {json}} a log holds (a Python
    dict's repr is read too), or None.
    """
    found = _STATUS.findall(log)
    if not found:
        return None
    try:
        status = json.loads(found[-1])
    except ValueError:
        try:
            status = ast.literal_eval(found[-1])
        except (ValueError, SyntaxError):
            return None
    return status if isinstance(status, dict) else None


def repairs_started(log: str) -> int:
    """How many repairs over TCP a log says its inbound bridges started."""
    return len(_REPAIR_STARTED.findall(log))


def inbound_counters(status: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The numeric counters of the first inbound bridge of a status, or None."""
    if status is None:
        return None
    inbound = status.get("inbound")
    if not isinstance(inbound, list) or not inbound or not isinstance(inbound[0], dict):
        return None
    return {k: v for k, v in inbound[0].items() if isinstance(v, int) and not isinstance(v, bool)}


class MulticastBrokers(Started):
    """
    A, B and C for one run (see the module), under C{directory}. A context
    manager: started on entry, stopped with SIGTERM (checked) on exit,
    killed if the block raised.

    @ivar brokers: by name, A first.
    """

    def __init__(self, lan: Lan, directory: Path, rate_kbps: int, stream: str) -> None:
        sender = lan.hosts[HOST_OF[SENDER] - 1]
        self.repair_endpoint = f"tcp://{sender.address}:{PORT}"
        self.brokers: dict[str, BrokerProcess] = {
            SENDER: BrokerProcess(
                directory / SENDER,
                bind=self.repair_endpoint,
                timeout_ms=BROKER_TIMEOUT_MS,
                netns=sender.name,
                args=outbound_arguments(stream, group_url(sender.interface), rate_kbps),
            )
        }
        for name in RECEIVERS:
            host = lan.hosts[HOST_OF[name] - 1]
            self.brokers[name] = BrokerProcess(
                directory / name,
                timeout_ms=BROKER_TIMEOUT_MS,
                netns=host.name,
                args=inbound_arguments(group_url(host.interface), stream),
            )

    @property
    def sender(self) -> BrokerProcess:
        return self.brokers[SENDER]

    def endpoint(self, name: str) -> str:
        return self.brokers[name].endpoint

    def start(self, timeout: float = 60.0) -> None:
        """Start A, then B and C (each serving before the next starts)."""
        for broker in self.brokers.values():
            broker.start(timeout)

    def stop(self) -> None:
        """SIGTERM them all at once, then check each shut down cleanly."""
        stop_all(list(self.brokers.values()))

    def kill(self) -> None:
        for broker in self.brokers.values():
            broker.kill()

    def repairs_started(self, name: str) -> int:
        """L{repairs_started} in broker C{name}'s log of this run."""
        return repairs_started(self.brokers[name].run_log())

    def status(self, name: str) -> dict[str, Any] | None:
        """What broker C{name}'s bridges logged as they stopped (L{bridge_status}), or None."""
        return bridge_status(self.brokers[name].run_log())
