"""
The rows the ``malamute`` source reads, as Spark sees them (a DDL string)
and as its ``read()`` yields them (Arrow record batches made from the bulk
client's column chunks).

The Arrow schema must match Spark's exactly: ``string`` (not
``large_string``), ``timestamp('us', tz='UTC')``, a map of strings and a
list of binaries. Frames arrive as the journal's BLOB (each frame preceded
by its 4-byte length) and are decoded here, one list per record.

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

from malamute_pack.client.bulk import RangeChunk
from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.spark.fields import subject_fields

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


def chunk_batch(chunk: RangeChunk) -> pa.RecordBatch:
    """The rows of ``chunk`` as a record batch of L{ARROW_SCHEMA}."""
    count = len(chunk.seq)
    # Subjects repeat (a few per stream): parse each distinct one once.
    parsed: dict[str, list[tuple[str, str | None]] | None] = {}
    fields: list[list[tuple[str, str | None]] | None] = []
    for subject in chunk.subject:
        if subject not in parsed:
            found = subject_fields(subject)
            parsed[subject] = None if found is None else list(found.items())
        fields.append(parsed[subject])
    offsets = [0]
    flat: list[bytes] = []
    for blob in chunk.content:
        flat.extend(decode_frames(blob))
        offsets.append(len(flat))
    frames = pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(flat, pa.binary()), type=FRAMES_TYPE
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array([chunk.stream] * count, pa.string()),
            pa.array(chunk.seq, pa.int64()),
            pa.array(chunk.timestamp_us, pa.timestamp("us", tz="UTC")),
            pa.array(chunk.sender, pa.string()),
            pa.array(chunk.subject, pa.string()),
            pa.array(fields, FIELDS_TYPE),
            frames,
        ],
        schema=ARROW_SCHEMA,
    )
