"""
Batch reads of the ``malamute`` source: the driver asks the broker (or the
journal file) where each stream's ``start`` and ``end`` are, once, and
splits the numbers between into partitions of sequence ranges
(:mod:`malamute_pack.spark.partitions`); executors read their ranges in
parallel (:mod:`malamute_pack.spark.reading`).

``end`` is exclusive, and never past what the stream had durably written
when the read was planned: records written later are not read, so every
partition's range is fixed when the job starts. With ``lastValues`` each
stream is one partition that keeps the latest record of each subject
(:mod:`malamute_pack.spark.last_values`).

Tests: ``tests/system/test_spark.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from malamute_pack.spark.journal_file import JournalFile
from malamute_pack.spark.last_values import LastValuesPartition, read_last_values
from malamute_pack.spark.options import ReadOptions
from malamute_pack.spark.partitions import Span, split_spans
from malamute_pack.spark.reading import (
    RangePartition,
    RangeSource,
    open_source,
    read_partition,
)


def read_streams(source: RangeSource, options: ReadOptions) -> list[str]:
    """The streams a read covers: those named, or every stream of a journal file."""
    if options.streams:
        return list(options.streams)
    assert isinstance(source, JournalFile), "a broker read names its streams"
    return source.streams()


def plan_spans(source: RangeSource, options: ReadOptions) -> list[Span]:
    """Each stream's numbers from ``start`` up to (not including) ``end``."""
    spans = []
    for stream in read_streams(source, options):
        start = source.status(stream, options.start.whence, options.start.value)
        end = source.status(stream, options.end.whence, options.end.value)
        spans.append(Span(stream, max(start.position, 1), min(end.position - 1, end.last)))
    return spans


def range_partitions(options: ReadOptions, spans: Sequence[Span]) -> list[RangePartition]:
    """C{spans} split as C{options} say, each piece a partition (batch and streaming reads)."""
    pieces = split_spans(
        spans, rows_per_partition=options.rows_per_partition, partitions=options.partitions
    )
    return [
        RangePartition(
            options.target,
            span.stream,
            span.first,
            span.last,
            options.pattern,
            options.fail_on_data_loss,
        )
        for span in pieces
    ]


class MalamuteReader(DataSourceReader):
    """A batch read: partitions planned on the driver, each read by an executor."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        with open_source(options.target) as source:
            spans = plan_spans(source, options)
        if options.last_values:
            return [
                LastValuesPartition(
                    options.target, span.stream, span.first, span.last, options.pattern
                )
                for span in spans
            ] or [RangePartition(options.target, "", 1, 0)]
        pieces = range_partitions(options, spans)
        # Spark reads a placeholder partition of its own when given none.
        return pieces or [RangePartition(options.target, "", 1, 0)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, LastValuesPartition):
            return read_last_values(partition)
        assert isinstance(partition, RangePartition)
        return read_partition(partition)
