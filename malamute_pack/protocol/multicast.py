"""
The multicast bridge's codec: stream records packed into ZeroMQ messages
on a PUB socket (PGM, NORM, or any ZeroMQ transport), to bytes and back,
with no state (as ``twisted/names/dns.py`` is for DNS).

A message is one frame: a I{pack} of one or more records of one bridge,
each with its own header and its content frames as they were written::

    "MB" version(1)  origin  endpoint  stream  pattern
    then, for each record:
        seq(8) prev(8) timestamp(8) frames(2)  sender  subject
        then, for each content frame: length(4) and that many bytes

Integers are big-endian and unsigned; the timestamp is in microseconds
since the epoch; a string is a length byte and that many bytes of UTF-8.
The first part (origin to pattern, the I{source}) is the same for every
record a bridge publishes, so it is said once per pack.

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
signature C{"MH"}, the version and the source, then C{last(8)
timestamp(8)}, C{last} being the last number it published. A receiver
whose last record from that stream is older has lost the tail of a burst,
which no later record would reveal.

Version 1 (before packs) sent each record as its own message: a header
frame (C{"MB" 1 seq prev timestamp}, the source, sender, subject) and the
content frames. A message of another version raises L{OtherVersion}: a
receiver counts it and drops it.

Frames start with C{PREFIX}, so a SUB subscribes to it.
Anything that does not decode raises L{MalformedBridgeMessage}.

Tests: ``tests/unit/test_protocol_multicast.py``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Final, NamedTuple

from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"MB"
BEAT_SIGNATURE: Final = b"MH"
PREFIX: Final = b"M"  # what both start with
VERSION: Final = 2
_START = struct.Struct(">2sB")
_START_SIZE = _START.size
_RECORD = struct.Struct(">QQQH")  # seq, prev, timestamp, content frames
_RECORD_SIZE = _RECORD.size
_LENGTH = struct.Struct(">I")
_BEAT = struct.Struct(">QQ")  # last, timestamp
# Every string is at most this long (one length byte).
MAX_STRING: Final = 255
# The most content frames a record in a pack can have (two bytes).
MAX_FRAMES: Final = 0xFFFF


class MalformedBridgeMessage(Malformed):
    """Bytes from a multicast group that are not a message of this codec."""


class OtherVersion(MalformedBridgeMessage):
    """A bridge message of another version of this codec (an older or newer broker's)."""


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


class Record(NamedTuple):
    """One record of a pack: its own header's fields and its content."""

    seq: int
    prev: int
    timestamp: int  # microseconds since the epoch
    sender: str
    subject: str
    content: list[bytes]


# A Record from a tuple of its fields, without the generated __new__'s
# Python call (a pack's records are made in a receiver's hottest loop).
_new_record: Callable[[tuple[int, int, int, str, str, list[bytes]]], Record] = functools.partial(
    tuple.__new__, Record
)


class Pack(NamedTuple):
    """
    One message: a bridge's source and its records, or a beat.

    @ivar records: in the order published (none for a beat).
    @ivar beat: for a beat, the last number the bridge published; else 0.
    @ivar timestamp: a beat's time, microseconds since the epoch (0 for records).
    """

    origin: str
    stream: str
    endpoint: str
    pattern: str
    records: list[Record]
    beat: int = 0
    timestamp: int = 0

    def headers(self) -> list[tuple[Header, list[bytes]]]:
        """Its records as (header, content), or a beat's header and no content."""
        if self.beat:
            header = Header(
                self.origin,
                self.stream,
                self.beat,
                0,
                self.timestamp,
                self.endpoint,
                self.pattern,
                "",
                "",
                True,
            )
            return [(header, [])]
        return [
            (
                Header(
                    self.origin,
                    self.stream,
                    r.seq,
                    r.prev,
                    r.timestamp,
                    self.endpoint,
                    self.pattern,
                    r.sender,
                    r.subject,
                ),
                r.content,
            )
            for r in self.records
        ]


def _string(value: str) -> bytes:
    data = value.encode()
    if len(data) > MAX_STRING:
        raise ValueError(f"{value[:40]!r}... is longer than {MAX_STRING} bytes")
    return bytes((len(data),)) + data


def encode_source(origin: str, endpoint: str, stream: str, pattern: str) -> bytes:
    """
    The part of a pack that one bridge repeats on every pack of one
    stream (encoded once, passed to L{encode_pack} and L{encode_beat}).

    @raise ValueError: a string longer than L{MAX_STRING} bytes.
    """
    return _string(origin) + _string(endpoint) + _string(stream) + _string(pattern)


def encode_record(
    seq: int, prev: int, timestamp: int, sender: str, subject: str, content: Sequence[bytes]
) -> bytes:
    """
    One record of a pack, its header and its content.

    @raise ValueError: C{sender} or C{subject} longer than L{MAX_STRING}
        bytes, or more than L{MAX_FRAMES} content frames.
    """
    if len(content) > MAX_FRAMES:
        raise ValueError(f"{len(content)} content frames: a pack's record has at most {MAX_FRAMES}")
    parts = [_RECORD.pack(seq, prev, timestamp, len(content)), _string(sender), _string(subject)]
    for frame in content:
        parts.append(_LENGTH.pack(len(frame)))
        parts.append(frame)
    return b"".join(parts)


def pack_start(source: bytes) -> bytes:
    """What every pack of a bridge starts with, before its records (L{encode_source}'s part)."""
    return _START.pack(SIGNATURE, VERSION) + source


def encode_pack(source: bytes, records: Sequence[bytes]) -> list[bytes]:
    """A message's frames: a pack of records encoded by L{encode_record} (at least one)."""
    return [b"".join((pack_start(source), *records))]


def encode_beat(source: bytes, last: int, timestamp: int) -> bytes:
    """A beat's only frame: C{last} is the last number the bridge published."""
    return _START.pack(BEAT_SIGNATURE, VERSION) + source + _BEAT.pack(last, timestamp)


def encode(header: Header, content: Sequence[bytes]) -> list[bytes]:
    """The frames of a message of one record (its header, then its content), or of a beat."""
    source = encode_source(header.origin, header.endpoint, header.stream, header.pattern)
    if header.beat:
        return [encode_beat(source, header.seq, header.timestamp)]
    record = encode_record(
        header.seq, header.prev, header.timestamp, header.sender, header.subject, content
    )
    return encode_pack(source, [record])


def _strings(data: bytes, count: int) -> tuple[str, ...]:
    """C{count} strings that make up C{data} exactly."""
    at = 0
    strings: list[str] = []
    for _ in range(count):
        if at >= len(data):
            raise MalformedBridgeMessage("the source ends inside its strings")
        end = at + 1 + data[at]
        if end > len(data):
            raise MalformedBridgeMessage("the source ends inside its strings")
        try:
            strings.append(data[at + 1 : end].decode())
        except UnicodeDecodeError as e:
            raise MalformedBridgeMessage(f"a source string is not UTF-8: {e}") from None
        at = end
    if at != len(data):
        raise MalformedBridgeMessage(f"{len(data) - at} bytes after the source")
    return tuple(strings)


# One bridge repeats its source part on every pack: decoded once. A pure
# function of its bytes, so the cache holds no state of the codec.
@functools.lru_cache(maxsize=256)
def _source(data: bytes) -> tuple[str, ...]:
    strings = _strings(data, 4)  # origin, endpoint, stream, pattern
    if not strings[0] or not strings[2]:
        raise MalformedBridgeMessage("a pack without its origin or stream")
    return strings


def _records(frame: bytes, at: int) -> list[Record]:
    """The records of a pack's C{frame}, from C{at} (after its source) to its end."""
    size = len(frame)
    if at >= size:
        raise MalformedBridgeMessage("a pack of no records")
    unpack_record = _RECORD.unpack_from
    unpack_length = _LENGTH.unpack_from
    records: list[Record] = []
    append = records.append
    try:
        while at < size:
            seq, prev, timestamp, count = unpack_record(frame, at)
            if seq == 0 or prev >= seq:
                raise MalformedBridgeMessage(f"sequence number {seq} after {prev}")
            at += _RECORD_SIZE
            end = at + 1 + frame[at]
            sender = frame[at + 1 : end].decode()
            at = end + 1 + frame[end]
            subject = frame[end + 1 : at].decode()
            content = []
            for _ in range(count):
                end = at + 4 + unpack_length(frame, at)[0]
                if end > size:
                    raise MalformedBridgeMessage("a content frame's length goes past the pack")
                content.append(frame[at + 4 : end])
                at = end
            if at > size:  # only the strings can overrun unchecked
                raise MalformedBridgeMessage("the pack ends inside a record's header")
            append(_new_record((seq, prev, timestamp, sender, subject, content)))
    except (IndexError, struct.error):
        raise MalformedBridgeMessage("the pack ends inside a record's header") from None
    except UnicodeDecodeError as e:
        raise MalformedBridgeMessage(f"a sender or subject is not UTF-8: {e}") from None
    return records


def decode_pack(frames: Sequence[bytes]) -> Pack:
    """
    A whole message.

    @raise OtherVersion: a bridge message of another version.
    @raise MalformedBridgeMessage: anything else that is not a pack or a beat.
    """
    if not frames:
        raise MalformedBridgeMessage("an empty message")
    frame = frames[0]
    size = len(frame)
    if size < _START_SIZE:
        raise MalformedBridgeMessage(f"a message of {size} bytes is too short")
    signature, version = _START.unpack_from(frame)
    beat = signature == BEAT_SIGNATURE
    if signature != SIGNATURE and not beat:
        raise MalformedBridgeMessage(f"signature {signature!r} is not {SIGNATURE!r}")
    if version != VERSION:
        raise OtherVersion(
            f"bridge protocol version {version}: this broker speaks version {VERSION}"
        )
    if len(frames) > 1:
        raise MalformedBridgeMessage(f"a message of {len(frames)} frames: a pack is one")
    # The source part ends after four strings.
    end = _START_SIZE
    for _ in range(4):
        if end >= size:
            raise MalformedBridgeMessage("the source ends inside its strings")
        end += 1 + frame[end]
    if end > size:
        raise MalformedBridgeMessage("the source ends inside its strings")
    origin, endpoint, stream, pattern = _source(frame[_START_SIZE:end])
    if beat:
        if size - end != _BEAT.size:
            raise MalformedBridgeMessage("a beat is its source and two numbers")
        last, timestamp = _BEAT.unpack_from(frame, end)
        if not last:
            raise MalformedBridgeMessage("a beat names no record published")
        return Pack(origin, stream, endpoint, pattern, [], last, timestamp)
    return Pack(origin, stream, endpoint, pattern, _records(frame, end))


def decode(frames: Sequence[bytes]) -> tuple[Header, list[bytes]]:
    """A message of one record: its header and its content frames (none for a beat)."""
    headers = decode_pack(frames).headers()
    if len(headers) != 1:
        raise MalformedBridgeMessage(f"a pack of {len(headers)} records, not one")
    return headers[0]
