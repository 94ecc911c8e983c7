"""
The zgossip codec (CZMQ's gossip protocol, which Zyre uses where there is
no broadcast): one ZeroMQ frame to a message object and back.

Stateless, in the manner of ``twisted.names.dns``. A frame is
``AA A0 | id u8 | version u8 (1) | body``; only PUBLISH has a body: the key
as a string (u8 length), the value as a longstr (u32 BE length) and a ttl
(u32 BE, always 0 and never read by CZMQ). Lengths count UTF-8 bytes.

Tests: ``tests/unit/test_protocol_zgossip.py``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias

SIGNATURE: Final = b"\xaa\xa0"
VERSION: Final = 1
MAX_KEY_BYTES: Final = 255  # a string's length is one byte
_MAX_U32: Final = 0xFFFFFFFF
_HEADER: Final = 4  # signature, id, version
_U32 = struct.Struct(">I")


class MalformedGossip(ValueError):
    """
    Raised for a frame that is not a well-formed zgossip message (a wrong
    signature, an unknown id, a wrong version, a truncated body, trailing
    bytes, a string that is not UTF-8), and for a message that cannot be
    encoded (a key longer than 255 bytes, a field out of range).
    """


@dataclass(frozen=True, slots=True)
class Hello:
    """A client opens (or reopens) its session with a server."""

    ID: ClassVar[int] = 1


@dataclass(frozen=True, slots=True)
class Publish:
    """One tuple, key to value, in either direction."""

    ID: ClassVar[int] = 2
    key: str
    value: str
    ttl: int = 0


@dataclass(frozen=True, slots=True)
class Ping:
    """A client says it is alive."""

    ID: ClassVar[int] = 3


@dataclass(frozen=True, slots=True)
class Pong:
    """A server answers a PING."""

    ID: ClassVar[int] = 4


@dataclass(frozen=True, slots=True)
class Invalid:
    """A server does not know the client (no HELLO, or forgotten)."""

    ID: ClassVar[int] = 5


GossipMessage: TypeAlias = Hello | Publish | Ping | Pong | Invalid

MESSAGE_NAMES: Final = {1: "HELLO", 2: "PUBLISH", 3: "PING", 4: "PONG", 5: "INVALID"}

# The messages without a body, by id: each has one encoding and one instance.
_BARE: Final[dict[int, Hello | Ping | Pong | Invalid]] = {
    m.ID: m for m in (Hello(), Ping(), Pong(), Invalid())
}
_BARE_FRAMES: Final = {i: SIGNATURE + bytes((i, VERSION)) for i in _BARE}
_PUBLISH_HEADER: Final = SIGNATURE + bytes((Publish.ID, VERSION))


def _utf8(text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MalformedGossip(f"cannot encode {field}: not encodable as UTF-8 ({e.reason})") from e


def encode(message: GossipMessage) -> bytes:
    """
    The one frame that carries C{message}.

    @raise MalformedGossip: the key is longer than 255 UTF-8 bytes, the
        value longer than a u32 can say, the ttl is not a u32, or a string
        is not encodable as UTF-8.
    """
    if not isinstance(message, Publish):
        return _BARE_FRAMES[message.ID]
    key = _utf8(message.key, "key")
    if len(key) > MAX_KEY_BYTES:
        raise MalformedGossip(f"cannot encode key: {len(key)} bytes, at most {MAX_KEY_BYTES}")
    value = _utf8(message.value, "value")
    if len(value) > _MAX_U32:
        raise MalformedGossip(f"cannot encode value: {len(value)} bytes is too long")
    if not 0 <= message.ttl <= _MAX_U32:
        raise MalformedGossip(f"cannot encode ttl {message.ttl}: not a u32")
    return b"".join(
        (
            _PUBLISH_HEADER,
            bytes((len(key),)),
            key,
            _U32.pack(len(value)),
            value,
            _U32.pack(message.ttl),
        )
    )


def _text(raw: bytes, field: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedGossip(f"PUBLISH {field} is not valid UTF-8 ({raw[:32].hex(' ')})") from e


def _decode_publish(frame: bytes) -> Publish:
    at = _HEADER
    end = len(frame)
    if at + 1 > end:
        raise MalformedGossip("PUBLISH truncated: no key length")
    key_end = at + 1 + frame[at]
    if key_end > end:
        raise MalformedGossip(f"PUBLISH truncated: key of {frame[at]} bytes runs past the end")
    key = _text(frame[at + 1 : key_end], "key")
    at = key_end
    if at + 4 > end:
        raise MalformedGossip("PUBLISH truncated: no value length")
    (size,) = _U32.unpack_from(frame, at)
    value_end = at + 4 + size
    if value_end > end:
        raise MalformedGossip(f"PUBLISH truncated: value of {size} bytes runs past the end")
    value = _text(frame[at + 4 : value_end], "value")
    at = value_end
    if at + 4 > end:
        raise MalformedGossip("PUBLISH truncated: no ttl")
    (ttl,) = _U32.unpack_from(frame, at)
    at += 4
    if at != end:
        raise MalformedGossip(f"PUBLISH has {end - at} trailing bytes")
    return Publish(key, value, ttl)


def decode(frame: bytes) -> GossipMessage:
    """
    The message C{frame} carries.

    @raise MalformedGossip: with the reason, for anything that is not
        exactly one well-formed zgossip message.
    """
    if len(frame) < _HEADER:
        raise MalformedGossip(f"frame of {len(frame)} bytes is too short for a header")
    if frame[:2] != SIGNATURE:
        raise MalformedGossip(f"bad signature {frame[:2].hex(' ')}, expected aa a0")
    ident = frame[2]
    if ident not in MESSAGE_NAMES:
        raise MalformedGossip(f"unknown message id {ident}")
    if frame[3] != VERSION:
        raise MalformedGossip(f"{MESSAGE_NAMES[ident]} has version {frame[3]}, expected {VERSION}")
    if ident == Publish.ID:
        return _decode_publish(frame)
    if len(frame) != _HEADER:
        raise MalformedGossip(f"{MESSAGE_NAMES[ident]} has {len(frame) - _HEADER} trailing bytes")
    return _BARE[ident]
