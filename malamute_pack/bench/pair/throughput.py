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

Tests: ``tests/test_bench_pair.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from pathlib import Path

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.pair.brokers import MODES, SINGLE, SetupBrokers
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
    """Every run's figures (with its C{round} and C{mode}) and their summary."""

    runs: list[dict[str, str]] = field(default_factory=list)

    def values(self, measure: str, mode: str) -> list[float]:
        return [
            float(run["msgs_per_s"])
            for run in self.runs
            if run["scenario"] == measure and run["mode"] == mode
        ]

    def summary(self) -> list[dict[str, str]]:
        """Per measure played: each setup's median msgs_per_s, its ratio to single, and losses."""
        rows = []
        for measure in MEASURES:
            medians = {
                mode: statistics.median(values)
                for mode in MODES
                if (values := self.values(measure, mode))
            }
            if not medians:
                continue
            row = {"measure": measure}
            single = medians.get(SINGLE)
            for mode, value in medians.items():
                row[f"{mode}_per_s"] = f"{value:.0f}"
            for mode, value in medians.items():
                if mode != SINGLE:
                    row[f"{mode}_ratio"] = f"{value / single:.2f}" if single else "-"
            lost = sum(int(r["lost"]) for r in self.runs if r["scenario"] == measure)
            row["lost"] = str(lost)
            rows.append(row)
        return rows

    def lines(self) -> list[str]:
        """C{pair_throughput measure=... single_per_s=... sync_ratio=...} lines."""
        return ["pair_throughput " + _pairs(row) for row in self.summary()]


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
) -> ThroughputResult:
    """
    Start the three setups under C{directory}, play C{measures} on each in
    turn for C{rounds} rounds, stop them (checked); C{report} gets each run's line.
    """
    result = ThroughputResult()
    setups = [SetupBrokers(directory / mode, mode, heartbeat_ms) for mode in MODES]
    started: list[SetupBrokers] = []
    try:
        for setup in setups:
            started.append(setup)  # a pair half started is killed too
            setup.start()
        for number in range(1, rounds + 1):
            for setup in setups:
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
