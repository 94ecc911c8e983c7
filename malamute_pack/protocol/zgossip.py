"""
The zgossip codec (CZMQ's gossip protocol, which Zyre uses where there is
no broadcast): one ZeroMQ frame to a message object and back.

Stateless, in the manner of ``twisted.names.dns``. A frame is
``AA A0 | id u8 | version u8 (1) | body``; only PUBLISH has a body: the key
as a string (u8 length), the value as a longstr (u32 BE length) and a ttl
(u32 BE, always 0 and never read by CZMQ). Lengths count UTF-8 bytes. The
messages are declared by layout and compiled by L{malamute_pack.protocol.zproto}.

Tests: ``tests/unit/test_protocol_zgossip.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias

from malamute_pack.protocol import zproto
from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"\xaa\xa0"
VERSION: Final = 1
MAX_KEY_BYTES: Final = 255  # a string's length is one byte


class MalformedGossip(Malformed):
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
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("key", zproto.STRING),
        ("value", zproto.LONGSTR),
        ("ttl", zproto.NUMBER4),
    )
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

_CODEC: Final[zproto.Codec[GossipMessage]] = zproto.Codec(
    [
        zproto.Spec(cls.ID, MESSAGE_NAMES[cls.ID], cls, getattr(cls, "LAYOUT", ()))
        for cls in (Hello, Publish, Ping, Pong, Invalid)
    ],
    signature=SIGNATURE,
    version=VERSION,
    error=MalformedGossip,
    text=zproto.STRICT,
)


def encode(message: GossipMessage) -> bytes:
    """
    The one frame that carries C{message}.

    @raise MalformedGossip: the key is longer than 255 UTF-8 bytes, the
        value longer than a u32 can say, the ttl is not a u32, or a string
        is not encodable as UTF-8.
    """
    return _CODEC.encode_header(message)


def decode(frame: bytes) -> GossipMessage:
    """
    The message C{frame} carries.

    @raise MalformedGossip: with the reason, for anything that is not
        exactly one well-formed zgossip message.
    """
    return _CODEC.decode_frame(frame)
