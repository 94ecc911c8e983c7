"""
The benchmark's scenarios, the one runner that plays any of them, and the
line each result prints as.

A scenario is data: the load roles it starts (see
L{malamute_pack.bench.load}), which extra figures its line shows and how it
uses the broker's journal (L{JournalUse}: measured with and without it,
run once, or only with it). L{plan} says which scenarios run on which
broker. The runner starts one process per role, waits until every role has opened and
set up (so readers are subscribed before any writer starts), says go to all
at once, collects their reports and turns them into figures. The
``scale`` scenario has no roles of its own: L{malamute_pack.bench.scale}
plays it (stream_1to1 among many idle clients). The figures:

- secs: from the first send to the last counted delivery (or the last
  STORED 200, if that came later);
- msgs_per_s: messages sent by one sender (round trips for service_rr,
  STORED 200 acknowledgements for mailbox_durable) per second;
  delivered_per_s: deliveries counted over all receivers;
- lost: deliveries expected (n per counting role) minus counted;
- acked: STORED 200 acknowledgements (any other status is not acked);
- avg_rtt_us: the mean round trip of service_rr;
- p50_us, p99_us, p999_us, max_us: percentiles of the samples the counting
  roles took (service_rr's round trips; latency's delivery latencies);
- rate, achieved_per_s, behind: the rate the latency writer was paced at,
  the rate it achieved, and 1 if that fell short
  (L{malamute_pack.bench.latency.behind});
- journal: on or off, when the harness started the broker and so knows;
- broker: ours or other, in a comparison (L{malamute_pack.bench.compare}).

A journal_cost line compares one scenario's msgs_per_s with and without
the journal.

Tests: ``tests/system/test_bench.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Protocol

from malamute_pack.bench import latency, load
from malamute_pack.bench.percentiles import latency_figures
from malamute_pack.protocol import mlm

PAYLOAD = b"x" * 100
STREAM = "bench"
SUBJECT = "bench"
MAILBOX = "bench-rx"
# Its own mailbox: no letter left over from the mailbox scenario reaches it.
DURABLE_MAILBOX = "bench-durable-rx"
SERVICE = "echo"
REQUESTER = "bench-req"

LATENCY, SCALE = "latency", "scale"
# The latency scenario's rates (msgs/s) and seconds at each, unless told otherwise.
DEFAULT_RATES = (1000, 10_000, 50_000)
LATENCY_SECONDS = 5
# The figures every throughput line shows after its scenario, broker and journal.
COMMON_KEYS = ("n", "secs", "msgs_per_s", "lost")
PERCENTILE_KEYS = ("p50_us", "p99_us", "p999_us", "max_us")


class BenchError(Exception):
    """A role failed or died; the scenario has no figures."""


class JournalUse(enum.Enum):
    """How a scenario runs when the harness starts the broker itself."""

    # Against a broker with the journal and one without, to show its cost.
    COMPARED = "compared"
    # Once, with the journal unless the run is journal-off only.
    ONCE = "once"
    # Only against a broker with the journal: it measures the journal.
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Scenario:
    """
    @ivar roles: its load processes.
    @ivar default_n: messages per sender when C{--messages} is not given,
        sized so that each of its runs takes some 5-20 s against this
        broker on a 2-core machine and the whole default run (both brokers)
        about two minutes.
    @ivar extras: figures its line shows after the common ones.
    @ivar journal: how it uses the broker's journal.
    @ivar acknowledged: msgs_per_s counts STORED 200s, not messages sent.
    @ivar keys: the figures its line shows instead of L{COMMON_KEYS} and
        the extras, if not empty.
    @ivar extension: why another broker (the C broker) cannot play it: it
        needs an extension of ours; empty if any broker can.
    @ivar shared: its counting roles share the messages (a consumer
        group's members): C{n} deliveries in all, not C{n} each.
    """

    name: str
    roles: tuple[load.Role, ...]
    default_n: int
    extras: tuple[str, ...] = ()
    journal: JournalUse = JournalUse.ONCE
    acknowledged: bool = False
    keys: tuple[str, ...] = ()
    extension: str = ""
    shared: bool = False

    def shown(self) -> tuple[str, ...]:
        """The figures its line shows after the scenario's name, broker and journal."""
        return self.keys or (*COMMON_KEYS, *self.extras)


def _sender(name: str, setup: tuple[mlm.Message, ...], message: mlm.Message) -> load.Role:
    return load.Role(name, load.blast, name, setup, tuple(mlm.encode(message)))


def _stream_scenario(name: str, readers: int, default_n: int, extras: tuple[str, ...]) -> Scenario:
    reader_roles = tuple(
        load.Role(
            f"reader-{i}",
            load.count,
            setup=(mlm.StreamRead(STREAM, ""),),
            counts=mlm.StreamDeliver.ID,
        )
        for i in range(readers)
    )
    writer = _sender("writer", (mlm.StreamWrite(STREAM),), mlm.StreamSend(SUBJECT, [PAYLOAD]))
    return Scenario(name, (*reader_roles, writer), default_n, extras, JournalUse.COMPARED)


_CONSUMERS = "needs protocol version 2 (durable consumers), an extension of ours"
# A consumer commits this often (records), as a client library would.
COMMIT_EVERY = 1000


def _consumer_scenario(name: str, members: int, group: str) -> Scenario:
    """
    Stream 1:1 read by a version 2 reader (C{members} 0), a durable consumer
    (C{group} empty), or a consumer group's C{members}; consumers commit
    every L{COMMIT_EVERY} records. Each group scenario has a group of its
    own: members of another scenario's, gone but not yet expired, would
    hold records.
    """
    if members == 0:
        setups: list[mlm.Message] = [mlm.StreamReadFrom(STREAM, "", mlm.LATEST, 0)]
    else:
        setups = [
            mlm.StreamConsume(STREAM, "", f"bench-{i}", group, mlm.LATEST, 0)
            for i in range(members)
        ]
    readers = tuple(
        load.Role(
            f"reader-{i}",
            load.count,
            setup=(setup,),
            counts=mlm.StreamRecord.ID,
            version=2,
            commit_every=COMMIT_EVERY if members else 0,
        )
        for i, setup in enumerate(setups)
    )
    writer = _sender("writer", (mlm.StreamWrite(STREAM),), mlm.StreamSend(SUBJECT, [PAYLOAD]))
    extras = ("delivered_per_s",)
    return Scenario(
        name,
        (*readers, writer),
        300_000,
        extras,
        JournalUse.REQUIRED,
        extension=_CONSUMERS,
        shared=bool(group),
    )


def _latency_scenario() -> Scenario:
    reader = load.Role(
        "reader", latency.read, setup=(mlm.StreamRead(STREAM, ""),), counts=mlm.StreamDeliver.ID
    )
    writer = load.Role(
        "writer",
        latency.pace,
        "writer",
        (mlm.StreamWrite(STREAM),),
        (mlm.encode_header(mlm.StreamSend(SUBJECT)),),
    )
    keys = ("rate", "n", *PERCENTILE_KEYS, "lost", "achieved_per_s", "behind")
    # default_n is per rate: LATENCY_SECONDS of it (see default_messages).
    return Scenario(LATENCY, (reader, writer), 0, keys=keys)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _stream_scenario("stream_1to1", 1, 800_000, ()),
        _stream_scenario("stream_fanout10", 10, 250_000, ("delivered_per_s",)),
        Scenario(
            "mailbox",
            (
                load.Role("receiver", load.count, MAILBOX, counts=mlm.MailboxDeliver.ID),
                _sender("bench-tx", (), mlm.MailboxSend(MAILBOX, SUBJECT, "", 0, [PAYLOAD])),
            ),
            600_000,
            journal=JournalUse.COMPARED,
        ),
        Scenario(
            "mailbox_durable",
            (
                load.Role(
                    "receiver",
                    load.count,
                    DURABLE_MAILBOX,
                    counts=mlm.MailboxRecord.ID,
                    version=2,
                    done=True,
                ),
                load.Role(
                    "bench-durable-tx",
                    load.post,
                    "bench-durable-tx",
                    frames=tuple(
                        mlm.encode(mlm.MailboxSend(DURABLE_MAILBOX, SUBJECT, "", 0, [PAYLOAD]))
                    ),
                    version=2,
                ),
            ),
            250_000,
            ("acked",),
            JournalUse.REQUIRED,
            acknowledged=True,
            extension="needs protocol version 2 (durable letters, STORED), an extension of ours",
        ),
        Scenario(
            "service_rr",
            (
                load.Role("worker", load.serve, "", (mlm.ServiceOffer(SERVICE, ""),)),
                load.Role(
                    "requester",
                    load.request,
                    REQUESTER,
                    frames=tuple(mlm.encode(mlm.ServiceSend(SERVICE, SUBJECT, "", 0, [PAYLOAD]))),
                    counts=mlm.MailboxDeliver.ID,
                ),
            ),
            45_000,
            ("avg_rtt_us", *PERCENTILE_KEYS),
        ),
        _consumer_scenario("stream_1to1_v2", 0, ""),
        _consumer_scenario("stream_1to1_consumer", 1, ""),
        _consumer_scenario("stream_group1", 1, "bench-group1"),
        _consumer_scenario("stream_group3", 3, "bench-group3"),
        _consumer_scenario("stream_group10", 10, "bench-group10"),
        _latency_scenario(),
        # Played by malamute_pack.bench.scale: default_n is its stream_1to1 runs'.
        Scenario(SCALE, (), 300_000),
    )
}

STREAM_SCENARIOS = ("stream_1to1", "stream_fanout10")
# What runs when no --scenario is given: latency and scale run only when asked.
# Run only when asked: latency, scale, and the consumers' (issue 28's figures).
CONSUMER_SCENARIOS = (
    "stream_1to1_v2",
    "stream_1to1_consumer",
    "stream_group1",
    "stream_group3",
    "stream_group10",
)
DEFAULT_SCENARIOS = tuple(
    name for name in SCENARIOS if name not in (LATENCY, SCALE, *CONSUMER_SCENARIOS)
)


def default_messages(scenario: Scenario, rate: int) -> int:
    """A run's n when C{--messages} is not given (latency: C{rate} for its seconds)."""
    return rate * LATENCY_SECONDS if scenario.name == LATENCY else scenario.default_n


# --journal's choices.
JOURNAL_ON, JOURNAL_OFF, JOURNAL_BOTH = "on", "off", "both"


@dataclass(frozen=True, slots=True)
class BrokerRun:
    """
    Scenarios to play against one broker.

    @ivar journal: whether that broker journals; C{None} for a broker the
        harness did not start, which is what it is.
    """

    journal: bool | None
    scenarios: tuple[Scenario, ...]


def plan(names: Sequence[str], journal: str | None) -> list[BrokerRun]:
    """
    The brokers to start, in order, and what runs on each, for the
    scenarios C{names} and a C{--journal} choice (C{None}: an external
    broker, everything once). Without a journal a scenario that needs one
    is left out; with both, the compared scenarios run on the journal-off
    broker first, and everything on the journal-on one.
    """
    chosen = tuple(SCENARIOS[name] for name in names)
    if journal is None:
        return [BrokerRun(None, chosen)]
    runs = []
    if journal in (JOURNAL_OFF, JOURNAL_BOTH):
        # Alone it plays what it can; beside the journal-on broker, what is compared.
        skipped = {JournalUse.REQUIRED}
        if journal == JOURNAL_BOTH:
            skipped.add(JournalUse.ONCE)
        off = tuple(s for s in chosen if s.journal not in skipped)
        if off:
            runs.append(BrokerRun(False, off))
    if journal in (JOURNAL_ON, JOURNAL_BOTH):
        runs.append(BrokerRun(True, chosen))
    return runs


class Measured(Protocol):
    """What one play of a scenario against one broker gives: its line's figures."""

    def figures(self) -> dict[str, str]:
        """The figures by name, formatted, in the order they print."""

    def line(self) -> str:
        """The figures as C{name=value} separated by spaces."""


def line_of(figures: dict[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in figures.items())


def heading(name: str, broker: str | None, journal: bool | None) -> dict[str, str]:
    """The figures every line starts with: scenario, then broker and journal if known."""
    figures = {"scenario": name}
    if broker is not None:
        figures["broker"] = broker
    if journal is not None:
        figures["journal"] = "on" if journal else "off"
    return figures


@dataclass(frozen=True, slots=True)
class Result:
    """
    One run of a scenario's roles.

    @ivar n: messages a sender sent (round trips for a requester).
    @ivar reports: one per role, in the scenario's order.
    @ivar journal: whether the broker journals, if known.
    @ivar broker: ours or other, in a comparison; else C{None}.
    @ivar rate: the latency writer's pace (msgs/s); 0 for other scenarios.
    """

    scenario: Scenario
    n: int
    reports: tuple[load.Report, ...]
    journal: bool | None = None
    broker: str | None = None
    rate: int = 0

    def figures(self) -> dict[str, str]:
        """The scenario's figures by name, formatted, in the order they print."""
        counting = [
            report
            for role, report in zip(self.scenario.roles, self.reports, strict=True)
            if role.counts
        ]
        delivered = sum(r.received for r in counting)
        acked = sum(r.acked for r in self.reports)
        starts = [r.first_send for r in self.reports if r.first_send is not None]
        ends = [r.last_receipt for r in counting if r.last_receipt is not None]
        ends += [r.last_ack for r in self.reports if r.last_ack is not None]
        secs = max(ends) - min(starts) if starts and ends else 0.0
        paced = next((r for r in self.reports if r.last_send is not None), load.Report())
        achieved = latency.achieved(paced.sent, paced.first_send, paced.last_send)

        def rate(count: int) -> str:
            return f"{count / secs:.0f}" if secs > 0 else "0"

        figures = {
            "rate": str(self.rate),
            "n": str(self.n),
            "secs": f"{secs:.3f}",
            "msgs_per_s": rate(acked if self.scenario.acknowledged else self.n),
            "lost": str(self.n * (1 if self.scenario.shared else len(counting)) - delivered),
            "acked": str(acked),
            "delivered_per_s": rate(delivered),
            "avg_rtt_us": f"{sum(r.rtt_total for r in counting) / delivered * 1e6:.1f}"
            if delivered
            else "0",
            **latency_figures([sample for r in counting for sample in r.samples]),
            "achieved_per_s": f"{achieved:.0f}",
            "behind": "1" if latency.behind(self.rate, achieved) else "0",
        }
        shown = heading(self.scenario.name, self.broker, self.journal)
        return shown | {name: figures[name] for name in self.scenario.shown()}

    def line(self) -> str:
        return line_of(self.figures())


def journal_cost_lines(results: Sequence[Result]) -> list[str]:
    """
    For each scenario that ran both with and without the journal, the line
    comparing its msgs_per_s (ratio: with over without).
    """
    off = {r.scenario.name: r for r in results if r.journal is False}
    lines = []
    for on in results:
        without = off.get(on.scenario.name)
        if on.journal is not True or without is None:
            continue
        on_rate = float(on.figures()["msgs_per_s"])
        off_rate = float(without.figures()["msgs_per_s"])
        ratio = f"{on_rate / off_rate:.2f}" if off_rate else "0"
        lines.append(
            f"journal_cost scenario={on.scenario.name} on_msgs_per_s={on_rate:.0f} "
            f"off_msgs_per_s={off_rate:.0f} ratio={ratio}"
        )
    return lines


def _collect(
    pipes: Sequence[Connection],
    processes: Sequence[BaseProcess],
    roles: Sequence[load.Role],
    expected: str,
) -> list[object]:
    """The value each role sends with C{expected}; L{BenchError} if one fails or dies."""
    values: dict[int, object] = {}
    index = {id(pipe): i for i, pipe in enumerate(pipes)}
    while len(values) < len(pipes):
        waiting = [p for i, p in enumerate(pipes) if i not in values]
        for ready in wait(waiting, timeout=1.0):
            i = index[id(ready)]
            try:
                kind, value = pipes[i].recv()
            except EOFError:
                code = processes[i].exitcode
                raise BenchError(f"{roles[i].name} died (exit code {code})") from None
            if kind != expected:
                raise BenchError(f"{roles[i].name} sent {kind} where {expected} was due: {value}")
            values[i] = value
    return [values[i] for i in range(len(pipes))]


def run(
    scenario: Scenario,
    endpoint: str,
    job: load.Job,
    context: BaseContext,
    journal: bool | None = None,
    broker: str | None = None,
) -> Result:
    """
    Play C{scenario} against the broker at C{endpoint} (which journals if
    C{journal}, when that is known; called C{broker} in a comparison) with
    C{job.n} messages a sender (at C{job.rate}, for a paced one).

    @raise BenchError: a role failed; or the scenario is not one this plays
        (scale, which L{malamute_pack.bench.scale} plays), or is latency
        without a rate.
    """
    if not scenario.roles:
        raise BenchError(f"{scenario.name} has no roles of its own: play it with its module")
    if scenario.name == LATENCY and job.rate < 1:
        raise BenchError("latency needs a rate: a Job with rate of at least 1 msg/s")
    pipes: list[Connection] = []
    processes: list[BaseProcess] = []
    try:
        for role in scenario.roles:
            ours, theirs = context.Pipe()
            process = context.Process(  # type: ignore[attr-defined]
                target=load.run_role,
                args=(role, endpoint, job, theirs),
                name=f"bench-{scenario.name}-{role.name}",
                daemon=True,
            )
            process.start()
            theirs.close()
            pipes.append(ours)
            processes.append(process)
        _collect(pipes, processes, scenario.roles, load.READY)
        for pipe in pipes:
            pipe.send((load.GO, None))
        reports: list[load.Report] = []
        for role, value in zip(
            scenario.roles, _collect(pipes, processes, scenario.roles, load.REPORT), strict=True
        ):
            if not isinstance(value, load.Report):
                raise BenchError(f"{role.name} reported {value!r}")
            reports.append(value)
        for pipe in pipes:
            pipe.send((load.STOP, None))
        for process in processes:
            process.join(10)
        return Result(scenario, job.n, tuple(reports), journal, broker, job.rate)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in pipes:
            pipe.close()
