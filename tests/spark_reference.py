"""
The reference the Spark source's fast decoder is checked against: a
decoded chunk (L{RangeChunk}) made into a record batch of the source's
Arrow schema the plain way, a record at a time. The source itself uses
L{malamute_pack.spark.chunk_arrow}, which must give the same batch.

Tests: ``tests/system/test_spark_units.py``, ``tests/system/test_spark_chunk_arrow.py``.
"""

from __future__ import annotations

import pyarrow as pa

from malamute_pack.client.bulk import RangeChunk
from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.spark.fields import subject_fields
from malamute_pack.spark.schema import ARROW_SCHEMA, FIELDS_TYPE, FRAMES_TYPE


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
