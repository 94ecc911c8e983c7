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
The messages are declared by layout (the sequence their first field) and
compiled by L{malamute_pack.protocol.zproto}; the beacon, a fixed struct,
has its own few lines.

Tests: ``tests/unit/test_protocol_zre.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias

from malamute_pack.protocol import zproto
from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"\xaa\xa1"
VERSION: Final = 2
MAX_STRING_BYTES: Final = 255  # a string's length is one byte
MAX_SEQUENCE: Final = 0xFFFF
_HEADER: Final = 6  # signature, id, version, sequence
_U16 = struct.Struct(">H")

BEACON_PREFIX: Final = b"ZRE"
BEACON_VERSION: Final = 1
BEACON_CURVE_VERSION: Final = 3
BEACON_SIZE: Final = 22
BEACON_CURVE_SIZE: Final = 54
UUID_SIZE: Final = 16
PUBLIC_KEY_SIZE: Final = 32


class MalformedBeacon(Malformed):
    """
    A datagram that is not exactly a ZRE beacon (v1, 22 bytes, or CURVE,
    54 bytes), or a beacon that cannot be encoded.
    """


class MalformedZre(Malformed):
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

_Layout: TypeAlias = tuple[tuple[str, zproto.Kind | str], ...]
_SEQUENCE: Final = ("sequence", zproto.NUMBER2)


@dataclass(frozen=True, slots=True)
class Hello:
    """Greet a peer so it can connect back: who we are and where we are."""

    ID: ClassVar[int] = 1
    LAYOUT: ClassVar[_Layout] = (
        ("sequence", zproto.NUMBER2),
        ("endpoint", zproto.STRING),
        ("groups", zproto.STRINGS),
        ("status", zproto.NUMBER1),
        ("name", zproto.STRING),
        ("headers", zproto.HASH),
    )
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
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE,)
    sequence: int
    content: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Shout:
    """A message to every peer in a group."""

    ID: ClassVar[int] = 3
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE, ("group", zproto.STRING))
    sequence: int
    group: str
    content: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Join:
    """The sender joined C{group}; C{status} is its join/leave count after it."""

    ID: ClassVar[int] = 4
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE, ("group", zproto.STRING), ("status", zproto.NUMBER1))
    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Leave:
    """The sender left C{group}; C{status} is its join/leave count after it."""

    ID: ClassVar[int] = 5
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE, ("group", zproto.STRING), ("status", zproto.NUMBER1))
    sequence: int
    group: str
    status: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Are you there? (sent to a peer gone silent)"""

    ID: ClassVar[int] = 6
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE,)
    sequence: int


@dataclass(frozen=True, slots=True)
class PingOk:
    """The answer to a PING."""

    ID: ClassVar[int] = 7
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE,)
    sequence: int


@dataclass(frozen=True, slots=True)
class Goodbye:
    """The sender is stopping (zyre sends it in gossip mode)."""

    ID: ClassVar[int] = 10
    LAYOUT: ClassVar[_Layout] = (_SEQUENCE,)
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
_TYPES: Final[dict[int, type[ZreMessage]]] = {
    cls.ID: cls for cls in (Hello, Whisper, Shout, Join, Leave, Ping, PingOk, Goodbye)
}


_CODEC: Final[zproto.Codec[ZreMessage]] = zproto.Codec(
    [
        zproto.Spec(cls.ID, MESSAGE_NAMES[cls.ID], cls, cls.LAYOUT, content)
        for cls, content in (
            (Hello, None),
            (Whisper, ("content", zproto.Content(tuple))),
            (Shout, ("content", zproto.Content(tuple))),
            (Join, None),
            (Leave, None),
            (Ping, None),
            (PingOk, None),
            (Goodbye, None),
        )
    ],
    signature=SIGNATURE,
    version=VERSION,
    header_size=_HEADER,
    error=MalformedZre,
    text=zproto.STRICT,
)


def header(message_id: int, sequence: int) -> bytes:
    """
    The first six bytes of a message's first frame.

    @raise MalformedZre: the sequence is not a u16.
    """
    return _CODEC.header_start(_TYPES[message_id], sequence)


# encode(message): the frames that carry message: the header and body,
# then the content frames of a WHISPER or SHOUT. Raises MalformedZre for a
# string too long or not encodable as UTF-8, or a number out of range.
encode: Final[Callable[[ZreMessage], list[bytes]]] = _CODEC.encode


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


# decode(frames): the message frames carry (without the routing id a ROUTER
# adds). Raises MalformedZre, with the reason, for anything that is not
# exactly one well-formed ZRE message.
decode: Final[Callable[[Sequence[bytes]], ZreMessage]] = _CODEC.decode
