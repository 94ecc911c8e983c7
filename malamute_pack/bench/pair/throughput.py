"""
The pair benchmark's throughput part: the same load against a single
broker with its journal, a pair replicating synchronously and one
replicating asynchronously (L{malamute_pack.bench.pair.brokers}), in
rounds that play the setups in turn (single, sync, async, then again), so
that drift (growing journals, a busy host) is shared out evenly. All three
setups run for the whole measurement; the load goes to the active broker.

Measures (L{MEASURES}), each a line of figures per round and setup:

- mailbox_durable: the benchmark's scenario
  (L{malamute_pack.bench.scenarios}): a version 2 sender pipelines
  MAILBOX_SEND with a window of letters waiting for STORED; msgs_per_s
  counts STORED 200s (in a sync pair, each comes once the passive has
  the letter in its journal).
- stream_1to1: one writer, one reader; msgs_per_s is messages delivered
  to the reader per second of the run.
- stream_append: idempotent appends through the bulk client
  (L{BulkClient.append}), L{APPEND_BATCH} records of
  L{scenarios.PAYLOAD} each, one after the other, counted by their
  STREAM_APPENDED; msgs_per_s is records per second.

L{ThroughputResult} keeps every line and makes the summary: per measure,
the median of each setup and its ratio to the single broker.

With C{curve} (C{--curve}), the setups are instead a sync pair with an
open link and one with a CURVE link (C{--pair-key}; C{mode=curve}), each
round playing them in turn, the open one first in odd rounds and the
CURVE one first in even rounds; the summary is the CURVE pair's median
against the open one's (C{pair_curve} lines, goal: a ratio of 0.9 or more).

Tests: ``tests/system/test_bench_pair.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.pair.brokers import CURVE_MODES, MODES, SINGLE, SYNC, SetupBrokers
from malamute_pack.client.bulk import BulkClient

MAILBOX, STREAM, APPEND = "mailbox_durable", "stream_1to1", "stream_append"
MEASURES = (MAILBOX, STREAM, APPEND)
# Records per STREAM_APPEND.
APPEND_BATCH = 1000
APPEND_STREAM = "bench-append"


@dataclass(frozen=True, slots=True)
class Counts:
    """How much each measure sends per run: letters, stream messages, appended records."""

    letters: int
    messages: int
    appended: int
    window: int = load.DEFAULT_WINDOW

    def of(self, measure: str) -> int:
        return {MAILBOX: self.letters, STREAM: self.messages, APPEND: self.appended}[measure]


def append_records(endpoint: str, n: int, key_prefix: str) -> dict[str, str]:
    """
    Append C{n} records to L{APPEND_STREAM} at C{endpoint} in batches of
    L{APPEND_BATCH} (keys C{key_prefix-i}); the figures of the run.
    """
    batch = [(scenarios.SUBJECT, [scenarios.PAYLOAD])] * APPEND_BATCH
    written = 0
    with BulkClient(endpoint) as client:
        started = time.monotonic()
        number = 0
        while written < n:
            size = min(APPEND_BATCH, n - written)
            appended = client.append(APPEND_STREAM, f"{key_prefix}-{number}", batch[:size])
            written += appended.last - appended.first + 1
            number += 1
        secs = time.monotonic() - started
    return {
        "scenario": APPEND,
        "n": str(n),
        "secs": f"{secs:.3f}",
        "msgs_per_s": f"{written / secs:.0f}" if secs > 0 else "0",
        "lost": str(n - written),
    }


def play(
    measure: str, endpoint: str, counts: Counts, context: BaseContext, key: str
) -> dict[str, str]:
    """Play one measure against the broker at C{endpoint}; its figures."""
    if measure == APPEND:
        return append_records(endpoint, counts.appended, key)
    job = load.Job(counts.of(measure), window=counts.window)
    return scenarios.run(scenarios.SCENARIOS[measure], endpoint, job, context, True).figures()


@dataclass
class ThroughputResult:
    """
    Every run's figures (with its C{round} and C{mode}) and their summary.

    @ivar modes: the setups compared, in order.
    @ivar base: the setup the others' ratios are to.
    @ivar kind: the first word of the summary's lines.
    @ivar labels: the names a setup's figures take in the summary, when
        not its mode's (the open link's sync pair is C{open} beside C{curve}).
    """

    runs: list[dict[str, str]] = field(default_factory=list)
    modes: tuple[str, ...] = MODES
    base: str = SINGLE
    kind: str = "pair_throughput"
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def curve(cls) -> ThroughputResult:
        """The result of a CURVE comparison: a CURVE link's sync pair against an open one's."""
        return cls(modes=CURVE_MODES, base=SYNC, kind="pair_curve", labels={SYNC: "open"})

    def values(self, measure: str, mode: str) -> list[float]:
        return [
            float(run["msgs_per_s"])
            for run in self.runs
            if run["scenario"] == measure and run["mode"] == mode
        ]

    def summary(self) -> list[dict[str, str]]:
        """
        Per measure played: each setup's median msgs_per_s, its ratio to
        the base setup's (the single broker's), and losses.
        """
        rows = []
        for measure in MEASURES:
            medians = {
                mode: statistics.median(values)
                for mode in self.modes
                if (values := self.values(measure, mode))
            }
            if not medians:
                continue
            row = {"measure": measure}
            base = medians.get(self.base)
            for mode, value in medians.items():
                row[f"{self.labels.get(mode, mode)}_per_s"] = f"{value:.0f}"
            for mode, value in medians.items():
                if mode != self.base:
                    row[f"{mode}_ratio"] = f"{value / base:.2f}" if base else "-"
            lost = sum(int(r["lost"]) for r in self.runs if r["scenario"] == measure)
            row["lost"] = str(lost)
            rows.append(row)
        return rows

    def lines(self) -> list[str]:
        """
        C{pair_throughput measure=... single_per_s=... sync_ratio=...} lines
        (C{pair_curve measure=... open_per_s=... curve_per_s=... curve_ratio=...}).
        """
        return [f"{self.kind} " + _pairs(row) for row in self.summary()]


def _pairs(figures: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in figures.items())


def run_line(figures: Mapping[str, str]) -> str:
    """The line one run prints: C{pair_run round=R mode=M scenario=S n=... msgs_per_s=...}."""
    return "pair_run " + _pairs(figures)


def measure_throughput(
    directory: Path,
    rounds: int,
    measures: Sequence[str],
    counts: Counts,
    context: BaseContext,
    heartbeat_ms: int | None = None,
    report: Callable[[str], None] = print,
    curve: bool = False,
) -> ThroughputResult:
    """
    Start the setups under C{directory} (single, sync, async), play
    C{measures} on each in turn for C{rounds} rounds, stop them (checked);
    C{report} gets each run's line.

    @param curve: compare a sync pair with a CURVE link and one with an open
        link instead (see the module): in even rounds the CURVE one plays first.
    """
    result = ThroughputResult.curve() if curve else ThroughputResult()
    setups = [SetupBrokers(directory / mode, mode, heartbeat_ms) for mode in result.modes]
    started: list[SetupBrokers] = []
    try:
        for setup in setups:
            started.append(setup)  # a pair half started is killed too
            setup.start()
        for number in range(1, rounds + 1):
            for setup in setups[::-1] if curve and number % 2 == 0 else setups:
                for measure in measures:
                    key = f"r{number}-{setup.mode}"
                    figures = play(measure, setup.active_endpoint, counts, context, key)
                    run = {"round": str(number), "mode": setup.mode, **figures}
                    result.runs.append(run)
                    report(run_line(run))
    except BaseException:
        for setup in started:
            setup.kill()
        raise
    for setup in started:
        setup.stop()
    return result
