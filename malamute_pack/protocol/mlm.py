"""
The Malamute protocol (MLM v1) codec: ZeroMQ frames to message objects and back.

Stateless, in the manner of ``twisted.names.dns``: every message is a small
dataclass, ``decode`` turns a list of frames into one and ``encode`` turns
one back into frames. Frame 1 is ``AA A8 | id | fields``; content frames,
where a message has them, follow as the remaining frames.

Messages 1-18 are MLM v1, byte for byte as libmlm's codec; 19-25 are our
version 2 extension (``docs/protocol.md``), which adds a number8 field kind.

Strings travel as a length byte plus UTF-8; bytes that are not valid UTF-8
are kept with ``surrogateescape`` so that any subject a C client sends
decodes and re-encodes to the same bytes.

Tests: ``tests/test_protocol_mlm.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar, Final

SIGNATURE: Final = b"\xaa\xa8"

# Status codes of the protocol.
SUCCESS: Final = 200
FAILED: Final = 300
COMMAND_INVALID: Final = 500
NOT_IMPLEMENTED: Final = 501
INTERNAL_ERROR: Final = 502


class MalformedMessage(ValueError):
    """
    Raised for any input that is not a well-formed MLM message: a short
    frame, a wrong signature, an unknown id, a length that runs past the end
    of the frame, trailing bytes, or a field value that cannot be encoded.
    """


# Field kinds: a string (u8 length), a number2 (u16), a number4 (u32), and,
# in version 2 messages only, a number8 (u64).
_STRING, _NUMBER2, _NUMBER4, _NUMBER8 = "s", "2", "4", "8"


@dataclass(slots=True)
class Message:
    """Base of every MLM message; subclasses set ``ID`` and ``LAYOUT``."""

    ID: ClassVar[int] = 0
    # (attribute, kind) in wire order.
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = ()
    HAS_CONTENT: ClassVar[bool] = False


@dataclass(slots=True)
class ConnectionOpen(Message):
    ID: ClassVar[int] = 1
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("protocol", _STRING),
        ("version", _NUMBER2),
        ("address", _STRING),
    )
    protocol: str = "MALAMUTE"
    version: int = 1
    address: str = ""


@dataclass(slots=True)
class ConnectionPing(Message):
    ID: ClassVar[int] = 2


@dataclass(slots=True)
class ConnectionPong(Message):
    ID: ClassVar[int] = 3


@dataclass(slots=True)
class ConnectionClose(Message):
    ID: ClassVar[int] = 4


@dataclass(slots=True)
class StreamWrite(Message):
    ID: ClassVar[int] = 5
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("stream", _STRING),)
    stream: str = ""


@dataclass(slots=True)
class StreamRead(Message):
    ID: ClassVar[int] = 6
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("stream", _STRING), ("pattern", _STRING))
    stream: str = ""
    pattern: str = ""


@dataclass(slots=True)
class StreamSend(Message):
    ID: ClassVar[int] = 7
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("subject", _STRING),)
    HAS_CONTENT: ClassVar[bool] = True
    subject: str = ""
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class StreamDeliver(Message):
    ID: ClassVar[int] = 8
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("sender", _STRING),
        ("subject", _STRING),
    )
    HAS_CONTENT: ClassVar[bool] = True
    address: str = ""
    sender: str = ""
    subject: str = ""
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class _Send(Message):
    """What MAILBOX_SEND and SERVICE_SEND share."""

    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("subject", _STRING),
        ("tracker", _STRING),
        ("timeout", _NUMBER4),
    )
    HAS_CONTENT: ClassVar[bool] = True
    address: str = ""
    subject: str = ""
    tracker: str = ""
    timeout: int = 0
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class MailboxSend(_Send):
    ID: ClassVar[int] = 9


@dataclass(slots=True)
class _Deliver(Message):
    """What MAILBOX_DELIVER and SERVICE_DELIVER share."""

    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("sender", _STRING),
        ("address", _STRING),
        ("subject", _STRING),
        ("tracker", _STRING),
    )
    HAS_CONTENT: ClassVar[bool] = True
    sender: str = ""
    address: str = ""
    subject: str = ""
    tracker: str = ""
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class MailboxDeliver(_Deliver):
    ID: ClassVar[int] = 10


@dataclass(slots=True)
class ServiceSend(_Send):
    ID: ClassVar[int] = 11


@dataclass(slots=True)
class ServiceOffer(Message):
    ID: ClassVar[int] = 12
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("address", _STRING), ("pattern", _STRING))
    address: str = ""
    pattern: str = ""


@dataclass(slots=True)
class ServiceDeliver(_Deliver):
    ID: ClassVar[int] = 13


_STATUS: Final = (("status_code", _NUMBER2), ("status_reason", _STRING))


@dataclass(slots=True)
class Ok(Message):
    ID: ClassVar[int] = 14
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = _STATUS
    status_code: int = SUCCESS
    status_reason: str = ""


@dataclass(slots=True)
class Error(Message):
    ID: ClassVar[int] = 15
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = _STATUS
    status_code: int = COMMAND_INVALID
    status_reason: str = ""


@dataclass(slots=True)
class Credit(Message):
    ID: ClassVar[int] = 16
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("amount", _NUMBER2),)
    amount: int = 0


@dataclass(slots=True)
class Confirm(Message):
    ID: ClassVar[int] = 17
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("tracker", _STRING), *_STATUS)
    tracker: str = ""
    status_code: int = SUCCESS
    status_reason: str = ""


@dataclass(slots=True)
class StreamCancel(Message):
    ID: ClassVar[int] = 18
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("stream", _STRING),)
    stream: str = ""


# Protocol version 2 (docs/protocol.md): only a client that opened with
# version 2 sends or receives these.

# STREAM_READ_FROM's whence: where reading starts.
LATEST, EARLIEST, SEQUENCE, TIME = 0, 1, 2, 3


@dataclass(slots=True)
class StreamReadFrom(Message):
    ID: ClassVar[int] = 19
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("pattern", _STRING),
        ("whence", _NUMBER2),
        ("position", _NUMBER8),
    )
    stream: str = ""
    pattern: str = ""
    whence: int = LATEST
    position: int = 0


@dataclass(slots=True)
class StreamRecord(Message):
    ID: ClassVar[int] = 20
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        *StreamDeliver.LAYOUT,
        ("sequence", _NUMBER8),
        ("timestamp", _NUMBER8),
    )
    HAS_CONTENT: ClassVar[bool] = True
    address: str = ""
    sender: str = ""
    subject: str = ""
    sequence: int = 0
    timestamp: int = 0  # milliseconds since the epoch
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class StreamGap(Message):
    ID: ClassVar[int] = 21
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("missed", _NUMBER8),
        ("available", _NUMBER8),
    )
    address: str = ""
    missed: int = 0
    available: int = 0


@dataclass(slots=True)
class Stored(Message):
    ID: ClassVar[int] = 22
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("id", _NUMBER8),
        ("tracker", _STRING),
        *_STATUS,
    )
    id: int = 0
    tracker: str = ""
    status_code: int = SUCCESS
    status_reason: str = ""


@dataclass(slots=True)
class _Record(Message):
    """What MAILBOX_RECORD and SERVICE_RECORD share: a delivery plus its id."""

    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("id", _NUMBER8), *_Deliver.LAYOUT)
    HAS_CONTENT: ClassVar[bool] = True
    id: int = 0
    sender: str = ""
    address: str = ""
    subject: str = ""
    tracker: str = ""
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class MailboxRecord(_Record):
    ID: ClassVar[int] = 23


@dataclass(slots=True)
class ServiceRecord(_Record):
    ID: ClassVar[int] = 24


@dataclass(slots=True)
class Done(Message):
    ID: ClassVar[int] = 25
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (("id", _NUMBER8), *_STATUS)
    id: int = 0
    status_code: int = SUCCESS
    status_reason: str = ""


MESSAGE_TYPES: Final[dict[int, type[Message]]] = {
    cls.ID: cls
    for cls in (
        ConnectionOpen,
        ConnectionPing,
        ConnectionPong,
        ConnectionClose,
        StreamWrite,
        StreamRead,
        StreamSend,
        StreamDeliver,
        MailboxSend,
        MailboxDeliver,
        ServiceSend,
        ServiceOffer,
        ServiceDeliver,
        Ok,
        Error,
        Credit,
        Confirm,
        StreamCancel,
        StreamReadFrom,
        StreamRecord,
        StreamGap,
        Stored,
        MailboxRecord,
        ServiceRecord,
        Done,
    )
}

# Wire name of each message, as in the protocol's own documentation.
MESSAGE_NAMES: Final[dict[int, str]] = {
    1: "CONNECTION_OPEN",
    2: "CONNECTION_PING",
    3: "CONNECTION_PONG",
    4: "CONNECTION_CLOSE",
    5: "STREAM_WRITE",
    6: "STREAM_READ",
    7: "STREAM_SEND",
    8: "STREAM_DELIVER",
    9: "MAILBOX_SEND",
    10: "MAILBOX_DELIVER",
    11: "SERVICE_SEND",
    12: "SERVICE_OFFER",
    13: "SERVICE_DELIVER",
    14: "OK",
    15: "ERROR",
    16: "CREDIT",
    17: "CONFIRM",
    18: "STREAM_CANCEL",
    19: "STREAM_READ_FROM",
    20: "STREAM_RECORD",
    21: "STREAM_GAP",
    22: "STORED",
    23: "MAILBOX_RECORD",
    24: "SERVICE_RECORD",
    25: "DONE",
}

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_PACKERS: Final = {_NUMBER2: _U16, _NUMBER4: _U32, _NUMBER8: _U64}


def encode_string(value: str) -> bytes:
    """Encode one protocol string: a length byte and the UTF-8 bytes."""
    data = value.encode("utf-8", "surrogateescape")
    if len(data) > 255:
        raise MalformedMessage(f"string of {len(data)} bytes is longer than 255")
    return bytes((len(data),)) + data


def fit_string(text: str) -> str:
    """C{text} cut, if need be, to fit a protocol string (255 bytes)."""
    data = text.encode("utf-8", "surrogateescape")
    return text if len(data) <= 255 else data[:252].decode("utf-8", "ignore") + "..."


def _encode_number(value: int, packer: struct.Struct) -> bytes:
    try:
        return packer.pack(value)
    except struct.error as e:
        raise MalformedMessage(f"number {value} out of range") from e


def encode_header(message: Message) -> bytes:
    """Encode frame 1 (signature, id and fields) of ``message``."""
    parts = [SIGNATURE, bytes((message.ID,))]
    for name, kind in message.LAYOUT:
        value = getattr(message, name)
        if kind is _STRING:
            parts.append(encode_string(value))
        else:
            parts.append(_encode_number(value, _PACKERS[kind]))
    return b"".join(parts)


def encode(message: Message) -> list[bytes]:
    """Encode ``message`` as the list of ZeroMQ frames that carry it."""
    header = encode_header(message)
    if message.HAS_CONTENT:
        content: list[bytes] = getattr(message, "content")  # noqa: B009 (slots dataclass)
        return [header, *content]
    return [header]


def decode(frames: Sequence[bytes]) -> Message:
    """
    Decode the frames of one message.

    @raise MalformedMessage: if the frames are not one well-formed message.
    """
    if not frames:
        raise MalformedMessage("no frames")
    header = frames[0]
    if len(header) < 3:
        raise MalformedMessage(f"frame of {len(header)} bytes is too short for a header")
    if header[0] != 0xAA or header[1] != 0xA8:
        raise MalformedMessage(f"wrong signature {header[:2].hex()}")
    cls = MESSAGE_TYPES.get(header[2])
    if cls is None:
        raise MalformedMessage(f"unknown message id {header[2]}")
    values: list[object] = []
    offset = 3
    end = len(header)
    for _name, kind in cls.LAYOUT:
        if kind is _STRING:
            if offset >= end:
                raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: string length runs past the end")
            size = header[offset]
            offset += 1
            if offset + size > end:
                raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: string runs past the end")
            values.append(header[offset : offset + size].decode("utf-8", "surrogateescape"))
            offset += size
        elif kind is _NUMBER2:
            if offset + 2 > end:
                raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: number2 runs past the end")
            values.append((header[offset] << 8) | header[offset + 1])
            offset += 2
        else:
            packer = _PACKERS[kind]
            if offset + packer.size > end:
                raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: number{kind} runs past the end")
            values.append(packer.unpack_from(header, offset)[0])
            offset += packer.size
    if offset != end:
        raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: {end - offset} trailing bytes")
    if cls.HAS_CONTENT:
        values.append(list(frames[1:]))
    elif len(frames) > 1:
        raise MalformedMessage(f"{MESSAGE_NAMES[cls.ID]}: carries no content frames")
    return cls(*values)


def message_fields(message: Message) -> dict[str, object]:
    """The field values of ``message`` by name, content included."""
    return {f.name: getattr(message, f.name) for f in fields(message)}
