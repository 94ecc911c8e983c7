"""
Messages as the C{malamute} command shows and stores them: a stream record
(L{Record}) as one line of text or as a JSON object, a mailbox letter or
service request likewise, and a record read back from JSON for an import.

A body is shown as text when it is valid UTF-8 and printable, else as hex
(C{hex:00ff...}); several frames are joined with C{" | "}. In JSON, exactly
one of C{body} (one frame of UTF-8 text), C{body_hex} (one frame of any
bytes) or C{frames_hex} (a list, for no frame or several) holds the
content, so that a record read back has the very bytes it had.

Tests: ``tests/unit/test_cli_records.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from malamute_pack.client.bulk import RangeChunk
from malamute_pack.client.events import Delivery
from malamute_pack.protocol.chunks import decode_frames

_SEPARATOR = " | "


@dataclass(frozen=True, slots=True)
class Record:
    """
    One stream message: its stream, sequence number and time (seconds
    since the epoch; None where the broker gave none: a version 1 broker),
    sender, subject and frames.
    """

    stream: str
    seq: int | None
    timestamp: float | None
    sender: str
    subject: str
    frames: tuple[bytes, ...]

    @classmethod
    def from_delivery(cls, delivery: Delivery) -> Record:
        return cls(
            delivery.address,
            delivery.sequence,
            delivery.timestamp,
            delivery.sender,
            delivery.subject,
            delivery.content,
        )


def records_from_chunk(chunk: RangeChunk) -> list[Record]:
    """The records of a range read's chunk."""
    return [
        Record(chunk.stream, seq, micros / 1e6, sender, subject, decode_frames(blob))
        for seq, micros, sender, subject, blob in zip(
            chunk.seq, chunk.timestamp_us, chunk.sender, chunk.subject, chunk.content, strict=True
        )
    ]


def frame_text(frame: bytes) -> str | None:
    """C{frame} as text if it is UTF-8 and printable, else None."""
    try:
        text = frame.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() else None


def body_text(frames: Sequence[bytes]) -> str:
    """The frames as one line: each as text if it can be, else C{hex:...}."""
    shown = []
    for frame in frames:
        text = frame_text(frame)
        shown.append(text if text is not None else "hex:" + frame.hex())
    return _SEPARATOR.join(shown)


def format_time(timestamp: float | None) -> str:
    """C{timestamp} (seconds since the epoch) in ISO 8601, UTC, to the millisecond; "-" if None."""
    if timestamp is None:
        return "-"
    when = datetime.fromtimestamp(timestamp, UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def record_line(record: Record) -> str:
    """One line: sequence number, time, sender ("-" if anonymous), subject, body."""
    seq = "-" if record.seq is None else str(record.seq)
    return " ".join(
        (
            seq,
            format_time(record.timestamp),
            record.sender or "-",
            record.subject,
            body_text(record.frames),
        )
    )


def body_json(frames: Sequence[bytes]) -> dict[str, Any]:
    """The frames as the one JSON field that holds them exactly (see the module)."""
    if len(frames) == 1:
        try:
            return {"body": frames[0].decode("utf-8")}
        except UnicodeDecodeError:
            return {"body_hex": frames[0].hex()}
    return {"frames_hex": [frame.hex() for frame in frames]}


def record_json(record: Record) -> dict[str, Any]:
    """C{record} as a JSON object (the shape C{export} writes and C{import} reads)."""
    return {
        "stream": record.stream,
        "seq": record.seq,
        "timestamp": None if record.timestamp is None else format_time(record.timestamp),
        "sender": record.sender,
        "subject": record.subject,
        **body_json(record.frames),
    }


def letter_line(delivery: Delivery) -> str:
    """A mailbox letter or service request as a line: sender, subject, body."""
    return " ".join((delivery.sender or "-", delivery.subject, body_text(delivery.content)))


def letter_json(delivery: Delivery) -> dict[str, Any]:
    """A mailbox letter or service request as a JSON object."""
    return {
        "address": delivery.address,
        "sender": delivery.sender,
        "subject": delivery.subject,
        "tracker": delivery.tracker,
        "id": delivery.id,
        **body_json(delivery.content),
    }


def frames_from_json(item: Mapping[str, Any]) -> tuple[bytes, ...]:
    """
    The frames a JSON object holds (C{body}, C{body_hex} or C{frames_hex}).

    @raise ValueError: if it holds none of them, or not as text or hex.
    """
    if isinstance(item.get("body"), str):
        return (item["body"].encode("utf-8"),)
    if isinstance(item.get("body_hex"), str):
        return (bytes.fromhex(item["body_hex"]),)
    frames = item.get("frames_hex")
    if isinstance(frames, list) and all(isinstance(frame, str) for frame in frames):
        return tuple(bytes.fromhex(frame) for frame in frames)
    raise ValueError('no body: expected "body", "body_hex" or "frames_hex"')


def subject_from_json(item: Mapping[str, Any]) -> str:
    """
    The subject of a JSON object.

    @raise ValueError: if it has none, or not a string.
    """
    subject = item.get("subject")
    if not isinstance(subject, str):
        raise ValueError('no "subject" string')
    return subject
