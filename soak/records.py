"""
What the soak's clients write and the checker reads back: every stream
record, letter and request carries in its body its own id and a checksum
of its content, so that a record served with other bytes than were written
(a damaged journal served as good) is told from a good one, and a record
found anywhere says which operation wrote it.

A body is ASCII: ``ID CHECKSUM PAYLOAD``, the checksum the CRC-32 (eight
hex digits) of ``ID|SUBJECT|PAYLOAD``, so a damaged subject is caught too.
The payload is made from the id (so a damaged one is not mistaken for
another record's), padded to a fixed length.

A record of an append has the id ``PROCESS.N.J``: record J of the Nth key
(append) of the appender PROCESS; its subject is one of that appender's
own subjects (``PROCESS.sK``), so each subject has one writer and its
records' order is the order of (N, J).

Tests: ``tests/unit/test_soak_checker.py``.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Final

# The payload's length: bodies are the same size whatever their id.
PAYLOAD_BYTES: Final = 64


def payload(rid: str) -> str:
    """The payload written with record C{rid} (hex made from the id, C{PAYLOAD_BYTES} long)."""
    digest = hashlib.blake2b(rid.encode(), digest_size=32).hexdigest()
    return (digest * (PAYLOAD_BYTES // len(digest) + 1))[:PAYLOAD_BYTES]


def checksum(rid: str, subject: str, text: str) -> str:
    """The CRC-32 of a record's id, subject and payload, as eight hex digits."""
    return f"{zlib.crc32(f'{rid}|{subject}|{text}'.encode()):08x}"


def body(rid: str, subject: str) -> bytes:
    """The body of record C{rid} with C{subject}."""
    text = payload(rid)
    return f"{rid} {checksum(rid, subject, text)} {text}".encode()


@dataclass(frozen=True, slots=True)
class Decoded:
    """
    A body read back: the id it names (None if it cannot be read at all)
    and whether it is exactly what was written for that id and subject.
    """

    rid: str | None
    good: bool


def decode(data: bytes, subject: str) -> Decoded:
    """What C{data}, served with C{subject}, says: its id and whether it is undamaged."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return Decoded(None, False)
    parts = text.split(" ")
    if len(parts) != 3:
        return Decoded(None, False)
    rid, crc, rest = parts
    good = crc == checksum(rid, subject, rest) and rest == payload(rid)
    return Decoded(rid or None, good)


def text_of(data: bytes) -> str:
    """Bytes as a JSON-safe string, one character per byte (L{bytes_of} undoes it)."""
    return data.decode("latin-1")


def bytes_of(text: str) -> bytes:
    """The bytes L{text_of} made C{text} from."""
    return text.encode("latin-1")


def append_rid(process: str, n: int, j: int) -> str:
    """The id of record C{j} of the C{n}th append of C{process}."""
    return f"{process}.{n}.{j}"


def write_order(rid: str) -> tuple[int, int] | None:
    """(N, J) of an append record's id, the order its writer wrote it in; None if not one."""
    parts = rid.rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1]), int(parts[2])
