"""
The inter-broker protocol of a pack: what one broker tells a peer broker
over their ZRE link, carried as the content frames of a ZRE WHISPER.

Frame 1 of every message is ``AA A3 | id u8 | version u8 (1) | fields``;
messages with content (FORWARD, LETTER) carry it as the frames after it.
Fields are those of MLM: a string is a length byte and UTF-8 bytes, numbers
are big-endian (``byte`` 1, ``number2`` 2, ``number4`` 4, ``number8`` 8
bytes). ``docs/protocol.md`` ("Packs") says what each message means.

Stateless, like L{malamute_pack.protocol.mlm}: bytes to message objects and
back, nothing else.

Tests: ``tests/unit/test_protocol_packlink.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

SIGNATURE: Final = b"\xaa\xa3"
# 2: OWNER (a CURVE pack's brokers tell each other who owns which address).
VERSION: Final = 2

# Field kinds.
_STRING, _BYTE, _NUMBER2, _NUMBER4, _NUMBER8 = "s", "1", "2", "4", "8"
_NUMBERS: Final = {
    _BYTE: struct.Struct(">B"),
    _NUMBER2: struct.Struct(">H"),
    _NUMBER4: struct.Struct(">I"),
    _NUMBER8: struct.Struct(">Q"),
}

# INTEREST's whence: as MLM's STREAM_READ_FROM.
LATEST, EARLIEST, SEQUENCE, TIME = 0, 1, 2, 3
# LETTER's kind.
MAILBOX, SERVICE = 1, 2
# ANSWER's phase.
STORED, DONE = 1, 2


class MalformedLink(ValueError):
    """A frame sequence that is not a well-formed pack message."""


@dataclass(frozen=True, slots=True)
class LinkMessage:
    """Base of every pack message; subclasses set ``ID`` and ``LAYOUT``."""

    ID: ClassVar[int] = 0
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = ()
    HAS_CONTENT: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class Sync(LinkMessage):
    """
    The sender (re)starts telling its state: forget every interest, address
    and offer it announced before; the full set follows as deltas.

    @ivar broker: the sender's stable broker id (what forwarded records are
        journaled with as their origin).
    """

    ID: ClassVar[int] = 1
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("broker", _STRING), ("version", _NUMBER2))
    broker: str = ""
    version: int = VERSION


@dataclass(frozen=True, slots=True)
class Interest(LinkMessage):
    """
    The sender has readers of C{stream} with C{pattern}: forward it the
    matching records written on the receiver, from the position
    C{whence}/C{position} (of the receiver's own records). With C{history},
    the records replayed from the receiver's journal are marked as history.
    """

    ID: ClassVar[int] = 2
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("pattern", _STRING),
        ("whence", _BYTE),
        ("position", _NUMBER8),
        ("history", _BYTE),
    )
    stream: str = ""
    pattern: str = ""
    whence: int = LATEST
    position: int = 0
    history: int = 0


@dataclass(frozen=True, slots=True)
class Uninterest(LinkMessage):
    """The sender has no reader of C{stream} with C{pattern} any more."""

    ID: ClassVar[int] = 3
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("stream", _STRING), ("pattern", _STRING))
    stream: str = ""
    pattern: str = ""


@dataclass(frozen=True, slots=True)
class Address(LinkMessage):
    """A client with C{address} connected to the sender (C{present} 1) or left it (0)."""

    ID: ClassVar[int] = 4
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("address", _STRING), ("present", _BYTE))
    address: str = ""
    present: int = 1


@dataclass(frozen=True, slots=True)
class Offer(LinkMessage):
    """
    The sender has C{workers} workers offering C{service} with C{pattern}
    (0: none any more).
    """

    ID: ClassVar[int] = 5
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("service", _STRING),
        ("pattern", _STRING),
        ("workers", _NUMBER4),
    )
    service: str = ""
    pattern: str = ""
    workers: int = 0


@dataclass(frozen=True, slots=True)
class Forward(LinkMessage):
    """
    A record first written on the sender (number C{origin_seq} of its copy
    of C{stream}), for the receiver's readers. C{timestamp} is in
    microseconds since the epoch; C{history} marks a record replayed for a
    history request (L{Interest}).
    """

    ID: ClassVar[int] = 6
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("origin_seq", _NUMBER8),
        ("timestamp", _NUMBER8),
        ("sender", _STRING),
        ("subject", _STRING),
        ("history", _BYTE),
    )
    HAS_CONTENT: ClassVar[bool] = True
    stream: str = ""
    origin_seq: int = 0
    timestamp: int = 0
    sender: str = ""
    subject: str = ""
    history: int = 0
    content: Sequence[bytes] = field(default=())


@dataclass(frozen=True, slots=True)
class Letter(LinkMessage):
    """
    A mailbox letter (C{kind} 1) or service request (2) the sender holds,
    handed to the receiver; C{relay_id} is the sender's id for it, which
    the receiver's L{Answer} names. C{timeout} is what is left of its
    deadline in milliseconds (0: none).
    """

    ID: ClassVar[int] = 7
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("kind", _BYTE),
        ("relay_id", _NUMBER8),
        ("sender", _STRING),
        ("address", _STRING),
        ("subject", _STRING),
        ("tracker", _STRING),
        ("timeout", _NUMBER4),
    )
    HAS_CONTENT: ClassVar[bool] = True
    kind: int = MAILBOX
    relay_id: int = 0
    sender: str = ""
    address: str = ""
    subject: str = ""
    tracker: str = ""
    timeout: int = 0
    content: Sequence[bytes] = field(default=())


@dataclass(frozen=True, slots=True)
class Answer(LinkMessage):
    """
    What became of the letter C{relay_id}: stored durably (phase 1) or
    finished by its recipient (phase 2) with C{code} 200; refused with
    another code (the sender takes it back).
    """

    ID: ClassVar[int] = 8
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("relay_id", _NUMBER8),
        ("phase", _BYTE),
        ("code", _NUMBER2),
        ("reason", _STRING),
    )
    relay_id: int = 0
    phase: int = STORED
    code: int = 200
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Confirm(LinkMessage):
    """A recipient's CONFIRM of a tracked letter, for its sender C{address} on the receiver."""

    ID: ClassVar[int] = 9
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("tracker", _STRING),
        ("code", _NUMBER2),
        ("reason", _STRING),
    )
    address: str = ""
    tracker: str = ""
    code: int = 200
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Owner(LinkMessage):
    """
    C{user} owns C{address}, claimed at C{claimed} (microseconds since the
    epoch): sent by the brokers of a CURVE pack when a claim is made, and
    all of them at a (re)synchronisation; the receiver keeps the claim that
    prevails (L{malamute_pack.broker.access.Claim.prevails}).
    """

    ID: ClassVar[int] = 10
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("user", _STRING),
        ("claimed", _NUMBER8),
    )
    address: str = ""
    user: str = ""
    claimed: int = 0


MESSAGE_TYPES: Final[dict[int, type[LinkMessage]]] = {
    cls.ID: cls
    for cls in (
        Sync, Interest, Uninterest, Address, Offer, Forward, Letter, Answer, Confirm, Owner
    )
}  # fmt: skip

_HEADER = struct.Struct(">2sBB")
_QQ = struct.Struct(">QQ")


def _take_string(header: bytes, offset: int, name: str) -> tuple[str, int]:
    if offset >= len(header):
        raise MalformedLink(f"{name}: string length runs past the end")
    end = offset + 1 + header[offset]
    if end > len(header):
        raise MalformedLink(f"{name}: string runs past the end")
    try:
        return header[offset + 1 : end].decode("utf-8"), end
    except UnicodeDecodeError as e:
        raise MalformedLink(f"{name}: not UTF-8") from e


def _decode_forward(header: bytes, frames: Sequence[bytes]) -> Forward:
    """A FORWARD, decoded field by field (every forwarded record is one)."""
    stream, offset = _take_string(header, 4, "stream")
    if offset + 16 > len(header):
        raise MalformedLink("origin_seq: number runs past the end")
    origin_seq, timestamp = _QQ.unpack_from(header, offset)
    sender, offset = _take_string(header, offset + 16, "sender")
    subject, offset = _take_string(header, offset, "subject")
    if offset >= len(header):
        raise MalformedLink("history: number runs past the end")
    if offset + 1 != len(header):
        raise MalformedLink(f"{len(header) - offset - 1} trailing bytes")
    return Forward(
        stream, origin_seq, timestamp, sender, subject, header[offset], tuple(frames[1:])
    )


def _encode_fields(message: LinkMessage) -> bytes:
    parts = [_HEADER.pack(SIGNATURE, message.ID, VERSION)]
    for name, kind in message.LAYOUT:
        value = getattr(message, name)
        if kind == _STRING:
            try:
                data = value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise MalformedLink(f"{name}: not encodable as UTF-8") from e
            if len(data) > 255:
                raise MalformedLink(f"{name}: string of {len(data)} bytes is longer than 255")
            parts += (bytes((len(data),)), data)
        else:
            try:
                parts.append(_NUMBERS[kind].pack(value))
            except struct.error as e:
                raise MalformedLink(f"{name}: number out of range: {e}") from e
    return b"".join(parts)


_FORWARD_HEAD = bytes((0xAA, 0xA3, 6, VERSION))


def _short(name: str, value: str) -> bytes:
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MalformedLink(f"{name}: not encodable as UTF-8") from e
    if len(data) > 255:
        raise MalformedLink(f"{name}: string of {len(data)} bytes is longer than 255")
    return bytes((len(data),)) + data


def encode_forward(
    stream: str,
    origin_seq: int,
    timestamp: int,
    sender: str,
    subject: str,
    history: int,
    content: Sequence[bytes],
) -> list[bytes]:
    """
    The frames of a FORWARD, without making the message object: what
    L{encode} gives for L{Forward} (every forwarded record is one).
    """
    try:
        numbers = _QQ.pack(origin_seq, timestamp)
    except struct.error as e:
        raise MalformedLink(f"number out of range: {e}") from e
    header = b"".join(
        (
            _FORWARD_HEAD,
            _short("stream", stream),
            numbers,
            _short("sender", sender),
            _short("subject", subject),
            b"\x01" if history else b"\x00",
        )
    )
    return [header, *content]


def encode(message: LinkMessage) -> list[bytes]:
    """The frames of C{message}; MalformedLink for a value that does not fit."""
    frames = [_encode_fields(message)]
    if message.HAS_CONTENT:
        frames.extend(message.content)  # type: ignore[attr-defined]
    return frames


def decode(frames: Sequence[bytes]) -> LinkMessage:
    """The message C{frames} carry; MalformedLink, with the reason, if they are not one."""
    if not frames:
        raise MalformedLink("no frames")
    header = frames[0]
    if len(header) < 4:
        raise MalformedLink(f"header of {len(header)} bytes is too short")
    signature, message_id, version = _HEADER.unpack_from(header)
    if signature != SIGNATURE:
        raise MalformedLink(f"bad signature {signature.hex()}")
    if version != VERSION:
        raise MalformedLink(f"version {version}, this broker speaks {VERSION}")
    if message_id == Forward.ID:
        return _decode_forward(header, frames)
    cls = MESSAGE_TYPES.get(message_id)
    if cls is None:
        raise MalformedLink(f"unknown message id {message_id}")
    values: list[object] = []
    offset, end = 4, len(header)
    for name, kind in cls.LAYOUT:
        if kind == _STRING:
            text, offset = _take_string(header, offset, name)
            values.append(text)
        else:
            number = _NUMBERS[kind]
            if offset + number.size > end:
                raise MalformedLink(f"{name}: number runs past the end")
            values.append(number.unpack_from(header, offset)[0])
            offset += number.size
    if offset != end:
        raise MalformedLink(f"{end - offset} trailing bytes")
    if cls.HAS_CONTENT:
        values.append(tuple(frames[1:]))
    elif len(frames) > 1:
        raise MalformedLink(f"message {message_id} carries no content frames")
    make: Callable[..., LinkMessage] = cls
    return make(*values)
