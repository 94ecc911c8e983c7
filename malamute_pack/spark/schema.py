"""
The rows the ``malamute`` source reads, as Spark sees them (a DDL string)
and as its ``read()`` yields them (Arrow record batches, made from the
bulk client's chunks by :mod:`malamute_pack.spark.chunk_arrow`).

The Arrow schema must match Spark's exactly: ``string`` (not
``large_string``), ``timestamp('us', tz='UTC')``, a map of strings and a
list of binaries (the frames of each record).

Tests: ``tests/system/test_spark_units.py``.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA_DDL: Final = (
    "stream string, seq bigint, timestamp timestamp, sender string, subject string, "
    "fields map<string,string>, frames array<binary>"
)

# SCHEMA_DDL as a StructType, made without a JVM (executors and planners have none).
SPARK_SCHEMA: Final = StructType(
    [
        StructField("stream", StringType()),
        StructField("seq", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("sender", StringType()),
        StructField("subject", StringType()),
        StructField("fields", MapType(StringType(), StringType())),
        StructField("frames", ArrayType(BinaryType())),
    ]
)

FIELDS_TYPE: Final = pa.map_(pa.string(), pa.string())
FRAMES_TYPE: Final = pa.list_(pa.binary())
ARROW_SCHEMA: Final = pa.schema(
    [
        ("stream", pa.string()),
        ("seq", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("sender", pa.string()),
        ("subject", pa.string()),
        ("fields", FIELDS_TYPE),
        ("frames", FRAMES_TYPE),
    ]
)
