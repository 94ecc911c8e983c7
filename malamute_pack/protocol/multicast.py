"""
The multicast bridge's codec: one stream record as a ZeroMQ message on a
PUB socket (PGM, NORM, or any ZeroMQ transport), to bytes and back, with no
state (as ``twisted/names/dns.py`` is for DNS).

A message is a header frame and then the record's content frames, as they
were written. The header::

    "MB" version(1)  seq(8) prev(8) timestamp(8)
    origin  endpoint  stream  pattern  sender  subject

Integers are big-endian and unsigned; the timestamp is in microseconds
since the epoch; a string is a length byte and that many bytes of UTF-8.

- C{origin}, C{stream}, C{seq}: the record's place in the origin broker's
  journal (the broker whose stream it is, or the TCP source a proxy
  reads): a receiver takes each (origin, stream, seq) once.
- C{prev}: the C{seq} of the record the same bridge published before
  this one on this stream (0: none, or unknown). With a pattern the
  published numbers have holes that are no loss; a receiver sees a loss
  when C{prev} is not the last number it took.
- C{endpoint}: where the origin serves replays (MLM over ZeroMQ, "" for
  nowhere), and C{pattern} what the bridge reads: a receiver repairs a loss
  by reading C{stream} with C{pattern} there.

A bridge that has published nothing for a while sends a I{beat}: the
same header with the signature C{"MH"}, C{seq} the last number it
published, C{prev} 0, empty sender and subject, and no content. A receiver
whose last record from that stream is older has lost the tail of a burst,
which no later record would reveal.

Frames start with C{PREFIX}, so a SUB subscribes to it.
Anything that does not decode raises L{MalformedBridgeMessage}.

Tests: ``tests/unit/test_protocol_multicast.py``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"MB"
BEAT_SIGNATURE: Final = b"MH"
PREFIX: Final = b"M"  # what both start with
VERSION: Final = 1
_FIXED = struct.Struct(">2sBQQQ")
_FIXED_SIZE = _FIXED.size
# Every string is at most this long (one length byte).
MAX_STRING: Final = 255


class MalformedBridgeMessage(Malformed):
    """Bytes from a multicast group that are not a message of this codec."""


class Header(NamedTuple):
    """What a receiver learns of one record before its content."""

    origin: str
    stream: str
    seq: int
    prev: int
    timestamp: int  # microseconds since the epoch
    endpoint: str
    pattern: str
    sender: str
    subject: str
    beat: bool = False  # a beat: seq is the last number published; no record


def _string(value: str) -> bytes:
    data = value.encode()
    if len(data) > MAX_STRING:
        raise ValueError(f"{value[:40]!r}... is longer than {MAX_STRING} bytes")
    return bytes((len(data),)) + data


def encode_source(origin: str, endpoint: str, stream: str, pattern: str) -> bytes:
    """
    The part of a header that one bridge repeats on every record of one
    stream (encoded once, passed to L{encode_header}).

    @raise ValueError: a string longer than L{MAX_STRING} bytes.
    """
    return _string(origin) + _string(endpoint) + _string(stream) + _string(pattern)


def encode_header(
    source: bytes, seq: int, prev: int, timestamp: int, sender: str, subject: str
) -> bytes:
    """
    A header frame, from L{encode_source}'s part and the record's fields.

    @raise ValueError: C{sender} or C{subject} longer than L{MAX_STRING} bytes.
    """
    return (
        _FIXED.pack(SIGNATURE, VERSION, seq, prev, timestamp)
        + source
        + _string(sender)
        + _string(subject)
    )


def encode_beat(source: bytes, last: int, timestamp: int) -> bytes:
    """A beat's only frame: C{last} is the last number the bridge published."""
    return _FIXED.pack(BEAT_SIGNATURE, VERSION, last, 0, timestamp) + source + b"\0\0"


def encode(header: Header, content: Sequence[bytes]) -> list[bytes]:
    """The frames of one record (its header, then its content), or of a beat."""
    source = encode_source(header.origin, header.endpoint, header.stream, header.pattern)
    if header.beat:
        return [encode_beat(source, header.seq, header.timestamp)]
    frame = encode_header(
        source, header.seq, header.prev, header.timestamp, header.sender, header.subject
    )
    return [frame, *content]


def _strings(data: bytes, count: int) -> tuple[str, ...]:
    """C{count} strings that make up C{data} exactly."""
    at = 0
    strings: list[str] = []
    for _ in range(count):
        if at >= len(data):
            raise MalformedBridgeMessage("the header ends inside its strings")
        end = at + 1 + data[at]
        if end > len(data):
            raise MalformedBridgeMessage("the header ends inside its strings")
        try:
            strings.append(data[at + 1 : end].decode())
        except UnicodeDecodeError as e:
            raise MalformedBridgeMessage(f"a header string is not UTF-8: {e}") from None
        at = end
    if at != len(data):
        raise MalformedBridgeMessage(f"{len(data) - at} bytes after the header")
    return tuple(strings)


# One bridge repeats its source part on every record: decoded once. A pure
# function of its bytes, so the cache holds no state of the codec.
@functools.lru_cache(maxsize=256)
def _source(data: bytes) -> tuple[str, ...]:
    strings = _strings(data, 4)  # origin, endpoint, stream, pattern
    if not strings[0] or not strings[2]:
        raise MalformedBridgeMessage("a header without its origin or stream")
    return strings


def decode_header(frame: bytes) -> Header:
    """The header of a record (the first frame of its message)."""
    size = len(frame)
    if size < _FIXED_SIZE:
        raise MalformedBridgeMessage(f"a header of {size} bytes is too short")
    signature, version, seq, prev, timestamp = _FIXED.unpack_from(frame)
    beat = signature == BEAT_SIGNATURE
    if signature != SIGNATURE and not beat:
        raise MalformedBridgeMessage(f"signature {signature!r} is not {SIGNATURE!r}")
    if version != VERSION:
        raise MalformedBridgeMessage(
            f"bridge protocol version {version}: this broker speaks version {VERSION}"
        )
    if seq == 0 or prev >= seq:
        raise MalformedBridgeMessage(f"sequence number {seq} after {prev}")
    # The source part ends after four strings.
    end = _FIXED_SIZE
    for _ in range(4):
        if end >= size:
            raise MalformedBridgeMessage("the header ends inside its strings")
        end += 1 + frame[end]
    origin, endpoint, stream, pattern = _source(frame[_FIXED_SIZE:end])
    sender, subject = _strings(frame[end:], 2)
    if beat and (prev or sender or subject):
        raise MalformedBridgeMessage("a beat names no record")
    return Header(origin, stream, seq, prev, timestamp, endpoint, pattern, sender, subject, beat)


def decode(frames: Sequence[bytes]) -> tuple[Header, list[bytes]]:
    """A whole message: its header and its content frames (none for a beat)."""
    if not frames:
        raise MalformedBridgeMessage("an empty message")
    header = decode_header(frames[0])
    if header.beat and len(frames) > 1:
        raise MalformedBridgeMessage("a beat with content")
    return header, list(frames[1:])
