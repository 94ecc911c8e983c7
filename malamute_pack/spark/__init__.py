"""
The PySpark data source ``malamute``: broker streams (or a journal file) as
DataFrames, batch and streaming, and DataFrames published into a stream.
:mod:`malamute_pack.spark.source` documents it and its options.

    from malamute_pack.spark import register
    register(spark)
    df = spark.read.format("malamute").option("stream", "trades").load()

Its modules:

- C{source}: L{MalamuteDataSource}, the data source and its documentation.
- C{options}: the source's options, checked on the driver.
- C{batch}: batch reads: spans planned on the driver, partitions read.
- C{streaming}: streaming reads: offsets and micro-batches.
- C{partitions}: splitting sequence ranges into partitions, and admission.
- C{reading}: reading one partition into Arrow record batches.
- C{last_values}: C{lastValues} reads: the latest record of each subject.
- C{schema}: the rows as Spark sees them and as Arrow batches.
- C{fields}: the C{fields} column of field-style subjects.
- C{journal_file}: a journal file read directly, offline.
- C{writer}: DataFrames written into a stream through the bulk client.

It is no feature of the broker (it runs in Spark's processes and declares
no C{FEATURE}).

Tests: ``tests/system/test_spark.py``, ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

from pyspark.sql import SparkSession

from malamute_pack.spark.fields import subject_fields
from malamute_pack.spark.options import OptionError
from malamute_pack.spark.reading import RecordsLostError, RecordsLostWarning
from malamute_pack.spark.schema import ARROW_SCHEMA, SCHEMA_DDL, SPARK_SCHEMA
from malamute_pack.spark.source import NAME, MalamuteDataSource

__all__ = [
    "ARROW_SCHEMA",
    "NAME",
    "SCHEMA_DDL",
    "SPARK_SCHEMA",
    "MalamuteDataSource",
    "OptionError",
    "RecordsLostError",
    "RecordsLostWarning",
    "register",
    "subject_fields",
]


def register(spark: SparkSession) -> None:
    """Make format ``malamute`` known to ``spark`` (per session)."""
    spark.dataSource.register(MalamuteDataSource)
