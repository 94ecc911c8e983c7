"""
The packed record formats of protocol version 2's bulk messages
(``docs/protocol.md`` "Bulk reads and idempotent appends"), and the one
encoding of a message's frames as a single byte string that they and the
journal share.

Stateless, like L{malamute_pack.protocol.mlm}: STREAM_CHUNK carries many
stream records, and STREAM_APPEND many records to write, each in one
content frame, so that moving a million records costs a few hundred ZeroMQ
messages rather than a million:

- frames: each frame preceded by its length as a 4-byte big-endian
  unsigned integer, concatenated (no frames: the empty string);
- a chunk record: sequence (8 bytes), timestamp in microseconds since the
  epoch (8 bytes), sender and subject (a length byte and UTF-8 each), and
  its frames, encoded as above, preceded by their total length (4 bytes);
- an append record: subject (a length byte and UTF-8) and its frames,
  preceded by their total length (4 bytes).

Numbers are big-endian, as everywhere in MLM.

Tests: ``tests/unit/test_protocol_chunks.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import mul
from typing import Final, NamedTuple

from malamute_pack.protocol.mlm import MalformedMessage

_LENGTH: Final = struct.Struct(">I")
_CHUNK_HEAD: Final = struct.Struct(">QQB")
_SEQ_TIME: Final = struct.Struct(">QQ")
_MAX_FRAME: Final = 0xFFFFFFFF


def encode_frames(frames: Sequence[bytes]) -> bytes:
    """``frames`` as one byte string: each frame length-prefixed, concatenated."""
    if len(frames) == 1 and len(frames[0]) <= _MAX_FRAME:
        return _LENGTH.pack(len(frames[0])) + frames[0]
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for frame in frames:
        size = len(frame)
        if size > _MAX_FRAME:
            raise ValueError(f"frame of {size} bytes is larger than a length can say")
        parts.append(pack(size))
        parts.append(frame)
    return b"".join(parts)


def decode_frames(blob: bytes) -> tuple[bytes, ...]:
    """The frames :func:`encode_frames` made ``blob`` from; ValueError if malformed."""
    frames: list[bytes] = []
    offset = 0
    end = len(blob)
    unpack = _LENGTH.unpack_from
    while offset < end:
        if end - offset < 4:
            raise ValueError(f"truncated frame length at byte {offset} of {end}")
        (size,) = unpack(blob, offset)
        offset += 4
        if size > end - offset:
            raise ValueError(f"frame of {size} bytes at byte {offset} overruns the {end}-byte blob")
        frames.append(blob[offset : offset + size])
        offset += size
    return tuple(frames)


class ChunkRow(NamedTuple):
    """
    One stream record as a chunk carries it: C{frames} is the record's
    frames encoded by L{encode_frames}, as the journal stores them, so a
    broker passes them on without decoding them.
    """

    seq: int
    timestamp: float  # epoch seconds
    sender: str
    subject: str
    frames: bytes


class ChunkColumns(NamedTuple):
    """A decoded chunk, column by column (what a columnar reader wants)."""

    seq: list[int]
    timestamp_us: list[int]
    sender: list[str]
    subject: list[str]
    frames: list[bytes]  # each encoded by encode_frames


def _text(value: str) -> bytes:
    data = value.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        raise MalformedMessage(f"string of {len(data)} bytes is longer than 255")
    return data


def encode_chunk(rows: Iterable[ChunkRow]) -> bytes:
    """
    The content frame of a STREAM_CHUNK holding C{rows}.

    Column by column, with builtins mapped over the columns: a range read
    packs thousands of rows a chunk, and no Python statement runs per row.
    The sender and subject of a row are packed once per distinct pair (a
    stream has few writers and subjects).
    """
    table = list(rows)
    if not table:
        return b""
    seqs, stamps, senders, subjects, blobs = zip(*table, strict=True)
    pairs = list(zip(senders, subjects, strict=True))
    names = {pair: _names(table, *pair) for pair in set(pairs)}
    micros = map(round, map(mul, stamps, repeat(1_000_000)))
    heads = map(_SEQ_TIME.pack, seqs, micros)
    sizes = map(_LENGTH.pack, map(len, blobs))
    records = zip(heads, map(names.__getitem__, pairs), sizes, blobs, strict=True)
    return b"".join(chain.from_iterable(records))


def _names(rows: list[ChunkRow], sender: str, subject: str) -> bytes:
    """A chunk record's sender and subject, each a length byte and UTF-8."""
    who = sender.encode("utf-8", "surrogateescape")
    what = subject.encode("utf-8", "surrogateescape")
    if len(who) > 255 or len(what) > 255:
        for row in rows:  # raise for the first too long, as packing row by row would
            _text(row.sender)
            _text(row.subject)
    return bytes((len(who),)) + who + bytes((len(what),)) + what


def _string_at(data: bytes, offset: int, end: int) -> tuple[str, int]:
    if offset >= end:
        raise MalformedMessage(f"record truncated at byte {offset}")
    size = data[offset]
    offset += 1
    if offset + size > end:
        raise MalformedMessage(f"string of {size} bytes at byte {offset} overruns the chunk")
    return data[offset : offset + size].decode("utf-8", "surrogateescape"), offset + size


def _frames_at(data: bytes, offset: int, end: int) -> tuple[bytes, int]:
    if offset + 4 > end:
        raise MalformedMessage(f"record truncated at byte {offset}")
    (size,) = _LENGTH.unpack_from(data, offset)
    offset += 4
    if offset + size > end:
        raise MalformedMessage(f"frames of {size} bytes at byte {offset} overrun the chunk")
    return data[offset : offset + size], offset + size


def decode_chunk(data: bytes, count: int) -> ChunkColumns:
    """The C{count} records of a STREAM_CHUNK's content frame; MalformedMessage if malformed."""
    columns = ChunkColumns([], [], [], [], [])
    seqs, times, senders, subjects, blobs = columns
    head = _CHUNK_HEAD.unpack_from
    length = _LENGTH.unpack_from
    offset = 0
    end = len(data)
    try:
        for _ in range(count):
            seq, micros, size = head(data, offset)
            offset += 17
            sender = data[offset : offset + size]
            offset += size
            size = data[offset]
            offset += 1
            subject = data[offset : offset + size]
            offset += size
            (size,) = length(data, offset)
            offset += 4
            blob = data[offset : offset + size]
            offset += size
            if offset > end:
                raise MalformedMessage(f"record overruns the {end}-byte chunk")
            seqs.append(seq)
            times.append(micros)
            senders.append(sender.decode("utf-8", "surrogateescape"))
            subjects.append(subject.decode("utf-8", "surrogateescape"))
            blobs.append(blob)
    except (struct.error, IndexError) as e:
        raise MalformedMessage(f"chunk truncated at byte {offset} of {end}") from e
    if offset != end:
        raise MalformedMessage(f"{end - offset} bytes after the chunk's {count} records")
    return columns


def encode_append(records: Iterable[tuple[str, Sequence[bytes]]]) -> bytes:
    """The content frame of a STREAM_APPEND writing C{records} (subject, frames)."""
    parts: list[bytes] = []
    length = _LENGTH.pack
    for subject, frames in records:
        what = _text(subject)
        blob = encode_frames(frames)
        parts.append(bytes((len(what),)))
        parts.append(what)
        parts.append(length(len(blob)))
        parts.append(blob)
    return b"".join(parts)


def decode_append(data: bytes) -> list[tuple[str, tuple[bytes, ...]]]:
    """The records of a STREAM_APPEND's content frame; MalformedMessage if it is not that."""
    records: list[tuple[str, tuple[bytes, ...]]] = []
    offset = 0
    end = len(data)
    while offset < end:
        subject, offset = _string_at(data, offset, end)
        blob, offset = _frames_at(data, offset, end)
        try:
            frames = decode_frames(blob)
        except ValueError as e:
            raise MalformedMessage(f"record {len(records) + 1}: {e}") from e
        records.append((subject, frames))
    return records
