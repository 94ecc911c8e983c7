"""
The ``malamute`` PySpark data source (a Python Data Source, PySpark 4):
read broker streams as DataFrames, batch or streaming, and publish
DataFrames into a stream.

    from malamute_pack.spark import register
    register(spark)        # or rely on the pyspark_malamute module being importable
    trades = (spark.read.format("malamute")
              .option("endpoint", "tcp://broker:9999")
              .option("stream", "trades").load())

Every read has the columns ``stream string, seq bigint, timestamp timestamp
(UTC), sender string, subject string, fields map<string,string>, frames
array<binary>``, in that order; ``fields`` is the map a field-style subject
carries (``a=1;b``: ``{a: "1", b: null}``), null for other subjects.
Batch reads are split into partitions by sequence ranges that executors
read from the broker in parallel over its bulk protocol (or from a journal
file); streaming reads have offsets ``{stream: last sequence number read}``
and resume from their checkpoint; writes are idempotent per task
(:mod:`malamute_pack.spark.writer`).

Options (names are case-insensitive; an unknown one, or one that does not
apply to the operation, is an error):

=================  ========================  ============================================
option             default                   meaning
=================  ========================  ============================================
endpoint           ``ipc://@/malamute``      the broker (any ZeroMQ endpoint); reads and
                                             writes
journal            (none)                    read this journal file (``journal.sqlite``
                                             in a broker's data directory) instead of a
                                             broker: offline, read-only; not with endpoint
stream             (required; journal: all)  the stream to read, several comma-separated;
                                             the one stream a write publishes into
pattern            (all records)             read only records whose subject matches
                                             this pattern, any kind the broker knows
                                             (``prefix:``, ``topic:``, ``mqtt:``,
                                             ``nats:``, ``fields:``, ``regex:`` or a bare
                                             regular expression)
start              batch ``earliest``,       where a read starts (included):
                   streaming ``latest``      ``earliest``, ``latest``, a sequence
                                             number, an ISO 8601 time with its zone
                                             (``2024-05-01T09:30:00Z``) or
                                             ``time:EPOCH_MS``; a time is the first
                                             record at or after it
end                ``latest``                batch reads: where the read ends, excluded
                                             (same forms as start); never past what was
                                             durable when the job was planned
partitions         (see rowsPerPartition)    split a read into about this many partitions
                                             of sequence ranges (at most one more per
                                             extra stream)
rowsPerPartition   100000                    or: at most this many sequence numbers per
                                             partition (one of the two)
maxRowsPerBatch    (no limit)                streaming: at most this many sequence
                                             numbers per micro-batch, shared fairly
                                             between streams; honoured by
                                             ``trigger(availableNow=True)`` too
lastValues         ``false``                 batch reads: ``true`` reads the latest record
                                             of each subject (a last-value stream's
                                             snapshot), in sequence order, up to ``end``;
                                             one partition a stream; not with start,
                                             partitions or rowsPerPartition
failOnDataLoss     ``true``                  records retention removed before they were
                                             read fail the query (naming the stream and
                                             the numbers); ``false``: a warning, and
                                             the read goes on
user, password     (none)                    PLAIN credentials for the broker
timeout            30                        seconds without an answer after which the
                                             broker counts as unreachable (the job
                                             fails with BrokerUnreachableError)
subjectColumn      ``subject``               writes: the string column of the subjects
                                             (no such column: empty subjects)
framesColumn       ``frames``                writes: the array<binary> column of the
                                             frames
valueColumn        ``value``                 writes, instead of framesColumn: one binary
                                             or string (UTF-8) column, one frame
writerId           a uuid per batch job      writes: the id in the idempotency keys;
                   (streaming: the query     give the same one to run a failed batch
                   id)                       write again without duplicates
=================  ========================  ============================================

A broker that is down, or that stops answering in the middle of a read or
a write, fails the Spark job with the client's BrokerUnreachableError
message: a read never returns partial data silently. Writes are append-only
(mode ``append``; ``overwrite`` and complete output mode are refused).

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from malamute_pack.spark.batch import MalamuteReader
from malamute_pack.spark.options import OptionError, parse_read_options, parse_write_options
from malamute_pack.spark.schema import SPARK_SCHEMA
from malamute_pack.spark.streaming import MalamuteStreamReader
from malamute_pack.spark.writer import MalamuteStreamWriter, MalamuteWriter

NAME = "malamute"


def _check_schema(schema: StructType) -> None:
    if schema != SPARK_SCHEMA:
        raise OptionError(
            f"the malamute source reads its own schema ({SPARK_SCHEMA.simpleString()}), "
            f"not {schema.simpleString()}: leave the schema out"
        )


class MalamuteDataSource(DataSource):
    """The ``malamute`` data source (see the module)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_schema(schema)
        return MalamuteReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_schema(schema)
        return MalamuteStreamReader(parse_read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return MalamuteWriter(parse_write_options(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MalamuteStreamWriter(parse_write_options(self.options), schema, overwrite)
