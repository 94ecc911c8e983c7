"""
Reading one partition of the ``malamute`` source (batch or streaming):
a stream's sequence range, from the broker over the bulk client or from a
journal file, turned into Arrow record batches.

Everything a read needs travels in its L{RangePartition} (a picklable
dataclass): the executor opens its own connection (or file) and closes it
when the read ends. Records retention removed before they were read
(L{RangeGap}) fail the read with L{RecordsLostError}, naming the stream and
the numbers lost, or with ``failOnDataLoss`` false are reported as a
L{RecordsLostWarning} (Python ``warnings``, which the executor's log shows)
and the read goes on. A broker that stops answering fails the read with
its L{BrokerUnreachableError}: never a silent short read. Records damaged
in a journal file (a L{DamagedRange}) are reported the same way, saying
so.

Tests: ``tests/system/test_spark_units.py``, ``tests/system/test_spark.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from malamute_pack.client.bulk import (
    BulkClient,
    ChunkDecoder,
    DataLossError,
    RangeGap,
    StreamStatus,
)
from malamute_pack.client.options import ClientOptions
from malamute_pack.spark.chunk_arrow import chunk_record_batch
from malamute_pack.spark.journal_file import DamagedRange, JournalFile
from malamute_pack.spark.options import Position, Target

C = TypeVar("C")


class RangeSource(Protocol):
    """What reads need of the bulk client, and what a journal file offers too."""

    def __enter__(self) -> RangeSource: ...

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> object: ...

    def status(self, stream: str, whence: int = ..., position: int = ...) -> StreamStatus: ...

    def read_chunks(
        self, stream: str, first: int, last: int, decode: ChunkDecoder[C], pattern: str = ...
    ) -> Iterator[C | RangeGap]: ...

    def close(self) -> None: ...


def open_source(target: Target) -> RangeSource:
    """A bulk client connected to the target's broker, or its journal file opened."""
    if target.journal is not None:
        return JournalFile(target.journal)
    plain = None if target.user is None else (target.user, target.password or "")
    return BulkClient(target.endpoint, options=ClientOptions(plain=plain), timeout=target.timeout)


def resolve(source: RangeSource, stream: str, position: Position) -> int:
    """The sequence number ``position`` stands for in ``stream`` (the first it includes)."""
    return source.status(stream, position.whence, position.value).position


class RecordsLostError(DataLossError):
    """
    L{DataLossError} with the option that reads on past such gaps named;
    with C{why}, the records are damaged in a journal file (not removed by
    retention), and it says so.
    """

    def __init__(self, stream: str, missed: int, available: int, why: str | None = None) -> None:
        super().__init__(stream, missed, available)
        text = self.args[0] if why is None else damaged_text(stream, missed, available, why)
        self.args = (f"{text}; option failOnDataLoss=false reads on past such gaps",)


def damaged_text(stream: str, missed: int, available: int, why: str) -> str:
    """What a reader is told of records C{missed} to C{available - 1} damaged (C{why})."""
    return (
        f"stream {stream!r}: records {missed} to {available - 1} are damaged in the journal"
        f" and cannot be read ({why})"
    )


class RecordsLostWarning(UserWarning):
    """As L{RecordsLostError}, with ``failOnDataLoss`` false: the read went on."""


def report_gap(gap: RangeGap, fail_on_data_loss: bool) -> None:
    """Raise L{RecordsLostError} for ``gap``, or warn and go on."""
    why = gap.why if isinstance(gap, DamagedRange) else None
    if fail_on_data_loss:
        raise RecordsLostError(gap.stream, gap.missed, gap.available, why)
    if why is None:
        lost = str(DataLossError(gap.stream, gap.missed, gap.available))
    else:
        lost = damaged_text(gap.stream, gap.missed, gap.available, why)
    warnings.warn(f"{lost}; reading on (failOnDataLoss=false)", RecordsLostWarning, stacklevel=2)


@dataclass(frozen=True, slots=True)
class RangePartition(InputPartition):
    """One partition: ``first``..``last`` (inclusive) of ``stream`` matching ``pattern``."""

    target: Target
    stream: str
    first: int
    last: int
    pattern: str = ""
    fail_on_data_loss: bool = True


def read_partition(partition: RangePartition) -> Iterator[pa.RecordBatch]:
    """The partition's records as record batches, gaps reported (see the module)."""
    if partition.first > partition.last:
        return
    with open_source(partition.target) as source:
        for item in source.read_chunks(
            partition.stream,
            partition.first,
            partition.last,
            chunk_record_batch,
            partition.pattern,
        ):
            if isinstance(item, RangeGap):
                report_gap(item, partition.fail_on_data_loss)
            elif item.num_rows:
                yield item
