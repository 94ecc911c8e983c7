"""
The multicast benchmark's runs and figures. One run (L{play_run}) starts
fresh brokers (L{MulticastBrokers}), plays a warm-up record that each
reader must get (so both receiving bridges follow A before the clock
starts), installs the UDP rules on the receivers (L{UdpFilter}: counting
on B, counting and dropping on C in a lossy run), then plays the measured
run (L{roles.measured}): the producer on host 1 writes N numbered records
to A over TCP while the readers on hosts 2 and 3 count them at B and C.
It then reads the counters and stops the brokers, whose receiving bridges
log their counters as they stop (L{bridge_status}).

Each receiver's figures in a run are a L{Delivery}: messages per second
from the producer's first send to the last record delivered there, records
delivered, missing (after repair), duplicated and late, gap notices, the
UDP packets seen and dropped before any repair (iptables, and the
kernel's receive-buffer drops), the bridge's counters (records written,
of them repaired over TCP), A's CPU time and bytes sent, and the receiving
broker's CPU time over the run.

L{MulticastResult} keeps every run's figures and makes the summary: per
scenario and receiver, the medians over the rounds (counts of missing,
duplicated, late records and notices summed), as a table, and the goal
line (L{GOAL_RATE} messages per second at each receiver and none missing
after repair in the lossy scenario).

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.multicast import counters, roles
from malamute_pack.bench.multicast.brokers import (
    HOST_OF,
    RECEIVERS,
    SENDER,
    MulticastBrokers,
    inbound_counters,
)
from malamute_pack.bench.pack.brokers import notable_lines
from malamute_pack.testing.netns import Lan

NO_LOSS = "no_loss"
# The receiver whose host drops packets in a lossy run.
LOSSY = "C"
GOAL_RATE = 50_000
STATUS_LINE = "multicast bridge status:"


def loss_scenario(percent: float) -> str:
    """The name of the lossy scenario: C{loss_1pct} for 1%."""
    return f"loss_{percent:g}pct"


@dataclass(frozen=True, slots=True)
class RunSettings:
    """
    What every run shares.

    @ivar messages: records the producer writes.
    @ivar rate_kbps: A's C{--bridge-rate}.
    @ivar loss_percent: the packets C{LOSSY}'s host drops in a lossy run, in %.
    @ivar idle: seconds without a record after which a reader gives up.
    @ivar warmup_timeout: seconds a reader waits for the warm-up record.
    """

    messages: int
    rate_kbps: int
    loss_percent: float
    idle: float = 10.0
    warmup_timeout: float = 10.0


@dataclass(frozen=True, slots=True)
class Delivery:
    """
    One receiver's figures in one run (see the module).

    @ivar secs: from the producer's first send to the last record
        delivered at this receiver (0 if none was).
    @ivar udp_seen: UDP packets that reached its host's INPUT on C{eth0}.
    @ivar udp_dropped: of them, dropped by the random-drop rule.
    @ivar rcvbuf_errors: UDP datagrams its kernel dropped for a full
        socket buffer over the run.
    @ivar bridge: its inbound bridge's counters as it stopped, or None
        when its broker logged none.
    @ivar repairs_logged: repairs over TCP its broker's log says it started.
    @ivar sender: A's outbound bridge's counters as it stopped, or None.
    @ivar sender_cpu_s: A's CPU seconds over the measured run.
    @ivar receiver_cpu_s: this receiver's broker's CPU seconds over the run.
    @ivar sender_tx_bytes: bytes host 1's C{eth0} sent over the measured run.
    """

    round: int
    scenario: str
    receiver: str
    n: int
    secs: float
    delivered: int
    duplicates: int
    out_of_order: int
    notices: int
    udp_seen: int
    udp_dropped: int
    rcvbuf_errors: int
    bridge: Mapping[str, int] | None
    repairs_logged: int
    sender: Mapping[str, int] | None
    sender_cpu_s: float
    sender_tx_bytes: int
    receiver_cpu_s: float

    @property
    def msgs_per_s(self) -> float:
        return self.delivered / self.secs if self.secs > 0 else 0.0

    @property
    def missing(self) -> int:
        return self.n - self.delivered

    @property
    def loss_before_repair(self) -> float | None:
        """Packets dropped (by the rule or a full buffer) over packets seen; None if none seen."""
        if not self.udp_seen:
            return None
        return (self.udp_dropped + self.rcvbuf_errors) / self.udp_seen

    def bridge_count(self, name: str) -> int | None:
        return None if self.bridge is None else self.bridge.get(name)

    @property
    def repaired_fraction(self) -> float | None:
        """Records its bridge wrote from TCP repairs over all it wrote; None if unknown."""
        written, repaired = self.bridge_count("written"), self.bridge_count("repaired")
        if written is None or repaired is None or written == 0:
            return None
        return repaired / written

    def figures(self) -> dict[str, str]:
        """Its figures by name, formatted, in the order a run line prints them."""

        def count(value: int | None) -> str:
            return "-" if value is None else str(value)

        sender = self.sender or {}
        return {
            "round": str(self.round),
            "scenario": self.scenario,
            "receiver": self.receiver,
            "n": str(self.n),
            "secs": f"{self.secs:.3f}",
            "msgs_per_s": f"{self.msgs_per_s:.0f}",
            "delivered": str(self.delivered),
            "missing": str(self.missing),
            "duplicates": str(self.duplicates),
            "out_of_order": str(self.out_of_order),
            "notices": str(self.notices),
            "udp_seen": str(self.udp_seen),
            "udp_dropped": str(self.udp_dropped),
            "rcvbuf_errors": str(self.rcvbuf_errors),
            "loss_before_repair": _fraction(self.loss_before_repair),
            **{
                name: count(self.bridge_count(name))
                for name in ("received", "written", "repaired", "repairs", "held", "shed", "lost")
            },
            "repaired_fraction": _fraction(self.repaired_fraction),
            "repairs_logged": str(self.repairs_logged),
            "published": count(sender.get("published")),
            "queue_full": count(sender.get("full")),
            "sender_cpu_s": f"{self.sender_cpu_s:.2f}",
            "receiver_cpu_s": f"{self.receiver_cpu_s:.2f}",
            "sender_tx_mb": f"{self.sender_tx_bytes / 1e6:.1f}",
        }

    def line(self) -> str:
        """C{multicast_run round=R scenario=S receiver=B n=... msgs_per_s=...}."""
        return "multicast_run " + " ".join(f"{k}={v}" for k, v in self.figures().items())


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.5f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.3f}%"


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


# The summary table's columns: heading, and how a row of runs makes the cell.
_Cell = Callable[[Sequence[Delivery]], str]


def _median_of(
    get: Callable[[Delivery], float | None], shown: Callable[[float | None], str]
) -> _Cell:
    return lambda runs: shown(_median([get(run) for run in runs]))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _tenths(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _sum_of(get: Callable[[Delivery], int]) -> _Cell:
    return lambda runs: str(sum(get(run) for run in runs))


COLUMNS: tuple[tuple[str, _Cell], ...] = (
    ("scenario", lambda runs: runs[0].scenario),
    ("receiver", lambda runs: runs[0].receiver),
    ("msgs/s", _median_of(lambda r: r.msgs_per_s, _number)),
    ("delivered", _median_of(lambda r: r.delivered, _number)),
    ("missing", _sum_of(lambda r: r.missing)),
    ("dups", _sum_of(lambda r: r.duplicates)),
    ("late", _sum_of(lambda r: r.out_of_order)),
    ("notices", _sum_of(lambda r: r.notices)),
    ("udp in", _median_of(lambda r: r.udp_seen, _number)),
    ("dropped", _median_of(lambda r: r.udp_dropped + r.rcvbuf_errors, _number)),
    ("loss before repair", _median_of(lambda r: r.loss_before_repair, _percent)),
    ("repaired", _median_of(lambda r: r.bridge_count("repaired"), _number)),
    ("repaired fraction", _median_of(lambda r: r.repaired_fraction, _percent)),
    ("A cpu s", _median_of(lambda r: r.sender_cpu_s, _seconds)),
    ("broker cpu s", _median_of(lambda r: r.receiver_cpu_s, _seconds)),
    ("A sent MB", _median_of(lambda r: r.sender_tx_bytes / 1e6, _tenths)),
)


@dataclass
class MulticastResult:
    """
    Every run's figures and their summary.

    @ivar notes: what the runs could not measure (a status line missing),
        and the warnings and errors the brokers logged, each once.
    """

    loss_percent: float
    runs: list[Delivery] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def groups(self) -> list[list[Delivery]]:
        """The runs by (scenario, receiver), in the order they first ran."""
        grouped: dict[tuple[str, str], list[Delivery]] = {}
        for run in self.runs:
            grouped.setdefault((run.scenario, run.receiver), []).append(run)
        return list(grouped.values())

    def table(self) -> list[str]:
        """The summary as aligned text lines: a heading, then a row per scenario and receiver."""
        rows = [[heading for heading, _ in COLUMNS]]
        rows += [[cell(runs) for _, cell in COLUMNS] for runs in self.groups()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        return [
            "  ".join(
                cell.ljust(width) if i < 2 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
            for row in rows
        ]

    def goal(self) -> str:
        """
        Whether the lossy scenario met the goal: a median of at least
        L{GOAL_RATE} msgs/s at each receiver and no record missing after
        repair in any of its runs.
        """
        lossy = loss_scenario(self.loss_percent)
        wanted = (
            f"multicast_goal at {self.loss_percent:g}% loss: >= {GOAL_RATE} msgs/s "
            "at each receiver, 0 missing after repair"
        )
        shortfalls = []
        groups = [runs for runs in self.groups() if runs[0].scenario == lossy]
        for runs in groups:
            name = runs[0].receiver
            rate = _median([run.msgs_per_s for run in runs]) or 0.0
            if rate < GOAL_RATE:
                shortfalls.append(f"{name} {rate:.0f} msgs/s")
            missing = sum(run.missing for run in runs)
            if missing:
                shortfalls.append(f"{name} {missing} missing")
        if not groups:
            return f"{wanted}: not measured"
        verdict = "met" if not shortfalls else f"NOT met ({'; '.join(shortfalls)})"
        return f"{wanted}: {verdict}"


@dataclass(frozen=True, slots=True)
class _Snapshot:
    sender_cpu_s: float
    sender_tx_bytes: int
    rcvbuf_errors: dict[str, int]
    receiver_cpu_s: dict[str, float]


def _snapshot(brokers: MulticastBrokers, interface: str) -> _Snapshot:
    sender = brokers.sender.pid
    pids = {name: brokers.brokers[name].pid for name in RECEIVERS}
    return _Snapshot(
        counters.cpu_seconds(sender),
        counters.interface_bytes(sender, interface),
        {name: counters.udp_mib(pid)["RcvbufErrors"] for name, pid in pids.items()},
        {name: counters.cpu_seconds(pid) for name, pid in pids.items()},
    )


def warm_up(brokers: MulticastBrokers, context: roles.HostContext, timeout: float) -> None:
    """
    Write one record to A and wait until every reader has it at its broker.

    @raise scenarios.BenchError: a reader got nothing within C{timeout} seconds.
    """
    scenario = roles.warmup(RECEIVERS)
    result = scenarios.run(scenario, brokers.endpoint(SENDER), load.Job(1, idle=timeout), context)
    for role, report in zip(scenario.roles, result.reports, strict=True):
        if role.counts and report.received < 1:
            log = brokers.brokers[role.name].log
            raise scenarios.BenchError(
                f"broker {role.name} got no record from the group within {timeout}s "
                f"(warm-up): see {log}"
            )


def play_run(
    lan: Lan,
    directory: Path,
    number: int,
    scenario: str,
    settings: RunSettings,
    result: MulticastResult,
) -> list[Delivery]:
    """
    Play one run (see the module) on C{lan}, its brokers under
    C{directory}; add its figures to C{result} and return them.
    """
    hosts = {name: lan.hosts[index - 1] for name, index in HOST_OF.items()}
    lossy = scenario != NO_LOSS
    probability = settings.loss_percent / 100 if lossy else None
    filters = {
        name: counters.UdpFilter(hosts[name], probability if name == LOSSY else None)
        for name in RECEIVERS
    }
    with MulticastBrokers(lan, directory, settings.rate_kbps, roles.STREAM) as brokers:
        placement = {name: hosts[name].name for name in RECEIVERS}
        placement[roles.PRODUCER] = hosts[SENDER].name
        endpoints = {name: brokers.endpoint(name) for name in RECEIVERS}
        endpoints[roles.PRODUCER] = brokers.endpoint(SENDER)
        context = roles.HostContext(placement, endpoints)
        warm_up(brokers, context, settings.warmup_timeout)
        try:
            for udp in filters.values():
                udp.install()
            interface = hosts[SENDER].interface
            before = _snapshot(brokers, interface)
            job = load.Job(settings.messages, idle=settings.idle)
            measured = roles.measured(RECEIVERS)
            played = scenarios.run(measured, brokers.endpoint(SENDER), job, context)
            after = _snapshot(brokers, interface)
            filtered = {name: udp.counts() for name, udp in filters.items()}
        finally:
            for udp in filters.values():
                udp.remove()
    reports = dict(zip((role.name for role in measured.roles), played.reports, strict=True))
    first_send = reports[roles.PRODUCER].first_send
    sender_status = brokers.status(SENDER)
    outbound = (sender_status or {}).get("outbound") or [{}]
    sender_counts = {k: v for k, v in outbound[0].items() if isinstance(v, int)}
    deliveries = []
    for name in RECEIVERS:
        report = reports[name]
        assert isinstance(report, roles.OrderReport)
        status = brokers.status(name)
        if status is None:
            result.note(
                f"broker {name} logged no {STATUS_LINE!r} line as it stopped: "
                "its bridge's counters (written, repaired) are unknown"
            )
        last = report.last_receipt
        deliveries.append(
            Delivery(
                round=number,
                scenario=scenario,
                receiver=name,
                n=settings.messages,
                secs=last - first_send if last is not None and first_send is not None else 0.0,
                delivered=report.received,
                duplicates=report.duplicates,
                out_of_order=report.out_of_order,
                notices=report.notices,
                udp_seen=filtered[name].seen,
                udp_dropped=filtered[name].dropped,
                rcvbuf_errors=after.rcvbuf_errors[name] - before.rcvbuf_errors[name],
                bridge=inbound_counters(status),
                repairs_logged=brokers.repairs_started(name),
                sender=sender_counts if sender_status is not None else None,
                sender_cpu_s=after.sender_cpu_s - before.sender_cpu_s,
                sender_tx_bytes=after.sender_tx_bytes - before.sender_tx_bytes,
                receiver_cpu_s=after.receiver_cpu_s[name] - before.receiver_cpu_s[name],
            )
        )
    for line in notable_lines(brokers.brokers):
        result.note(f"{scenario}: {line}")
    result.runs += deliveries
    return deliveries


def measure(
    lan: Lan,
    directory: Path,
    rounds: int,
    settings: RunSettings,
    report: Callable[[str], None] = print,
) -> MulticastResult:
    """
    Play C{rounds} rounds of a run without loss then one with loss, each
    on fresh brokers under C{directory}; C{report} gets each receiver's run line.
    """
    result = MulticastResult(settings.loss_percent)
    for number in range(1, rounds + 1):
        for scenario in (NO_LOSS, loss_scenario(settings.loss_percent)):
            run_directory = directory / f"r{number}-{scenario}"
            for delivery in play_run(lan, run_directory, number, scenario, settings, result):
                report(delivery.line())
    return result
