"""
Batch reads of the ``malamute`` source with ``lastValues``: the latest
record of each subject of a stream (a last-value stream's snapshot, see
docs/protocol.md), as one partition per stream.

The partition reads the stream's retained records up to its planned end
(from the broker over the bulk protocol, or from a journal file), keeps
the one with the highest sequence number of each subject (Arrow's
group-by, chunk by chunk, so that memory holds about one record per
subject), and yields them in sequence order. The read is the same from a
broker and from a file: the latest record retained of each subject among
the records up to ``end``. On a last-value stream that is its snapshot as
of ``end`` (the journal never prunes a subject's latest record); on
another stream, the latest of what retention kept. Records pruned while
they are read (a gap) are not reported: on a last-value stream they were
not latest.

Tests: ``tests/system/test_spark_units.py``, ``tests/system/test_spark.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from malamute_pack.client.bulk import RangeGap
from malamute_pack.spark.chunk_arrow import chunk_record_batch
from malamute_pack.spark.options import Target
from malamute_pack.spark.reading import open_source
from malamute_pack.spark.schema import ARROW_SCHEMA

# Records held before what is held is reduced again (at least twice the subjects).
_REDUCE_AT: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class LastValuesPartition(InputPartition):
    """The latest record of each subject of ``stream`` matching ``pattern``, ``first``..``last``."""

    target: Target
    stream: str
    first: int
    last: int
    pattern: str = ""


def _latest(table: pa.Table) -> pa.Table:
    """The rows of C{table} that hold their subject's highest sequence number."""
    newest = table.group_by("subject").aggregate([("seq", "max")])
    return table.filter(pc.is_in(table["seq"], value_set=newest["seq_max"]))


def latest_per_subject(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """The latest record of each subject among C{batches} (of one stream), in sequence order."""
    held: list[pa.Table] = []
    rows = 0
    reduce_at = _REDUCE_AT
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(_latest(pa.Table.from_batches([batch])))
        rows += held[-1].num_rows
        if rows > reduce_at and len(held) > 1:
            held = [_latest(pa.concat_tables(held))]
            rows = held[0].num_rows
            reduce_at = max(_REDUCE_AT, 2 * rows)
    if not held:
        return ARROW_SCHEMA.empty_table()
    return _latest(pa.concat_tables(held)).sort_by("seq")


def read_last_values(partition: LastValuesPartition) -> Iterator[pa.RecordBatch]:
    """The partition's latest records as record batches (see the module)."""
    if partition.first > partition.last:
        return
    with open_source(partition.target) as source:
        chunks = source.read_chunks(
            partition.stream,
            partition.first,
            partition.last,
            chunk_record_batch,
            partition.pattern,
        )
        table = latest_per_subject(item for item in chunks if not isinstance(item, RangeGap))
    yield from table.to_batches()
