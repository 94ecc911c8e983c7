"""
The pack benchmark's figures and tables, pure functions: medians and
ratios that may be missing, table cells and text tables, and a figure
measured in an open and a CURVE pack (L{Comparison}: their medians and the
ratio CURVE/open) with the table of them (L{comparison_lines}).

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from malamute_pack.bench.pack.common import CURVE, OPEN


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


@dataclass(frozen=True)
class Comparison:
    """
    One figure measured in an open pack and in a CURVE pack, every round's
    value of each: L{row} shows their medians and the ratio CURVE/open.

    @ivar measure: what is measured (C{stream_1to1 msgs/s}, C{discovery_s}).
    @ivar case: where (C{cross_host}; C{beacon n=16}).
    @ivar digits: the decimals its medians show with.
    """

    measure: str
    case: str
    open: Sequence[float]
    curve: Sequence[float]
    digits: int = 0

    @property
    def ratio(self) -> float | None:
        """The CURVE median over the open one (None if either is missing or 0)."""
        return ratio(median(self.curve), median(self.open))

    def row(self) -> list[str]:
        return [
            self.measure,
            self.case,
            show(median(self.open), self.digits),
            show(median(self.curve), self.digits),
            show(self.ratio, 2),
            f"{len(self.open)}/{len(self.curve)}",
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "measure": self.measure,
            "case": self.case,
            OPEN: median(self.open),
            CURVE: median(self.curve),
            "ratio": self.ratio,
            f"{OPEN}_values": list(self.open),
            f"{CURVE}_values": list(self.curve),
        }


COMPARISON_HEADERS = ["measure", "case", OPEN, CURVE, f"{CURVE}/{OPEN}", "samples"]


def comparison_lines(comparisons: Sequence[Comparison]) -> list[str]:
    """The comparisons as a table: medians open and CURVE, the ratio, how many values each."""
    return table(COMPARISON_HEADERS, [c.row() for c in comparisons])
