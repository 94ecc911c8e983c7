"""
What the journal stores: stream records and queued (mailbox and service)
records (the types defined in L{malamute_pack.protocol.records}), as
rows, and the one encoding of a message's content frames as a BLOB.

A BLOB is the frames one after another, each preceded by its length as a
4-byte big-endian unsigned integer; no frames is the empty BLOB (the
encoding of L{malamute_pack.protocol.chunks}, which the protocol's bulk
messages carry as it is).

Tests: ``tests/unit/test_journal_records.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

# The encoding of a message's frames that the protocol's bulk messages share.
from malamute_pack.protocol.chunks import decode_frames, encode_frames

# The records, defined with the codecs that carry them between brokers.
from malamute_pack.protocol.records import StreamRecord, StreamRow

QUEUED_KINDS: Final = frozenset({"mailbox", "service"})


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
