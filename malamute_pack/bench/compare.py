"""
``--compare EP``: the same scenarios against our broker and another one
(the C broker at EP), in alternation, and the ratios of their medians.

Each scenario (each rate of the latency scenario) is played C{rounds}
times against each broker, the two alternating, and the order flips every
round (ours, other; other, ours; ...) so that a machine that slows or
speeds up over the rounds weighs on both alike. Every run prints its line,
with ``broker=ours`` or ``broker=other``; then the scenario's
comparison line, of medians over the rounds::

    compare scenario=NAME [rate=R] ours_msgs_per_s=M other_msgs_per_s=M ratio=R ... rounds=R

where ``ratio`` is ours over other (above 1: ours is faster). Each
scenario compares the figures in L{COMPARED}: throughput always (the
latency scenario's achieved rate, scale's with the idle clients), and
more where it has them, each with a ratio named for its direction:
fan-out's deliveries (``delivered_ratio``, ours over other), service and
latency percentiles (``p99_ratio_other_over_ours``: other over ours, so
that again above 1 means ours is better), scale's throughput ratio and
memory per client. Scale's memory figures are the broker process's growth
over the play, which only a broker's first play measures (a later play on
the same process reuses the memory the first one's clients freed, and
shows about half the growth): they are taken from the first round alone.

The other broker is not ours: a scenario that needs our extensions
(mailbox_durable) is played against ours only, and a line says why it
was skipped against the other (L{malamute_pack.bench.plays.skip_reason}),
as is scale without the other's pid.

Tests: ``tests/system/test_bench_compare.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.context import BaseContext

from malamute_pack.bench.plays import Choices, Target, play, skip_reason
from malamute_pack.bench.scenarios import LATENCY, SCALE, SCENARIOS, Measured

OURS, OTHER = "ours", "other"
DEFAULT_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Compared:
    """
    One figure a comparison line shows: ``ours_LABEL`` and ``other_LABEL``
    (medians) and, if C{ratio} names one, their ratio: ours over other, or
    other over ours where lower is better (C{lower_better}).

    @ivar key: the figure's name in the runs' lines.
    @ivar label: its name in the comparison line (the key unless given).
    @ivar first_only: only each broker's first run counts (its process's
        growth, which later runs on the same process understate).
    """

    key: str
    ratio: str = ""
    lower_better: bool = False
    label: str = ""
    first_only: bool = False

    def name(self) -> str:
        return self.label or self.key


_THROUGHPUT = Compared("msgs_per_s", "ratio")


def _percentiles(*keys: str) -> tuple[Compared, ...]:
    return tuple(
        Compared(key, f"{key.removesuffix('_us')}_ratio_other_over_ours", True) for key in keys
    )


COMPARED: dict[str, tuple[Compared, ...]] = {
    "stream_fanout10": (_THROUGHPUT, Compared("delivered_per_s", "delivered_ratio")),
    "service_rr": (_THROUGHPUT, *_percentiles("p50_us", "p99_us")),
    LATENCY: (Compared("achieved_per_s", "ratio"), *_percentiles("p50_us", "p99_us", "p999_us")),
    SCALE: (
        Compared("with_msgs_per_s", "ratio", label="msgs_per_s"),
        Compared("ratio", label="with_over_without"),
        Compared(
            "rss_per_client_kib", "rss_per_client_ratio_other_over_ours", True, first_only=True
        ),
        Compared("rss_per_subscription_b", first_only=True),
    ),
}


def compared(scenario: str) -> tuple[Compared, ...]:
    """The figures a comparison of C{scenario} shows (throughput alone by default)."""
    return COMPARED.get(scenario, (_THROUGHPUT,))


def order(round_number: int) -> tuple[str, str]:
    """Which broker plays first in round C{round_number} (from 0): ours in even rounds."""
    return (OURS, OTHER) if round_number % 2 == 0 else (OTHER, OURS)


def _decimals(value: str) -> int:
    return len(value.partition(".")[2])


def median(values: Sequence[str]) -> str:
    """The median of figures as printed, with as many decimals as the most precise of them."""
    middle = statistics.median(float(v) for v in values)
    return f"{middle:.{max(_decimals(v) for v in values)}f}"


def ratio(numerator: str, denominator: str) -> str:
    """C{numerator} over C{denominator} to two decimals; 0 when the denominator is."""
    return f"{float(numerator) / float(denominator):.2f}" if float(denominator) else "0"


def compare_lines(figures: Sequence[dict[str, str]]) -> list[str]:
    """
    One comparison line per scenario (and rate) that has runs with both
    C{broker=ours} and C{broker=other} among C{figures}, in the order they
    first appear: medians over each broker's runs (its first run alone for
    a L{Compared.first_only} figure), ratios of the medians; ``rounds`` is
    the fewer of the two brokers' runs.
    """
    groups: dict[tuple[str, str], dict[str, list[dict[str, str]]]] = {}
    for run in figures:
        key = (run["scenario"], run.get("rate", ""))
        groups.setdefault(key, {}).setdefault(run.get("broker", ""), []).append(run)
    lines = []
    for (scenario, rate), by_broker in groups.items():
        ours, other = by_broker.get(OURS, []), by_broker.get(OTHER, [])
        if not ours or not other:
            continue
        fields = [f"scenario={scenario}", *([f"rate={rate}"] if rate else [])]
        for figure in compared(scenario):
            counted = 1 if figure.first_only else None
            mine = median([run[figure.key] for run in ours[:counted]])
            theirs = median([run[figure.key] for run in other[:counted]])
            fields += [f"ours_{figure.name()}={mine}", f"other_{figure.name()}={theirs}"]
            if figure.ratio:
                value = ratio(theirs, mine) if figure.lower_better else ratio(mine, theirs)
                fields.append(f"{figure.ratio}={value}")
        fields.append(f"rounds={min(len(ours), len(other))}")
        lines.append(" ".join(["compare", *fields]))
    return lines


def run_comparison(
    names: Sequence[str],
    ours: Target,
    other: Target,
    choices: Choices,
    rounds: int,
    context: BaseContext,
    emit: Callable[[str], None],
) -> list[Measured]:
    """
    Play the scenarios C{names} against C{ours} and C{other} (see the
    module), giving every line to C{emit} as it comes: the runs', the
    skips' (C{# skipped ...}), each scenario's comparison. Every result.
    """
    results: list[Measured] = []
    targets = {OURS: ours, OTHER: other}
    for name in names:
        scenario = SCENARIOS[name]
        skipped = {label: skip_reason(scenario, t) for label, t in targets.items()}
        for label, reason in skipped.items():
            if reason:
                emit(f"# skipped scenario={name} broker={label}: {reason}")
        rates = choices.rates if name == LATENCY else (0,)
        for rate in rates:
            one = replace(choices, rates=(rate,)) if name == LATENCY else choices
            played: list[Measured] = []
            for round_number in range(rounds):
                for label in order(round_number):
                    if skipped[label]:
                        continue
                    for result in play(scenario, targets[label], one, context):
                        emit(result.line())
                        played.append(result)
            for line in compare_lines([result.figures() for result in played]):
                emit(line)
            results += played
    return results
