"""
What the journal stores: stream records and queued (mailbox and service)
records (the types the broker model defines in L{malamute_pack.broker.store}),
as rows, and the one encoding of a message's content frames as a BLOB.

A BLOB is the frames one after another, each preceded by its length as a
4-byte big-endian unsigned integer; no frames is the empty BLOB.

Tests: ``tests/test_journal_records.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, TypeAlias

# Re-exported: the journal speaks of them as its own records.
from malamute_pack.broker.store import QueuedRecord as QueuedRecord
from malamute_pack.broker.store import StreamRecord as StreamRecord

QUEUED_KINDS: Final = frozenset({"mailbox", "service"})

_LENGTH: Final = struct.Struct(">I")
_MAX_FRAME: Final = 0xFFFFFFFF


# A stream message as the writer inserts it, built once in the reactor thread
# so the writer thread does no per-message Python work beyond binding it:
# (stream, seq, timestamp, sender, subject, content BLOB, BLOB size, origin,
# origin_seq), in the order of the writer's INSERT columns.
StreamRow: TypeAlias = tuple[str, int, float, str, str, bytes, int, str, int]


def stream_row(
    stream: str,
    seq: int,
    timestamp: float,
    sender: str,
    subject: str,
    content: Sequence[bytes],
    origin: str = "",
    origin_seq: int = 0,
) -> StreamRow:
    """The row for a stream message (C{origin} "" and C{origin_seq} 0 for a local write)."""
    blob = encode_frames(content)
    return (stream, seq, timestamp, sender, subject, blob, len(blob), origin, origin_seq)


def row_record(row: StreamRow) -> StreamRecord:
    """The L{StreamRecord} a L{StreamRow} stands for."""
    return StreamRecord(
        row[0], row[1], row[2], row[3], row[4], decode_frames(row[5]), row[7], row[8]
    )


def encode_frames(frames: Sequence[bytes]) -> bytes:
    """The BLOB for ``frames``: each frame length-prefixed, concatenated."""
    if len(frames) == 1 and len(frames[0]) <= _MAX_FRAME:
        return _LENGTH.pack(len(frames[0])) + frames[0]
    parts: list[bytes] = []
    pack = _LENGTH.pack
    for frame in frames:
        size = len(frame)
        if size > _MAX_FRAME:
            raise ValueError(f"frame of {size} bytes is larger than a journal frame can be")
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
