"""
A STREAM_CHUNK's content frame straight into a record batch of the
source's Arrow schema (:mod:`malamute_pack.spark.schema`), with numpy: no
Python object per record, where the layout allows.

The records of a chunk (:mod:`malamute_pack.protocol.chunks`) are packed
one after the other, each as long as its sender, subject and frames make
it, so where one starts depends on every one before. A chunk whose records
are all as long as its first (one writer, subjects and payloads of one
size: the common stream) has its starts computed at once and checked;
otherwise they are found by a loop that only adds lengths. Everything else
is gathered column by column with numpy: the numbers as big-endian
integers, the strings and frames as Arrow buffers. Records of more than
one frame, and field-style subjects (parsed once per distinct subject),
take a slower path for that column only. The batch is the one the plain
reference in the tests (``tests/spark_reference.py``) makes of the decoded
chunk, value for value; a malformed chunk raises MalformedMessage as
L{malamute_pack.protocol.chunks.decode_chunk} does.

Tests: ``tests/system/test_spark_chunk_arrow.py``.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.protocol.mlm import MalformedMessage
from malamute_pack.spark.fields import subject_fields
from malamute_pack.spark.schema import ARROW_SCHEMA, FIELDS_TYPE, FRAMES_TYPE

Positions = npt.NDArray[np.int64]
Bytes = npt.NDArray[np.uint8]

# Bytes of a record besides its sender, subject and frames: sequence number
# and time (8 each), two string lengths (1 each) and the frames' length (4).
_FIXED: Final = 22
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")


def chunk_record_batch(stream: str, data: bytes, count: int) -> tuple[pa.RecordBatch, int]:
    """
    The C{count} records of a STREAM_CHUNK's content frame C{data} as a
    record batch of the source's schema, and the last record's sequence
    number (0 for none).
    """
    if count == 0:
        if data:
            raise MalformedMessage(f"{len(data)} bytes after the chunk's 0 records")
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA), 0
    buf = np.frombuffer(data, np.uint8)
    starts = _record_starts(buf, data, count)
    seqs = _big_endian(buf, starts, 8)
    stamps = _big_endian(buf, starts + 8, 8)
    if (seqs >= 1 << 63).any() or (stamps >= 1 << 63).any():
        raise MalformedMessage("a sequence number or time does not fit a signed 64-bit integer")
    sender_sizes = buf[starts + 16].astype(np.int64)
    subject_at = starts + 17 + sender_sizes
    subject_sizes = buf[subject_at].astype(np.int64)
    frames_at = subject_at + 1 + subject_sizes
    frames_sizes = _big_endian(buf, frames_at, 4).astype(np.int64)
    subjects = _strings(buf, subject_at + 1, subject_sizes)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.repeat(pa.scalar(stream, pa.string()), count),
            pa.array(seqs.astype(np.int64), pa.int64()),
            pa.array(stamps.astype(np.int64), _TIMESTAMP),
            _strings(buf, starts + 17, sender_sizes),
            subjects,
            _fields(subjects),
            _frames(buf, data, frames_at + 4, frames_sizes),
        ],
        schema=ARROW_SCHEMA,
    )
    return batch, int(seqs[-1])


def _record_starts(buf: Bytes, data: bytes, count: int) -> Positions:
    """Where each record starts; MalformedMessage if they do not fill C{data} exactly."""
    end = len(data)
    first = _record_size(data, 0, end)
    if first * count == end:
        starts = np.arange(count, dtype=np.int64) * first
        if _fills(buf, starts, end):
            return starts
    found = np.empty(count, np.int64)
    offset = 0
    for index in range(count):
        found[index] = offset
        offset += _record_size(data, offset, end)
    if offset != end:
        raise MalformedMessage(f"{end - offset} bytes after the chunk's {count} records")
    return found


def _record_size(data: bytes, offset: int, end: int) -> int:
    """The size of the record at C{offset}; MalformedMessage if it overruns C{end}."""
    sender_len_at = offset + 16
    if sender_len_at >= end:
        raise MalformedMessage(f"record truncated at byte {offset} of {end}")
    subject_len_at = sender_len_at + 1 + data[sender_len_at]
    if subject_len_at >= end:
        raise MalformedMessage(f"record truncated at byte {offset} of {end}")
    frames_len_at = subject_len_at + 1 + data[subject_len_at]
    if frames_len_at + 4 > end:
        raise MalformedMessage(f"record truncated at byte {offset} of {end}")
    record_end = frames_len_at + 4 + int.from_bytes(data[frames_len_at : frames_len_at + 4])
    if record_end > end:
        raise MalformedMessage(f"record overruns the {end}-byte chunk")
    return record_end - offset


def _fills(buf: Bytes, starts: Positions, end: int) -> bool:
    """Whether the records at C{starts} each end where the next starts, the last at C{end}."""
    subject_len_at = starts + 17 + buf[starts + 16]
    if (subject_len_at >= end).any():
        return False
    frames_len_at = subject_len_at + 1 + buf[subject_len_at]
    if (frames_len_at + 4 > end).any():
        return False
    ends = frames_len_at + 4 + _big_endian(buf, frames_len_at, 4).astype(np.int64)
    return bool(ends[-1] == end and (ends[:-1] == starts[1:]).all())


def _big_endian(buf: Bytes, at: Positions, size: int) -> npt.NDArray[np.uint64]:
    """The unsigned big-endian integers of C{size} bytes at each of C{at}."""
    raw = _slices(buf, at, size)
    kind = np.dtype(">u8") if size == 8 else np.dtype(">u4")
    values: npt.NDArray[np.uint64] = raw.view(kind).reshape(len(at)).astype(np.uint64)
    return values


def _slices(buf: Bytes, at: Positions, size: int) -> Bytes:
    """The C{size} bytes at each of C{at}, one row each (every slice within C{buf})."""
    step = int(at[1] - at[0]) if len(at) > 1 else 0
    if step >= size and (np.diff(at) == step).all():
        # Evenly spaced (records of one size): a strided view, copied row by row.
        view = np.lib.stride_tricks.as_strided(
            buf[int(at[0]) :], shape=(len(at), size), strides=(step, 1), writeable=False
        )
        return np.ascontiguousarray(view)
    gathered: Bytes = buf[at[:, None] + np.arange(size)]
    return gathered


def _gather(buf: Bytes, at: Positions, sizes: Positions) -> tuple[Positions, Bytes]:
    """The slices of C{buf} at C{at} of C{sizes}, end to end, with their offsets."""
    offsets = np.zeros(len(at) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return offsets, np.empty(0, np.uint8)
    size = int(sizes[0])
    if (sizes == size).all():
        return offsets, _slices(buf, at, size).reshape(total)
    return offsets, buf[np.repeat(at - offsets[:-1], sizes) + np.arange(total)]


def _strings(buf: Bytes, at: Positions, sizes: Positions) -> pa.Array:
    """A string array of the UTF-8 slices at C{at}; MalformedMessage if one is not UTF-8."""
    offsets, values = _gather(buf, at, sizes)
    array = pa.StringArray.from_buffers(
        len(at), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as e:
        raise MalformedMessage(f"a string of the chunk is not UTF-8: {e}") from e
    return array


def _fields(subjects: pa.Array) -> pa.Array:
    """The fields column: null for all but field-style subjects, each parsed once."""
    styled = pc.or_(pc.match_substring(subjects, "="), pc.match_substring(subjects, ";"))
    if not pc.any(styled).as_py():
        return pa.nulls(len(subjects), FIELDS_TYPE)
    encoded = subjects.dictionary_encode()
    maps = []
    for subject in encoded.dictionary.to_pylist():
        found = subject_fields(subject)
        maps.append(None if found is None else list(found.items()))
    return pa.array(maps, FIELDS_TYPE).take(encoded.indices)


def _frames(buf: Bytes, data: bytes, at: Positions, sizes: Positions) -> pa.Array:
    """The frames column from each record's encoded frames at C{at} of C{sizes}."""
    count = len(at)
    single = sizes >= 4
    heads = _big_endian(buf, np.where(single, at, 0), 4).astype(np.int64)
    single &= heads == sizes - 4
    if not (single | (sizes == 0)).all():
        # Some record has several frames (or a malformed encoding): one by one.
        flat: list[bytes] = []
        offsets = [0]
        for start, size in zip(at.tolist(), sizes.tolist(), strict=True):
            try:
                flat.extend(decode_frames(data[start : start + size]))
            except ValueError as e:
                raise MalformedMessage(f"malformed frames at byte {start}: {e}") from e
            offsets.append(len(flat))
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(flat, pa.binary()), type=FRAMES_TYPE
        )
    list_offsets = np.zeros(count + 1, np.int32)
    np.cumsum(single, out=list_offsets[1:])
    value_offsets, values = _gather(buf, at[single] + 4, sizes[single] - 4)
    frames = pa.BinaryArray.from_buffers(
        pa.binary(),
        int(list_offsets[-1]),
        [None, pa.py_buffer(value_offsets.astype(np.int32)), pa.py_buffer(values)],
    )
    return pa.ListArray.from_arrays(pa.array(list_offsets), frames, type=FRAMES_TYPE)
