"""
The benchmark's scenarios, the one runner that plays any of them, and the
line each result prints as.

A scenario is data: the load roles it starts (see
L{malamute_pack.bench.load}) and which extra figures its line shows. The
runner starts one process per role, waits until every role has opened and
set up (so readers are subscribed before any writer starts), says go to all
at once, collects their reports and turns them into figures:

- secs: from the first send to the last counted delivery;
- msgs_per_s: messages sent by one sender (round trips for service_rr)
  per second; delivered_per_s: deliveries counted over all receivers;
- lost: deliveries expected (n per counting role) minus counted.

Tests: ``tests/test_bench.py``.
"""

from __future__ import annotations

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
SERVICE = "echo"
REQUESTER = "bench-req"


class BenchError(Exception):
    """A role failed or died; the scenario has no figures."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """
    @ivar roles: its load processes.
    @ivar default_n: messages per sender when C{--messages} is not given,
        sized so the scenario takes some 10-15 s against this broker on a
        2-core machine.
    @ivar extras: figures its line shows after the common ones.
    """

    name: str
    roles: tuple[load.Role, ...]
    default_n: int
    extras: tuple[str, ...] = ()


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
    writer = _sender(
        "writer", (mlm.StreamWrite(STREAM),), mlm.StreamSend(SUBJECT, [PAYLOAD])
    )
    return Scenario(name, (*reader_roles, writer), default_n, extras)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _stream_scenario("stream_1to1", 1, 1_000_000, ()),
        _stream_scenario("stream_fanout10", 10, 300_000, ("delivered_per_s",)),
        Scenario(
            "mailbox",
            (
                load.Role("receiver", load.count, MAILBOX, counts=mlm.MailboxDeliver.ID),
                _sender("bench-tx", (), mlm.MailboxSend(MAILBOX, SUBJECT, "", 0, [PAYLOAD])),
            ),
            800_000,
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
            60_000,
            ("avg_rtt_us",),
        ),
    )
}

STREAM_SCENARIOS = ("stream_1to1", "stream_fanout10")


@dataclass(frozen=True, slots=True)
class Result:
    scenario: Scenario
    n: int
    reports: tuple[load.Report, ...]

    def figures(self) -> dict[str, str]:
        """The scenario's figures by name, formatted, in the order they print."""
        counting = [
            report
            for role, report in zip(self.scenario.roles, self.reports, strict=True)
            if role.counts
        ]
        delivered = sum(r.received for r in counting)
        starts = [r.first_send for r in self.reports if r.first_send is not None]
        ends = [r.last_receipt for r in counting if r.last_receipt is not None]
        secs = max(ends) - min(starts) if starts and ends else 0.0

        def rate(count: int) -> str:
            return f"{count / secs:.0f}" if secs > 0 else "0"

        figures = {
            "scenario": self.scenario.name,
            "n": str(self.n),
            "secs": f"{secs:.3f}",
            "msgs_per_s": rate(self.n),
            "lost": str(self.n * len(counting) - delivered),
            "delivered_per_s": rate(delivered),
            "avg_rtt_us": f"{sum(r.rtt_total for r in counting) / delivered * 1e6:.1f}"
            if delivered
            else "0",
        }
        shown = ("scenario", "n", "secs", "msgs_per_s", "lost", *self.scenario.extras)
        return {name: figures[name] for name in shown}

    def line(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.figures().items())


def _collect(
    pipes: Sequence[Connection], processes: Sequence[BaseProcess], roles: Sequence[load.Role],
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


def run(scenario: Scenario, endpoint: str, n: int, context: BaseContext) -> Result:
    """Play C{scenario} against the broker at C{endpoint} with C{n} messages a sender."""
    job = load.Job(n)
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
        return Result(scenario, n, tuple(reports))
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in pipes:
            pipe.close()
