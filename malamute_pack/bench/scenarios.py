"""
The benchmark's scenarios, the one runner that plays any of them, and the
line each result prints as.

A scenario is data: the load roles it starts (see
L{malamute_pack.bench.load}), which extra figures its line shows and how it
uses the broker's journal (L{JournalUse}: measured with and without it,
run once, or only with it). L{plan} says which scenarios run on which
broker. The runner starts one process per role, waits until every role has opened and
set up (so readers are subscribed before any writer starts), says go to all
at once, collects their reports and turns them into figures:

- secs: from the first send to the last counted delivery (or the last
  STORED 200, if that came later);
- msgs_per_s: messages sent by one sender (round trips for service_rr,
  STORED 200 acknowledgements for mailbox_durable) per second;
  delivered_per_s: deliveries counted over all receivers;
- lost: deliveries expected (n per counting role) minus counted;
- acked: STORED 200 acknowledgements (any other status is not acked);
- journal: on or off, when the harness started the broker and so knows.

A journal_cost line compares one scenario's msgs_per_s with and without
the journal.

Tests: ``tests/test_bench.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from malamute_pack.bench import load
from malamute_pack.protocol import mlm

PAYLOAD = b"x" * 100
STREAM = "bench"
SUBJECT = "bench"
MAILBOX = "bench-rx"
# Its own mailbox: no letter left over from the mailbox scenario reaches it.
DURABLE_MAILBOX = "bench-durable-rx"
SERVICE = "echo"
REQUESTER = "bench-req"


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
    """

    name: str
    roles: tuple[load.Role, ...]
    default_n: int
    extras: tuple[str, ...] = ()
    journal: JournalUse = JournalUse.ONCE
    acknowledged: bool = False


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
            ("avg_rtt_us",),
        ),
    )
}

STREAM_SCENARIOS = ("stream_1to1", "stream_fanout10")

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


@dataclass(frozen=True, slots=True)
class Result:
    scenario: Scenario
    n: int
    reports: tuple[load.Report, ...]
    journal: bool | None = None

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

        def rate(count: int) -> str:
            return f"{count / secs:.0f}" if secs > 0 else "0"

        figures = {
            "scenario": self.scenario.name,
            "journal": "" if self.journal is None else ("on" if self.journal else "off"),
            "n": str(self.n),
            "secs": f"{secs:.3f}",
            "msgs_per_s": rate(acked if self.scenario.acknowledged else self.n),
            "lost": str(self.n * len(counting) - delivered),
            "acked": str(acked),
            "delivered_per_s": rate(delivered),
            "avg_rtt_us": f"{sum(r.rtt_total for r in counting) / delivered * 1e6:.1f}"
            if delivered
            else "0",
        }
        journal = ("journal",) if self.journal is not None else ()
        shown = ("scenario", *journal, "n", "secs", "msgs_per_s", "lost", *self.scenario.extras)
        return {name: figures[name] for name in shown}

    def line(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.figures().items())


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
) -> Result:
    """
    Play C{scenario} against the broker at C{endpoint} (which journals if
    C{journal}, when that is known) with C{job.n} messages a sender.
    """
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
        return Result(scenario, job.n, tuple(reports), journal)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in pipes:
            pipe.close()
