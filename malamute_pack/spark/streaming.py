"""
Streaming reads of the ``malamute`` source (``spark.readStream``).

An offset is ``{stream: last sequence number included}``, keys sorted
(Spark compares offsets as JSON text). The first micro-batch starts at
option ``start`` (default ``latest``: only what is written from now on);
a query restarted from its checkpoint goes on from the offset Spark
journaled there, so each record reaches the query once. A stream named in
the options but missing from a checkpoint's offset (added since) joins the
offset at ``start`` (one empty micro-batch for it) and is read from there
on; one no longer named is left out.

``latestOffset`` asks the broker for each stream's last durable number
(what a range read can then deliver) and honours Spark's read limit:
``maxRowsPerBatch`` gives ``ReadMaxRows``, a budget of sequence numbers
shared fairly between the streams (:func:`malamute_pack.spark.partitions.admit`).
``trigger(availableNow=True)`` reads up to what was durable when the query
started, micro-batch by micro-batch within that limit, then stops.

Offset methods run in a long-lived planner process, ``read()`` in executor
workers: each call opens its own connection and nothing is kept on
``self`` but options and the availableNow target. Retention that removes
records before the query read them fails the micro-batch with
L{malamute_pack.spark.reading.RecordsLostError} (stream and numbers), or
with ``failOnDataLoss`` false is a warning and the query goes on.

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from malamute_pack.spark.batch import range_partitions, read_streams
from malamute_pack.spark.options import ReadOptions
from malamute_pack.spark.partitions import Span, admit
from malamute_pack.spark.reading import (
    RangePartition,
    RangeSource,
    open_source,
    read_partition,
    resolve,
)

Offset = dict[str, int]


def end_offset(
    start: Mapping[str, int], latest: Mapping[str, int], limit: ReadLimit
) -> dict[str, int]:
    """The end of the next micro-batch from ``start`` toward ``latest`` within ``limit``."""
    if isinstance(limit, ReadMaxRows):
        return admit(start, latest, limit.max_rows)
    return dict(sorted((stream, max(latest[stream], start[stream])) for stream in latest))


class MalamuteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read (see the module)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        # Set by prepareForTriggerAvailableNow: no offset goes past it.
        self._final: Offset | None = None

    def _initial(self, source: RangeSource, streams: Sequence[str]) -> Offset:
        start = self.options.start
        return {stream: max(resolve(source, stream, start), 1) - 1 for stream in streams}

    def _durable(self, source: RangeSource, streams: Sequence[str]) -> Offset:
        return {stream: source.status(stream).last for stream in streams}

    def initialOffset(self) -> Offset:
        with open_source(self.options.target) as source:
            return dict(sorted(self._initial(source, read_streams(source, self.options)).items()))

    def prepareForTriggerAvailableNow(self) -> None:
        with open_source(self.options.target) as source:
            self._final = self._durable(source, read_streams(source, self.options))

    def getDefaultReadLimit(self) -> ReadLimit:
        rows = self.options.max_rows_per_batch
        return ReadAllAvailable() if rows is None else ReadMaxRows(rows)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        with open_source(self.options.target) as source:
            streams = read_streams(source, self.options)
            missing = [stream for stream in streams if stream not in start]
            begin = {stream: start[stream] for stream in streams if stream in start}
            begin.update(self._initial(source, missing))
            latest = self._final if self._final is not None else self._durable(source, streams)
        # A stream new to this query's offsets first joins them where it
        # starts: this micro-batch reads none of it, the next goes on from there.
        latest = {
            stream: begin[stream] if stream in missing else latest.get(stream, begin[stream])
            for stream in streams
        }
        return end_offset(begin, latest, limit)

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        options = self.options
        spans = [Span(stream, start.get(stream, last) + 1, last) for stream, last in end.items()]
        return range_partitions(options, spans)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition)
        return read_partition(partition)

    def commit(self, end: Offset) -> None:
        """Nothing to do: the broker keeps no state for a query; its checkpoint holds the offset."""
