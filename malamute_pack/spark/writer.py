"""
Writes into a broker stream (``df.write`` and ``df.writeStream`` with
format ``malamute``): each row becomes one record, published through
L{malamute_pack.client.bulk.BulkClient.append}.

A row's subject comes from the ``subjectColumn`` (default ``subject``; a
DataFrame without that column publishes empty subjects, a null is empty
too) and its frames from an ``array<binary>`` column (``framesColumn``,
default ``frames``) or from one ``value`` column (``valueColumn``, default
``value``: binary, or string sent as UTF-8), one frame. When neither is
named and the DataFrame has both default columns, ``frames`` is used. A
null array or value is a record with no frames; a null frame is empty.

No duplicates when a task or a micro-batch runs again: each task's rows
go out in appends under the broker's ``max_append_bytes``, and every
append has an idempotency key the broker remembers, the same on every run
of the same rows:

- streaming: ``spark:<query id>:<batch id>:<partition>#<n>``; the query id
  (``sql.streaming.queryId``, kept in the checkpoint, so the same after a
  restart) and the batch id (``streaming.sql.batchId``) are the task's local
  properties, ``writerId`` replaces the query id if given;
- batch: ``spark:<writer id>:<partition>#<n>``, the writer id a fresh
  uuid per write job unless option ``writerId`` names one (give the same
  one to run a failed job again without duplicating what it wrote).

``commit`` and ``abort`` run on a fresh writer on the driver: they keep
nothing and only log what the tasks report.

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

from malamute_pack.client.bulk import BulkClient
from malamute_pack.client.options import ClientOptions
from malamute_pack.spark.options import (
    DEFAULT_FRAMES_COLUMN,
    DEFAULT_SUBJECT_COLUMN,
    DEFAULT_VALUE_COLUMN,
    OptionError,
    WriteOptions,
)

_log = logging.getLogger(__name__)

Record = tuple[str, list[bytes]]

# What an append record costs besides its frames: the subject's length byte
# and the frames' total length (malamute_pack/protocol/chunks.py).
_RECORD_OVERHEAD: Final = 1 + 4
_FRAME_OVERHEAD: Final = 4
MAX_SUBJECT_BYTES: Final = 255
QUERY_ID: Final = "sql.streaming.queryId"
BATCH_ID: Final = "streaming.sql.batchId"


@dataclass(frozen=True, slots=True)
class Columns:
    """Which columns make a record: subject (None: empty), and frames or value."""

    subject: str | None
    frames: str | None
    value: str | None


def choose_columns(options: WriteOptions, schema: StructType) -> Columns:
    """The columns a write uses (see the module); OptionError if missing or of a wrong type."""
    types = {field.name: field.dataType for field in schema.fields}
    have = ", ".join(f"{name} {kind.simpleString()}" for name, kind in types.items())

    def typed(name: str, option: str, allowed: tuple[object, ...], wanted: str) -> str:
        if name not in types:
            raise OptionError(f"option {option}: no column {name!r} (the columns: {have})")
        if types[name] not in allowed:
            raise OptionError(
                f"option {option}: column {name!r} is {types[name].simpleString()}, not {wanted}"
            )
        return name

    subject: str | None = None
    if options.subject_column is not None or DEFAULT_SUBJECT_COLUMN in types:
        name = options.subject_column or DEFAULT_SUBJECT_COLUMN
        subject = typed(name, "subjectColumn", (StringType(),), "string")
    frames_type = ArrayType(BinaryType())
    frames_types = (frames_type, ArrayType(BinaryType(), containsNull=False))
    value_types = (BinaryType(), StringType())
    if options.frames_column is not None:
        return Columns(
            subject,
            typed(options.frames_column, "framesColumn", frames_types, "array<binary>"),
            None,
        )
    if options.value_column is not None:
        value = typed(options.value_column, "valueColumn", value_types, "binary or string")
        return Columns(subject, None, value)
    if DEFAULT_FRAMES_COLUMN in types:
        frames = typed(DEFAULT_FRAMES_COLUMN, "framesColumn", frames_types, "array<binary>")
        return Columns(subject, frames, None)
    if DEFAULT_VALUE_COLUMN in types:
        value = typed(DEFAULT_VALUE_COLUMN, "valueColumn", value_types, "binary or string")
        return Columns(subject, None, value)
    raise OptionError(
        f"no frames column ({DEFAULT_FRAMES_COLUMN} array<binary>) and no value column "
        f"({DEFAULT_VALUE_COLUMN} binary or string): name one with framesColumn or "
        f"valueColumn (the columns: {have})"
    )


def batch_records(batch: pa.RecordBatch, columns: Columns) -> Iterator[Record]:
    """The records (subject, frames) of ``batch``'s rows, in order."""
    count = batch.num_rows
    subjects: list[str | None] = (
        [None] * count if columns.subject is None else batch.column(columns.subject).to_pylist()
    )
    if columns.frames is not None:
        frames_lists: list[list[bytes | None] | None] = batch.column(columns.frames).to_pylist()
        for subject, frames in zip(subjects, frames_lists, strict=True):
            yield subject or "", [frame or b"" for frame in frames or ()]
    else:
        assert columns.value is not None
        values: list[bytes | str | None] = batch.column(columns.value).to_pylist()
        for subject, value in zip(subjects, values, strict=True):
            if value is None:
                yield subject or "", []
            else:
                yield subject or "", [value.encode() if isinstance(value, str) else value]


def record_size(record: Record) -> int:
    """The bytes ``record`` takes in an append (``encode_append``)."""
    subject, frames = record
    size = len(subject.encode("utf-8", "surrogateescape"))
    if size > MAX_SUBJECT_BYTES:
        raise ValueError(f"a subject of {size} bytes is longer than {MAX_SUBJECT_BYTES}")
    return _RECORD_OVERHEAD + size + sum(_FRAME_OVERHEAD + len(frame) for frame in frames)


def group_appends(records: Iterable[Record], limit: int) -> Iterator[list[Record]]:
    """``records`` in order, in groups of at most ``limit`` bytes each (L{record_size})."""
    group: list[Record] = []
    size = 0
    for record in records:
        cost = record_size(record)
        if cost > limit:
            raise ValueError(
                f"a record of {cost} bytes is bigger than the broker takes in one append ({limit})"
            )
        if group and size + cost > limit:
            yield group
            group, size = [], 0
        group.append(record)
        size += cost
    if group:
        yield group


@dataclass
class AppendReport(WriterCommitMessage):
    """What one task wrote: records, appends (keys) sent, those the broker already had."""

    key: str
    records: int = 0
    appends: int = 0
    duplicates: int = 0


def write_records(options: WriteOptions, key: str, records: Iterable[Record]) -> AppendReport:
    """Append ``records`` under keys ``key#0``, ``key#1``...; connects only if there are any."""
    report = AppendReport(key)
    iterator = iter(records)
    first = next(iterator, None)
    if first is None:
        return report
    target = options.target
    plain = None if target.user is None else (target.user, target.password or "")
    with BulkClient(
        target.endpoint, options=ClientOptions(plain=plain), timeout=target.timeout
    ) as client:

        def every() -> Iterator[Record]:
            yield first
            yield from iterator

        for n, group in enumerate(group_appends(every(), client.max_append_bytes)):
            appended = client.append(options.stream, f"{key}#{n}", group)
            report.records += len(group)
            report.appends += 1
            report.duplicates += appended.duplicate
    return report


def _records(batches: Iterable[pa.RecordBatch], columns: Columns) -> Iterator[Record]:
    for batch in batches:
        yield from batch_records(batch, columns)


def _task() -> TaskContext:
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("a malamute writer writes inside a Spark task only")
    return context


def _log_reports(messages: Sequence[WriterCommitMessage | None], what: str) -> None:
    reports = [m for m in messages if isinstance(m, AppendReport)]
    _log.info(
        "%s: %d records in %d appends (%d already written) from %d tasks",
        what,
        sum(r.records for r in reports),
        sum(r.appends for r in reports),
        sum(r.duplicates for r in reports),
        len(reports),
    )


def _refuse_overwrite(overwrite: bool) -> None:
    if overwrite:
        raise OptionError(
            "a malamute stream is append-only: write with mode append "
            "(outputMode append for a streaming query)"
        )


class MalamuteWriter(DataSourceArrowWriter):
    """A batch write (``df.write``): one writer id per job, keys per partition."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = options
        self.columns = choose_columns(options, schema)
        # Made once on the driver, pickled to every task of this job.
        self.writer_id = options.writer_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendReport:
        key = f"spark:{self.writer_id}:{_task().partitionId()}"
        return write_records(self.options, key, _records(iterator, self.columns))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_reports(messages, f"write {self.writer_id} into {self.options.stream!r} done")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_reports(
            messages,
            f"write {self.writer_id} into {self.options.stream!r} failed (what was appended "
            "stays; run it again with option writerId set to this id to finish it without "
            "duplicates)",
        )


class MalamuteStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write (``writeStream``): keys per query, micro-batch and partition."""

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        _refuse_overwrite(overwrite)
        self.options = options
        self.columns = choose_columns(options, schema)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> AppendReport:
        task = _task()
        query = self.options.writer_id or task.getLocalProperty(QUERY_ID)
        batch = task.getLocalProperty(BATCH_ID)
        if not query or batch is None:
            raise RuntimeError(
                "a malamute stream writer needs the streaming query's id and batch id "
                f"(local properties {QUERY_ID}, {BATCH_ID})"
            )
        key = f"spark:{query}:{batch}:{task.partitionId()}"
        return write_records(self.options, key, _records(iterator, self.columns))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_reports(messages, f"micro-batch {batchId} into {self.options.stream!r} done")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_reports(
            messages,
            f"micro-batch {batchId} into {self.options.stream!r} failed (it runs again with "
            "the same keys: what was appended is not duplicated)",
        )
