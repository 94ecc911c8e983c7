"""
The ZRE codec (RFC 36, the protocol Zyre nodes speak): UDP beacons and the
messages on peer links, bytes to message objects and back, with no state.

A beacon is one datagram: ``ZRE 01 | uuid (16) | port u16 BE`` (22 bytes),
or with CURVE (RFC 43) ``ZRE 03 | uuid | port | public key (32)`` (54).

A message is a multipart ZeroMQ message. Its first frame is
``AA A1 | id u8 | version u8 (2) | sequence u16 BE | body``; WHISPER and
SHOUT carry their content as the frames after it. A string is a u8 length
and bytes, a longstr a u32 BE length and bytes; lengths count UTF-8 bytes.
The ids 8 and 9 (ELECT, LEADER: zyre's draft election API) are not spoken.

Tests: ``tests/unit/test_protocol_zre.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias

SIGNATURE: Final = b"\xaa\xa1"
VERSION: Final = 2
MAX_STRING_BYTES: Final = 255  # a string's length is one byte
MAX_SEQUENCE: Final = 0xFFFF
_MAX_U32: Final = 0xFFFFFFFF
_HEADER: Final = 6  # signature, id, version, sequence
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

BEACON_PREFIX: Final = b"ZRE"
BEACON_VERSION: Final = 1
BEACON_CURVE_VERSION: Final = 3
BEACON_SIZE: Final = 22
BEACON_CURVE_SIZE: Final = 54
UUID_SIZE: Final = 16
PUBLIC_KEY_SIZE: Final = 32


class MalformedBeacon(ValueError):
    """
    A datagram that is not exactly a ZRE beacon (v1, 22 bytes, or CURVE,
    54 bytes), or a beacon that cannot be encoded.
    """


class MalformedZre(ValueError):
    """
    Raised for frames that are not one well-formed ZRE message (a wrong
    signature, an unknown id, a wrong version, a truncated body, trailing
    bytes, a string that is not UTF-8, a count that runs past the end), and
    for a message that cannot be encoded (a string longer than 255 bytes,
    a number out of range).
    """


# Beacons


@dataclass(frozen=True, slots=True)
class Beacon:
    """
    A node's presence on the LAN: its uuid and its inbox's TCP port (0:
    it is leaving), with its CURVE public key if it has one.
    """

    uuid: bytes
    port: int
    public_key: bytes | None = None


_BEACON = struct.Struct(">3sB16sH")


def encode_beacon(beacon: Beacon) -> bytes:
    """
    The datagram that carries C{beacon}.

    @raise MalformedBeacon: a uuid not of 16 bytes, a port not a u16, or a
        public key not of 32 bytes.
    """
    if len(beacon.uuid) != UUID_SIZE:
        raise MalformedBeacon(f"cannot encode a uuid of {len(beacon.uuid)} bytes, want 16")
    if not 0 <= beacon.port <= MAX_SEQUENCE:
        raise MalformedBeacon(f"cannot encode port {beacon.port}: not a u16")
    if beacon.public_key is None:
        return _BEACON.pack(BEACON_PREFIX, BEACON_VERSION, beacon.uuid, beacon.port)
    if len(beacon.public_key) != PUBLIC_KEY_SIZE:
        raise MalformedBeacon(
            f"cannot encode a public key of {len(beacon.public_key)} bytes, want 32"
        )
    head = _BEACON.pack(BEACON_PREFIX, BEACON_CURVE_VERSION, beacon.uuid, beacon.port)
    return head + beacon.public_key


def decode_beacon(data: bytes) -> Beacon:
    """
    The beacon C{data} carries.

    @raise MalformedBeacon: with the reason, for anything but a 22-byte v1
        beacon or a 54-byte CURVE beacon.
    """
    if data[:3] != BEACON_PREFIX:
        raise MalformedBeacon(f"not a ZRE beacon: starts {data[:3].hex(' ') or 'empty'}")
    if len(data) not in (BEACON_SIZE, BEACON_CURVE_SIZE):
        raise MalformedBeacon(f"beacon of {len(data)} bytes, want 22 or 54")
    _, version, uuid, port = _BEACON.unpack_from(data)
    if len(data) == BEACON_SIZE and version == BEACON_VERSION:
        return Beacon(uuid, port)
    if len(data) == BEACON_CURVE_SIZE and version == BEACON_CURVE_VERSION:
        return Beacon(uuid, port, data[BEACON_SIZE:])
    raise MalformedBeacon(f"beacon of {len(data)} bytes with version {version}")


# Messages


@dataclass(frozen=True, slots=True)
class Hello:
    """Greet a peer so it can connect back: who we are and where we are."""

    ID: ClassVar[int] = 1
    sequence: int
    endpoint: str
    groups: tuple[str, ...]
    status: int
    name: str
    headers: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Whisper:
    """A message to one peer."""

    ID: ClassVar[int] = 2
    sequence: int
    content: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Shout:
    """A message to every peer in a group."""

    ID: ClassVar[int] = 3
    sequence: int
    group: str
    content: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Join:
    """The sender joined C{group}; C{status} is its join/leave count after it."""

    ID: ClassVar[int] = 4
    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Leave:
    """The sender left C{group}; C{status} is its join/leave count after it."""

    ID: ClassVar[int] = 5
    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you there? (sent to a peer gone silent)"""

    ID: ClassVar[int] = 6
    sequence: int


@dataclass(frozen=True, slots=True)
class PingOk:
    """The answer to a PING."""

    ID: ClassVar[int] = 7
    sequence: int


@dataclass(frozen=True, slots=True)
class Goodbye:
    """The sender is stopping (zyre sends it in gossip mode)."""

    ID: ClassVar[int] = 10
    sequence: int


ZreMessage: TypeAlias = Hello | Whisper | Shout | Join | Leave | Ping | PingOk | Goodbye

MESSAGE_NAMES: Final = {
    1: "HELLO",
    2: "WHISPER",
    3: "SHOUT",
    4: "JOIN",
    5: "LEAVE",
    6: "PING",
    7: "PING_OK",
    10: "GOODBYE",
}


# Encoding


def _utf8(text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MalformedZre(f"cannot encode {field}: not encodable as UTF-8 ({e.reason})") from e


def _string(text: str, field: str) -> bytes:
    raw = _utf8(text, field)
    if len(raw) > MAX_STRING_BYTES:
        raise MalformedZre(f"cannot encode {field}: {len(raw)} bytes, at most {MAX_STRING_BYTES}")
    return bytes((len(raw),)) + raw


def _longstr(text: str, field: str) -> bytes:
    raw = _utf8(text, field)
    if len(raw) > _MAX_U32:
        raise MalformedZre(f"cannot encode {field}: {len(raw)} bytes is too long")
    return _U32.pack(len(raw)) + raw


def _status(status: int) -> bytes:
    if not 0 <= status <= 0xFF:
        raise MalformedZre(f"cannot encode status {status}: not a u8")
    return bytes((status,))


def _body(message: ZreMessage) -> bytes:
    if isinstance(message, Hello):
        parts = [_string(message.endpoint, "endpoint"), _U32.pack(len(message.groups))]
        parts += [_longstr(group, "group") for group in message.groups]
        parts += [_status(message.status), _string(message.name, "name")]
        parts.append(_U32.pack(len(message.headers)))
        for key, value in message.headers:
            parts += [_string(key, "header key"), _longstr(value, "header value")]
        return b"".join(parts)
    if isinstance(message, Shout):
        return _string(message.group, "group")
    if isinstance(message, Join | Leave):
        return _string(message.group, "group") + _status(message.status)
    return b""


def header(message_id: int, sequence: int) -> bytes:
    """
    The first six bytes of a message's first frame.

    @raise MalformedZre: the sequence is not a u16.
    """
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise MalformedZre(f"cannot encode sequence {sequence}: not a u16")
    return SIGNATURE + bytes((message_id, VERSION)) + _U16.pack(sequence)


def encode(message: ZreMessage) -> list[bytes]:
    """
    The frames that carry C{message}: the header and body, then the
    content frames of a WHISPER or SHOUT.

    @raise MalformedZre: a string too long or not encodable as UTF-8, or a
        number out of range.
    """
    first = header(message.ID, message.sequence) + _body(message)
    if isinstance(message, Whisper | Shout):
        return [first, *message.content]
    return [first]


def resequence(frames: Sequence[bytes], sequence: int) -> list[bytes]:
    """
    C{frames} (an encoded message) with their sequence number replaced:
    a message going to many peers is encoded once, then numbered per peer.

    @raise MalformedZre: the sequence is not a u16.
    """
    try:
        number = _U16.pack(sequence)
    except struct.error as e:
        raise MalformedZre(f"cannot encode sequence {sequence}: not a u16") from e
    first = frames[0]
    return [first[:4] + number + first[_HEADER:], *frames[1:]]


# Decoding


class _Reader:
    """Reads the fields of one frame's body, raising MalformedZre for a short one."""

    __slots__ = ("at", "end", "frame", "name")

    def __init__(self, frame: bytes, name: str) -> None:
        self.frame = frame
        self.name = name
        self.at = _HEADER
        self.end = len(frame)

    def _take(self, size: int, what: str) -> bytes:
        if self.at + size > self.end:
            raise MalformedZre(f"{self.name} truncated: {what} of {size} bytes runs past the end")
        raw = self.frame[self.at : self.at + size]
        self.at += size
        return raw

    def _text(self, raw: bytes, what: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedZre(
                f"{self.name} {what} is not valid UTF-8 ({raw[:32].hex(' ')})"
            ) from e

    def u8(self, what: str) -> int:
        return self._take(1, what)[0]

    def u32(self, what: str) -> int:
        (value,) = _U32.unpack(self._take(4, what))
        return int(value)

    def string(self, what: str) -> str:
        size = self.u8(f"{what} length")
        return self._text(self._take(size, what), what)

    def longstr(self, what: str) -> str:
        size = self.u32(f"{what} length")
        return self._text(self._take(size, what), what)

    def count(self, what: str, smallest: int) -> int:
        """A u32 count of items each at least C{smallest} bytes long, checked to fit."""
        count = self.u32(f"{what} count")
        if count * smallest > self.end - self.at:
            raise MalformedZre(
                f"{self.name} {what} count {count} overruns the {self.end - self.at} bytes left"
            )
        return count

    def finish(self) -> None:
        if self.at != self.end:
            raise MalformedZre(f"{self.name} has {self.end - self.at} trailing bytes")


def _decode_hello(reader: _Reader, sequence: int) -> Hello:
    endpoint = reader.string("endpoint")
    groups = tuple(reader.longstr("group") for _ in range(reader.count("groups", 4)))
    status = reader.u8("status")
    name = reader.string("name")
    headers = tuple(
        (reader.string("header key"), reader.longstr("header value"))
        for _ in range(reader.count("headers", 5))
    )
    return Hello(sequence, endpoint, groups, status, name, headers)


def decode(frames: Sequence[bytes]) -> ZreMessage:
    """
    The message C{frames} carry (without the routing id a ROUTER adds).

    @raise MalformedZre: with the reason, for anything that is not exactly
        one well-formed ZRE message.
    """
    if not frames:
        raise MalformedZre("no frames")
    frame = frames[0]
    if len(frame) < _HEADER:
        raise MalformedZre(f"first frame of {len(frame)} bytes is too short for a header")
    if frame[:2] != SIGNATURE:
        raise MalformedZre(f"bad signature {frame[:2].hex(' ')}, expected aa a1")
    ident = frame[2]
    name = MESSAGE_NAMES.get(ident)
    if name is None:
        raise MalformedZre(f"unknown message id {ident}")
    if frame[3] != VERSION:
        raise MalformedZre(f"{name} has version {frame[3]}, expected {VERSION}")
    (sequence,) = _U16.unpack_from(frame, 4)
    content = tuple(frames[1:])
    if content and ident not in (Whisper.ID, Shout.ID):
        raise MalformedZre(f"{name} has {len(content)} unexpected content frames")
    reader = _Reader(frame, name)
    message: ZreMessage
    if ident == Hello.ID:
        message = _decode_hello(reader, sequence)
    elif ident == Whisper.ID:
        message = Whisper(sequence, content)
    elif ident == Shout.ID:
        message = Shout(sequence, reader.string("group"), content)
    elif ident == Join.ID:
        message = Join(sequence, reader.string("group"), reader.u8("status"))
    elif ident == Leave.ID:
        message = Leave(sequence, reader.string("group"), reader.u8("status"))
    elif ident == Ping.ID:
        message = Ping(sequence)
    elif ident == PingOk.ID:
        message = PingOk(sequence)
    else:
        message = Goodbye(sequence)
    reader.finish()
    return message
