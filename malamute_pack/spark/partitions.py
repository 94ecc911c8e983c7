"""
Planning by sequence numbers: how a read is split into partitions, and how
much a streaming micro-batch admits. Pure functions over numbers.

A span is a stream's inclusive range of sequence numbers. Both the split
and the admission count sequence numbers, not records: a pattern may keep
fewer, and numbers that were never used (the journal skips ahead after a
crash) count too. That keeps planning to one status query per stream.

Tests: ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """Sequence numbers ``first`` to ``last`` (inclusive) of ``stream``; empty if last < first."""

    stream: str
    first: int
    last: int

    def __len__(self) -> int:
        return max(0, self.last - self.first + 1)


def split_spans(
    spans: Iterable[Span], *, rows_per_partition: int | None = None, partitions: int | None = None
) -> list[Span]:
    """
    ``spans`` cut into pieces of at most ``rows_per_partition`` sequence
    numbers, or, with ``partitions``, of the size that makes that many
    pieces over all spans together (a piece never holds two streams, so
    there can be up to one more piece per extra stream). Empty spans are
    dropped; pieces come stream by stream, in sequence order.
    """
    wanted = [span for span in spans if len(span)]
    if partitions is not None:
        total = sum(len(span) for span in wanted)
        size = max(1, -(-total // partitions))
    elif rows_per_partition is not None:
        size = rows_per_partition
    else:
        raise ValueError("give rows_per_partition or partitions")
    if size < 1:
        raise ValueError(f"a partition holds at least one sequence number, not {size}")
    return [
        Span(span.stream, first, min(first + size - 1, span.last))
        for span in wanted
        for first in range(span.first, span.last + 1, size)
    ]


def admit(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """
    The end offset of a micro-batch that takes at most ``max_rows``
    sequence numbers past ``start`` (stream -> last number included) toward
    ``latest``, shared fairly: each stream with numbers waiting gets an
    equal share, and what one cannot use goes to the others. A stream never
    goes back (``latest`` below ``start`` leaves it where it is). Keys
    sorted, as offsets must be.
    """
    if max_rows < 1:
        raise ValueError(f"a micro-batch admits at least one row, not {max_rows}")
    end = {stream: start[stream] for stream in latest}
    waiting = {stream: latest[stream] - start[stream] for stream in latest}
    waiting = {stream: count for stream, count in waiting.items() if count > 0}
    budget = max_rows
    while budget and waiting:
        share = max(1, budget // len(waiting))
        for stream in sorted(waiting):
            take = min(share, waiting[stream], budget)
            end[stream] += take
            budget -= take
            waiting[stream] -= take
            if not waiting[stream]:
                del waiting[stream]
            if not budget:
                break
    return dict(sorted(end.items()))
