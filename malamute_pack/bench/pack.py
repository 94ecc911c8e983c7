"""
``python -m malamute_pack.bench pack``: the pack's figures, measured on
hosts made as network namespaces on one bridge (L{malamute_pack.bench.netns};
root only), each broker a real ``twistd malamute --pack`` process with its
journal (L{malamute_pack.bench.brokerprocess}).

1. Two brokers (beacons), A and B. The benchmark's own scenarios and load
   processes (L{malamute_pack.bench.scenarios}, L{malamute_pack.bench.load})
   play stream_1to1 (writer on A, reader on B) and service_rr (requester on
   A, worker on B; the worker answers with MAILBOX_SEND to the requester's
   address) through the pack, and the same with every role on A, in
   alternating rounds; it prints the medians and the ratio cross-host over
   single-host. Each load process runs in its host's namespace
   (L{NamespaceContext}: a L{python_command} subprocess given its end of the
   runner's pipe), and both brokers bind the same abstract ipc name, which
   is each host's own (abstract sockets belong to the network namespace),
   so each role just connects to "the broker of its host". Senders wait
   L{SETTLE} seconds after the go before their first message, so the
   readers' interest and the workers' offer have reached A (a record
   written before B's interest arrives is not forwarded to B).
2. Discovery: N brokers (per C{--brokers}) started at once on one LAN, with
   beacons (default interval) and with gossip (one server on host 1). The
   logs are followed (every L{POLL} s) and each line stamped with
   C{time.monotonic()} when read: the figure is from the last broker's
   "reachable by peers at" line to the moment every broker has logged
   "pack NAME: broker X joined" for all N - 1 others (process start-up is
   not counted; it shows as start_s).
3. Traffic: after the discovery run with the largest N, a client process in
   every namespace connects C{--entries} clients with addresses (the
   directory), then has each read a (stream, pattern) of its own (the
   interests); what each host sends is its C{eth0} tx counters (read from
   C{/proc/PID/net/dev} of its broker: that namespace's devices) over the
   phase, less the idle rate (beacons, pings) measured over as long just
   before.

Warnings, errors and tracebacks in the brokers' logs are printed (to stderr)
and kept in the report. C{--json} prints one JSON document instead of the
tables.

The figures of a default run on the project's machine are in L{EPILOG}
(shown by C{--help}).

Tests: ``tests/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import pickle
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import zmq

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.brokerprocess import (
    BrokerError,
    BrokerProcess,
    checkout_environment,
    python_command,
)
from malamute_pack.bench.netns import Host, Lan, NetnsError, netns_available
from malamute_pack.protocol import mlm

# Every broker binds this for its clients: an abstract ipc name, so each
# host's is its own and a client in a namespace reaches its host's broker.
CLIENT_ENDPOINT = "ipc://@/malamute-pack-bench"
# The brokers' heartbeat timeout (as the single-host bench's): no client
# of a run is expired for silence.
BROKER_TIMEOUT_MS = 600_000
GOSSIP_PORT = 5680
# Seconds a sender waits after the go: the pack learns the readers' interest.
SETTLE = 0.5
# Seconds between two reads of the brokers' logs while discovery runs.
POLL = 0.01
# Seconds after the last client's "done" before a traffic phase's counters are read.
TRAFFIC_TAIL = 1.0

BEACON, GOSSIP = "beacon", "gossip"
DISCOVERIES = (BEACON, GOSSIP)
CROSS_HOST, SINGLE_HOST = "cross_host", "single_host"
STREAM, SERVICE = "stream_1to1", "service_rr"
# The roles that run on host B in the cross-host runs (every other on A).
REMOTE_ROLES: dict[str, tuple[str, ...]] = {STREAM: ("reader-0",), SERVICE: ("worker",)}

DEFAULT_PREFIX = "mpg1"
DEFAULT_SUBNET = "10.77.41"
DEFAULT_BROKERS = (4, 8, 16)
DEFAULT_ROUNDS = 3
DEFAULT_MESSAGES = 100_000
DEFAULT_ROUND_TRIPS = 3_000
DEFAULT_ENTRIES = 100
DEFAULT_TRAFFIC_SECS = 5.0
DEFAULT_DISCOVERY_TIMEOUT = 60.0

_REACHABLE = re.compile(
    r"Malamute pack (?P<pack>\S+): broker (?P<name>\S+) \([0-9A-F]+\) reachable by peers at \S+"
)
_MEMBER = re.compile(r"\] pack (?P<pack>\S+): broker (?P<name>\S+) (?P<event>joined|left)\s*$")
_NOTABLE = re.compile(r"#(?:warn|error|critical)\]|Traceback|Unhandled")
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
"""


class PackBenchError(Exception):
    """A part of the pack benchmark could not be measured."""


# Pure helpers: log lines, figures, tables.


@dataclass(frozen=True, slots=True)
class LogEvent:
    """A pack event in a broker's log: C{kind} is reachable, joined or left."""

    kind: str
    pack: str
    name: str


def parse_line(line: str) -> LogEvent | None:
    """The pack event a broker's log line says, if any."""
    found = _REACHABLE.search(line)
    if found:
        return LogEvent("reachable", found["pack"], found["name"])
    member = _MEMBER.search(line)
    if member:
        return LogEvent(member["event"], member["pack"], member["name"])
    return None


def notable(line: str) -> bool:
    """Whether a broker's log line is a warning, an error or a traceback."""
    return _NOTABLE.search(line) is not None


def median(values: Sequence[float]) -> float | None:
    """The median, or None for no values."""
    return statistics.median(values) if values else None


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """C{numerator / denominator}, or None if either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def show(value: float | int | str | None, digits: int = 0) -> str:
    """A table cell: C{-} for None, a float with C{digits} decimals."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Lines of a text table: the first column left-aligned, the others right-aligned."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first, *rest = cells
        parts = [first.ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(rest, widths[1:], strict=True)
        ]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(row) for row in rows)]


class DiscoveryWatch:
    """
    Who has joined whom, from the brokers' log lines as they are read.

    @ivar reachable: per broker, when its "reachable" line was read.
    @ivar joined: per broker, the peers it has logged joined, and when.
    @ivar completed: per broker, when it first had every other joined.
    @ivar left: "left" events seen, as (broker, peer).
    """

    def __init__(self, pack: str, names: Sequence[str]) -> None:
        self.pack = pack
        self.names = list(names)
        self.reachable: dict[str, float] = {}
        self.joined: dict[str, dict[str, float]] = {name: {} for name in names}
        self.completed: dict[str, float] = {}
        self.left: list[tuple[str, str]] = []

    def feed(self, name: str, line: str, now: float) -> None:
        """Broker C{name} logged C{line}, read at C{now}."""
        event = parse_line(line)
        if event is None or event.pack != self.pack:
            return
        if event.kind == "reachable":
            self.reachable.setdefault(name, now)
        elif event.kind == "joined":
            peers = self.joined[name]
            peers.setdefault(event.name, now)
            others = set(self.names) - {name}
            if name not in self.completed and others <= set(peers):
                self.completed[name] = now
        else:
            self.left.append((name, event.name))
            self.joined[name].pop(event.name, None)

    @property
    def all_reachable(self) -> float | None:
        """When the last broker's "reachable" line was read, once all were."""
        if len(self.reachable) < len(self.names):
            return None
        return max(self.reachable.values())

    @property
    def complete(self) -> bool:
        return len(self.completed) == len(self.names)

    def discovery_secs(self) -> float | None:
        """From the last "reachable" to the last broker complete; None until then."""
        start = self.all_reachable
        if start is None or not self.complete:
            return None
        return max(0.0, max(self.completed.values()) - start)

    def formation_secs(self) -> float | None:
        """From the first "reachable" to the last broker complete; None until then."""
        if self.all_reachable is None or not self.complete:
            return None
        return max(0.0, max(self.completed.values()) - min(self.reachable.values()))

    def broker_secs(self) -> dict[str, float]:
        """Per complete broker, from the last "reachable" to its completion (at least 0)."""
        start = self.all_reachable
        if start is None:
            return {}
        return {name: max(0.0, when - start) for name, when in self.completed.items()}

    def missing(self) -> dict[str, list[str]]:
        """Per incomplete broker, the others it has not logged joined."""
        return {
            name: sorted(set(self.names) - {name} - set(self.joined[name]))
            for name in self.names
            if name not in self.completed
        }


class LogFollower:
    """The complete lines a growing log file gains between two calls."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


def pack_arguments(mode: str, pack: str, host: Host, first: Host) -> list[str]:
    """
    The C{twistd malamute} arguments of the broker on C{host} in a pack
    found by C{mode}: beacons on C{eth0}, or gossip served by C{first}'s
    broker (bound on its address, port L{GOSSIP_PORT}) that the others
    connect to, each with its peer endpoint on its host's address.
    """
    arguments = ["--pack", pack, "--broker-name", host.name]
    if mode == BEACON:
        return [*arguments, "--beacon", host.interface]
    gossip = f"tcp://{first.address}:{GOSSIP_PORT}"
    discovery = ["--gossip-bind" if host is first else "--gossip-connect", gossip]
    return [*arguments, *discovery, "--peer-endpoint", f"tcp://{host.address}:*"]


def parse_net_dev(text: str, interface: str) -> tuple[int, int]:
    """The (tx bytes, tx packets) of C{interface} in a C{/proc/net/dev} text."""
    for line in text.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == interface:
            fields = counters.split()
            return int(fields[8]), int(fields[9])
    raise PackBenchError(f"no interface {interface} in /proc/net/dev")


# Load processes in a namespace: the benchmark's own roles, run elsewhere.


def _settle(link: load.Link) -> None:
    end = time.monotonic() + SETTLE
    while time.monotonic() < end:
        link.keepalive()
        time.sleep(0.05)


def settle_then_blast(link: load.Link, role: load.Role, job: load.Job) -> load.Report:
    """L{load.blast} after L{SETTLE} seconds (not timed: its first send starts the clock)."""
    _settle(link)
    return load.blast(link, role, job)


def settle_then_request(link: load.Link, role: load.Role, job: load.Job) -> load.Report:
    """L{load.request} after L{SETTLE} seconds (not timed)."""
    _settle(link)
    return load.request(link, role, job)


_SETTLED: dict[load.Work, load.Work] = {
    load.blast: settle_then_blast,
    load.request: settle_then_request,
}


def settled(scenario: scenarios.Scenario) -> scenarios.Scenario:
    """C{scenario} with its senders waiting L{SETTLE} seconds after the go."""
    roles = tuple(
        dataclasses.replace(role, work=_SETTLED[role.work]) if role.work in _SETTLED else role
        for role in scenario.roles
    )
    return dataclasses.replace(scenario, roles=roles)


_ROLE_MAIN = "from malamute_pack.bench.pack import role_main; role_main()"


def role_main() -> None:
    """
    A load role in a namespace: its (role, endpoint, job) pickled on stdin,
    its end of the runner's pipe as the file descriptor in C{argv[1]}.
    """
    role, endpoint, job = pickle.load(sys.stdin.buffer)
    load.run_role(role, endpoint, job, Connection(int(sys.argv[1])))


class NamespaceProcess:
    """
    What L{scenarios.run} needs of a C{multiprocessing} process, for a load
    role run by L{role_main} in a network namespace.
    """

    def __init__(self, netns: str | None, args: tuple[Any, ...], name: str | None) -> None:
        self.netns = netns
        self.args = args
        self.name = name
        self._popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        role, endpoint, job, pipe = self.args
        if not isinstance(pipe, Connection):
            raise TypeError(f"not a pipe end: {pipe!r}")
        descriptor = pipe.fileno()
        self._popen = popen = subprocess.Popen(
            python_command(self.netns, "-c", _ROLE_MAIN, str(descriptor)),
            env=checkout_environment(),
            stdin=subprocess.PIPE,
            pass_fds=(descriptor,),
        )
        assert popen.stdin is not None
        popen.stdin.write(pickle.dumps((role, endpoint, job)))
        popen.stdin.close()

    @property
    def exitcode(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def terminate(self) -> None:
        if self.is_alive():
            assert self._popen is not None
            os.kill(self._popen.pid, signal.SIGTERM)

    def join(self, timeout: float | None = None) -> None:
        if self._popen is None:
            return
        with suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout)


class NamespaceContext(BaseContext):
    """
    A C{multiprocessing} context for L{scenarios.run} whose processes are
    L{NamespaceProcess}es: the role named in C{placement} runs in that
    namespace, every other in C{default} (None: this process's namespace).
    """

    def __init__(self, placement: Mapping[str, str | None], default: str | None) -> None:
        self.placement = dict(placement)
        self.default = default

    def Process(
        self,
        target: Callable[..., object],
        args: tuple[Any, ...] = (),
        name: str | None = None,
        daemon: bool | None = None,
    ) -> NamespaceProcess:
        if target is not load.run_role:
            raise ValueError(f"only load roles run in a namespace, not {target!r}")
        role = args[0]
        if not isinstance(role, load.Role):
            raise TypeError(f"not a load role: {role!r}")
        return NamespaceProcess(self.placement.get(role.name, self.default), args, name)


# Brokers in namespaces.


def launch(broker: BrokerProcess) -> None:
    """
    Start C{broker} and return at once (as L{BrokerProcess.start} does, but
    without waiting for it to serve): many start in parallel, and their
    logs say when each is in the pack.
    """
    broker.directory.mkdir(parents=True, exist_ok=True)
    with broker.log.open("ab") as out:
        broker.process = subprocess.Popen(
            broker.command(),
            cwd=broker.directory,
            env=checkout_environment(PYTHONUNBUFFERED="1"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_all(brokers: Sequence[BrokerProcess], timeout: float = 60.0) -> None:
    """
    SIGTERM every running broker at once, then reap each and check it shut
    down cleanly (L{BrokerProcess.stop}).

    @raise BrokerError: one did not (after every one is stopped).
    """
    for broker in brokers:
        if broker.process is not None and broker.process.poll() is None:
            broker.process.send_signal(signal.SIGTERM)
    errors = []
    for broker in brokers:
        if broker.process is not None:
            with suppress(subprocess.TimeoutExpired):
                broker.process.wait(timeout)
        try:
            broker.stop(timeout=1.0)
        except BrokerError as e:
            errors.append(f"{broker.directory.name}: {e}")
    if errors:
        raise BrokerError("\n".join(errors))


@contextmanager
def running(brokers: Sequence[BrokerProcess]) -> Iterator[None]:
    """Stop the brokers (checked) when the block ends; kill them if it raised."""
    try:
        yield
    except BaseException:
        for broker in brokers:
            broker.kill()
        raise
    stop_all(brokers)


def notable_lines(brokers: Mapping[str, BrokerProcess]) -> list[str]:
    """The warnings, errors and tracebacks each broker logged, as C{NAME: LINE}."""
    return [
        f"{name}: {line}"
        for name, broker in brokers.items()
        for line in broker.run_log().splitlines()
        if notable(line)
    ]


def follow(
    brokers: Mapping[str, BrokerProcess],
    watch: DiscoveryWatch,
    until: Callable[[], bool],
    timeout: float,
) -> None:
    """
    Feed C{watch} the brokers' log lines, stamped when read, until C{until()}
    or C{timeout} seconds; L{PackBenchError} if a broker exits meanwhile.
    """
    followers = {name: LogFollower(broker.log) for name, broker in brokers.items()}
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        for name, follower in followers.items():
            for line in follower.new_lines():
                watch.feed(name, line, now)
        if until() or now > deadline:
            return
        for name, broker in brokers.items():
            if not broker.alive():
                raise PackBenchError(f"broker {name} exited:\n{broker.log_text()}")
        time.sleep(POLL)


# 1. Two brokers.


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


# 2. Discovery, and 3. traffic.


@dataclass
class TrafficRow:
    """What one host sent for one phase, its idle rate taken off."""

    host: str
    idle_bytes_per_s: float
    directory_bytes: float = 0.0
    directory_packets: float = 0.0
    interest_bytes: float = 0.0
    interest_packets: float = 0.0


@dataclass
class TrafficResult:
    mode: str
    brokers: int
    entries: int
    window_secs: float
    rows: list[TrafficRow] = field(default_factory=list)

    def per_entry(self, value: float) -> float:
        return value / self.entries if self.entries else 0.0

    def per_entry_peer(self, value: float) -> float:
        peers = self.brokers - 1
        return value / (self.entries * peers) if self.entries and peers else 0.0

    def lines(self) -> list[str]:
        headers = [
            "host",
            "idle_B/s",
            "dir_B",
            "dir_pkts",
            "dir_B/entry",
            "dir_B/entry/peer",
            "int_B",
            "int_pkts",
            "int_B/entry",
            "int_B/entry/peer",
        ]

        def cells(label: str, r: TrafficRow) -> list[str]:
            return [
                label,
                show(r.idle_bytes_per_s),
                show(r.directory_bytes),
                show(r.directory_packets),
                show(self.per_entry(r.directory_bytes)),
                show(self.per_entry_peer(r.directory_bytes), 1),
                show(r.interest_bytes),
                show(r.interest_packets),
                show(self.per_entry(r.interest_bytes)),
                show(self.per_entry_peer(r.interest_bytes), 1),
            ]

        rows = [cells(r.host, r) for r in self.rows]
        if self.rows:

            def mid(attribute: str) -> float:
                return float(statistics.median(getattr(r, attribute) for r in self.rows))

            middle = TrafficRow(
                "median",
                mid("idle_bytes_per_s"),
                mid("directory_bytes"),
                mid("directory_packets"),
                mid("interest_bytes"),
                mid("interest_packets"),
            )
            rows.append(cells("median", middle))
        return table(headers, rows)


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


def tx_counters(broker: BrokerProcess, interface: str) -> tuple[float, int, int]:
    """(now, tx bytes, tx packets) of C{interface} in the broker's network namespace."""
    text = Path(f"/proc/{broker.pid}/net/dev").read_text()
    now = time.monotonic()
    sent, packets = parse_net_dev(text, interface)
    return now, sent, packets


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
            launch(broker)
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


_STATE_MAIN = "from malamute_pack.bench.pack import state_main; state_main()"
ADDRESSES, READERS = "addresses", "readers"


def _commands(sockets: Sequence[zmq.Socket[bytes]], messages: Sequence[mlm.Message]) -> None:
    """Send each socket its message, then wait for every OK (an ERROR exits)."""
    for socket, message in zip(sockets, messages, strict=True):
        socket.send_multipart(mlm.encode(message))
    for socket, message in zip(sockets, messages, strict=True):
        while True:
            if not socket.poll(30_000):
                sys.exit(f"no answer to {mlm.MESSAGE_NAMES[message.ID]}")
            reply = mlm.decode(socket.recv_multipart())
            if isinstance(reply, mlm.Error):
                sys.exit(f"{message} refused: {reply.status_code} {reply.status_reason}")
            if isinstance(reply, mlm.Ok):
                break


def state_main() -> None:
    """
    The traffic phase's client process on one host: C{argv} is the broker's
    endpoint, the host's name and the number of entries. Says "loaded",
    then for each line on stdin: C{addresses} opens that many clients, each
    with an address of its own; C{readers} has each read a (stream,
    pattern) of its own; it says "done COMMAND" once the broker has
    answered every one. It holds its clients until stdin closes.
    """
    endpoint, host, entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []
    print("loaded", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == ADDRESSES:
            for _ in range(entries):
                socket = context.socket(zmq.DEALER)
                socket.setsockopt(zmq.LINGER, 0)
                socket.connect(endpoint)
                sockets.append(socket)
            opens = [mlm.ConnectionOpen(address=f"{host}-a{j}") for j in range(entries)]
            _commands(sockets, opens)
        elif command == READERS:
            reads = [mlm.StreamRead(f"s-{host}", f"^p{j}$") for j in range(entries)]
            _commands(sockets, reads)
        else:
            sys.exit(f"unknown command {command!r}")
        print(f"done {command}", flush=True)
    for socket in sockets:
        socket.close(linger=0)
    context.term()


def _expect(clients: Mapping[str, subprocess.Popen[str]], expected: str) -> None:
    for name, client in clients.items():
        assert client.stdout is not None
        said = client.stdout.readline().strip()
        if said != expected:
            raise PackBenchError(f"client on {name} said {said!r}, not {expected!r}")


def measure_traffic(
    options: argparse.Namespace,
    mode: str,
    hosts: Sequence[Host],
    brokers: Mapping[str, BrokerProcess],
) -> TrafficResult:
    """What each broker sends its peers for its clients' addresses, then their readers."""
    result = TrafficResult(mode, len(hosts), options.entries, options.traffic_secs)
    interface = hosts[0].interface
    clients = {
        host.name: subprocess.Popen(
            python_command(
                host.name, "-c", _STATE_MAIN, CLIENT_ENDPOINT, host.name, str(options.entries)
            ),
            env=checkout_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for host in hosts
    }
    try:
        _expect(clients, "loaded")
        # The last joins' resynchronisations are over before the idle baseline.
        time.sleep(TRAFFIC_TAIL)
        before = {name: tx_counters(b, interface) for name, b in brokers.items()}
        time.sleep(options.traffic_secs)
        after = {name: tx_counters(b, interface) for name, b in brokers.items()}
        rates = {}
        for name in brokers:
            (then, sent, packets), (now, sent_now, packets_now) = before[name], after[name]
            rates[name] = ((sent_now - sent) / (now - then), (packets_now - packets) / (now - then))
        rows = {name: TrafficRow(name, rates[name][0]) for name in brokers}
        for phase in (ADDRESSES, READERS):
            start = {name: tx_counters(b, interface) for name, b in brokers.items()}
            began = time.monotonic()
            for client in clients.values():
                assert client.stdin is not None
                client.stdin.write(f"{phase}\n")
                client.stdin.flush()
            _expect(clients, f"done {phase}")
            end = max(began + options.traffic_secs, time.monotonic() + TRAFFIC_TAIL)
            time.sleep(max(0.0, end - time.monotonic()))
            stop = {name: tx_counters(b, interface) for name, b in brokers.items()}
            for name in brokers:
                secs = stop[name][0] - start[name][0]
                extra_bytes = stop[name][1] - start[name][1] - rates[name][0] * secs
                extra_packets = stop[name][2] - start[name][2] - rates[name][1] * secs
                row = rows[name]
                if phase == ADDRESSES:
                    row.directory_bytes, row.directory_packets = extra_bytes, extra_packets
                else:
                    row.interest_bytes, row.interest_packets = extra_bytes, extra_packets
        result.rows = list(rows.values())
    finally:
        for client in clients.values():
            if client.stdin is not None:
                client.stdin.close()
        for client in clients.values():
            try:
                client.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(client.pid, signal.SIGKILL)
                client.wait()
            if client.stdout is not None:
                client.stdout.close()
    return result


# The command.


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
    for name in ("rounds", "messages", "round_trips"):
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
    return args


@dataclass
class PackReport:
    pair: PairResult | None = None
    discovery: list[DiscoveryResult] = field(default_factory=list)

    def lines(self, options: argparse.Namespace) -> list[str]:
        lines = []
        if self.pair is not None:
            lines.append(
                f"# two brokers in a pack (beacons), journal on, {options.rounds} rounds of "
                f"each placement alternating: medians, ratio {CROSS_HOST}/{SINGLE_HOST}"
            )
            lines += self.pair.lines()
        if self.discovery:
            lines.append(
                "# discovery: N brokers started at once; start_s: until the last one's "
                "'reachable' line; discovery_s: from then until every broker logged all N-1 "
                "others joined (median_broker_s: each broker's own); formed_s: the same from "
                "the first 'reachable' line"
            )
            lines += table(DISCOVERY_HEADERS, [r.row() for r in self.discovery])
        for result in self.discovery:
            traffic = result.traffic
            if traffic is None:
                continue
            lines.append(
                f"# traffic, {traffic.mode} pack of {traffic.brokers}: each broker's eth0 tx "
                f"for {traffic.entries} addresses (dir) then {traffic.entries} (stream, pattern) "
                f"readers (int), windows of {traffic.window_secs:g}s or more, idle rate taken off"
            )
            lines += traffic.lines()
        return lines

    def as_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {}
        if self.pair is not None:
            document["pair"] = {
                "summary": self.pair.summary(),
                "rounds": self.pair.rounds,
                "notable": self.pair.notable,
            }
        document["discovery"] = [dataclasses.asdict(r) for r in self.discovery]
        return document


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
                largest = max(options.brokers)
                lan = Lan(f"{options.prefix}d", options.subnet, largest)
                with lan:
                    for mode in options.discovery:
                        for n in options.brokers:
                            progress(f"discovery {mode} n={n}...")
                            result = discover(
                                options,
                                lan,
                                mode,
                                n,
                                directory,
                                options.entries > 0 and n == largest,
                            )
                            report.discovery.append(result)
                            cells = zip(DISCOVERY_HEADERS, result.row(), strict=True)
                            progress(" ".join(f"{name}={cell}" for name, cell in cells))
                            for line in result.notable:
                                progress(f"log: {line}")
                            for broker, peer in result.left:
                                progress(f"{broker} saw {peer} leave during discovery")
                            for broker, peers in result.missing.items():
                                progress(f"{broker} never saw {', '.join(peers)} join")
        except (PackBenchError, scenarios.BenchError, BrokerError, NetnsError) as e:
            print(f"bench pack: {e}", file=sys.stderr)
            return 1
    if options.json:
        print(json.dumps(report.as_json(), indent=2), flush=True)
    else:
        for line in report.lines(options):
            print(line, flush=True)
    return 0
