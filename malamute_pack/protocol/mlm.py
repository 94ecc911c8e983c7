"""
The Malamute protocol (MLM v1) codec: ZeroMQ frames to message objects and back.

Stateless, in the manner of ``twisted.names.dns``: every message is a small
dataclass, ``decode`` turns a list of frames into one and ``encode`` turns
one back into frames. Frame 1 is ``AA A8 | id | fields``; content frames,
where a message has them, follow as the remaining frames.

Messages 1-18 are MLM v1, byte for byte as libmlm's codec; 19-32 are our
version 2 extension (``docs/protocol.md``), which adds a number8 field kind.

Strings travel as a length byte plus UTF-8; bytes that are not valid UTF-8
are kept with ``surrogateescape`` so that any subject a C client sends
decodes and re-encodes to the same bytes.

Tests: ``tests/unit/test_protocol_mlm.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar, Final

from malamute_pack.protocol import zproto
from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"\xaa\xa8"

# Status codes of the protocol.
SUCCESS: Final = 200
FAILED: Final = 300
COMMAND_INVALID: Final = 500
NOT_IMPLEMENTED: Final = 501
INTERNAL_ERROR: Final = 502
# A broker of a pair that is not the active one (docs/pair.md): try its partner.
NOT_ACTIVE: Final = 503


class MalformedMessage(Malformed):
    """
    Raised for any input that is not a well-formed MLM message: a short
    frame, a wrong signature, an unknown id, a length that runs past the end
    of the frame, trailing bytes, or a field value that cannot be encoded.
    """


class InvalidText(MalformedMessage):
    """
    Raised by L{decode_checked} for a well-formed message with a string
    field that is not valid UTF-8 (the protocol's strings are UTF-8).

    @ivar message: the message, decoded anyway (the bad bytes kept with
        ``surrogateescape``), so that a broker can refuse it as the protocol
        answers that message.
    @ivar field: the first such field.
    """

    def __init__(self, message: Message, field: str) -> None:
        raw = getattr(message, field).encode("utf-8", "surrogateescape")
        super().__init__(f"invalid {field}: not valid UTF-8 ({raw[:32].hex(' ')})")
        self.message = message
        self.field = field


# Field kinds: a string (u8 length), a number2 (u16), a number4 (u32), and,
# in version 2 messages only, a number8 (u64).
_STRING, _NUMBER2, _NUMBER4, _NUMBER8 = (
    zproto.STRING,
    zproto.NUMBER2,
    zproto.NUMBER4,
    zproto.NUMBER8,
)


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

# STREAM_READ_FROM's and STREAM_CONSUME's whence: where reading starts.
# LAST_VALUES (a last-value stream's snapshot, then live) and RESUME (a
# durable consumer's acknowledged position) are docs/protocol.md's
# "Consumers the broker remembers".
LATEST, EARLIEST, SEQUENCE, TIME, LAST_VALUES, RESUME = 0, 1, 2, 3, 4, 5


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


# Bulk reads and idempotent writes (version 2, docs/protocol.md "Bulk
# reads and idempotent appends"): what the Spark data source speaks. The
# records of STREAM_CHUNK and STREAM_APPEND travel packed in one content
# frame (L{malamute_pack.protocol.chunks}).


@dataclass(slots=True)
class StreamQuery(Message):
    ID: ClassVar[int] = 26
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("whence", _NUMBER2),
        ("position", _NUMBER8),
    )
    stream: str = ""
    whence: int = LATEST
    position: int = 0


@dataclass(slots=True)
class StreamStatus(Message):
    ID: ClassVar[int] = 27
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("first", _NUMBER8),
        ("last", _NUMBER8),
        ("position", _NUMBER8),
    )
    address: str = ""
    first: int = 0
    last: int = 0
    position: int = 0


@dataclass(slots=True)
class StreamReadRange(Message):
    ID: ClassVar[int] = 28
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("pattern", _STRING),
        ("first", _NUMBER8),
        ("last", _NUMBER8),
    )
    stream: str = ""
    pattern: str = ""
    first: int = 0
    last: int = 0


@dataclass(slots=True)
class StreamChunk(Message):
    ID: ClassVar[int] = 29
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("count", _NUMBER4),
    )
    HAS_CONTENT: ClassVar[bool] = True
    address: str = ""
    count: int = 0
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class StreamEnd(Message):
    ID: ClassVar[int] = 30
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("last", _NUMBER8),
    )
    address: str = ""
    last: int = 0


@dataclass(slots=True)
class StreamAppend(Message):
    ID: ClassVar[int] = 31
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("key", _STRING),
    )
    HAS_CONTENT: ClassVar[bool] = True
    address: str = ""
    key: str = ""
    content: list[bytes] = field(default_factory=list)


@dataclass(slots=True)
class StreamAppended(Message):
    ID: ClassVar[int] = 32
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("key", _STRING),
        ("first", _NUMBER8),
        ("last", _NUMBER8),
        *_STATUS,
    )
    address: str = ""
    key: str = ""
    first: int = 0
    last: int = 0
    status_code: int = SUCCESS
    status_reason: str = ""


# STREAM_APPENDED's code for an append whose key the stream already has: it
# was not written again; first and last are the original's.
ALREADY_WRITTEN: Final = 208


# Consumers the broker remembers (version 2, docs/protocol.md): durable
# named readers and consumer groups, whose positions the journal keeps.


@dataclass(slots=True)
class StreamConsume(Message):
    ID: ClassVar[int] = 33
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("pattern", _STRING),
        ("consumer", _STRING),
        ("group", _STRING),
        ("whence", _NUMBER2),
        ("position", _NUMBER8),
    )
    stream: str = ""
    pattern: str = ""
    consumer: str = ""
    group: str = ""
    whence: int = RESUME
    position: int = 0


@dataclass(slots=True)
class StreamCommit(Message):
    ID: ClassVar[int] = 34
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("sequence", _NUMBER8),
    )
    stream: str = ""
    sequence: int = 0


@dataclass(slots=True)
class StreamCommitted(Message):
    ID: ClassVar[int] = 35
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("address", _STRING),
        ("sequence", _NUMBER8),
        *_STATUS,
    )
    address: str = ""
    sequence: int = 0
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
        StreamQuery,
        StreamStatus,
        StreamReadRange,
        StreamChunk,
        StreamEnd,
        StreamAppend,
        StreamAppended,
        StreamConsume,
        StreamCommit,
        StreamCommitted,
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
    26: "STREAM_QUERY",
    27: "STREAM_STATUS",
    28: "STREAM_READ_RANGE",
    29: "STREAM_CHUNK",
    30: "STREAM_END",
    31: "STREAM_APPEND",
    32: "STREAM_APPENDED",
    33: "STREAM_CONSUME",
    34: "STREAM_COMMIT",
    35: "STREAM_COMMITTED",
}

# The one engine compiles each message's encoder and decoders from its
# LAYOUT (protocol/zproto.py); these words are MLM's own, which clients see
# in ERROR replies.
_WORDING: Final = zproto.Wording(
    too_short="frame of {size} bytes is too short for a header",
    signature="wrong signature {signature}",
    string_length="{name}: string length runs past the end",
    string_past="{name}: string runs past the end",
    number_past="{name}: number{width} runs past the end",
    trailing="{name}: {size} trailing bytes",
    no_content="{name}: carries no content frames",
    too_long="string of {size} bytes is longer than 255",
    out_of_range="number out of range: {error}",
)

_CODEC: Final[zproto.Codec[Message]] = zproto.Codec(
    [zproto.Spec.of(cls, MESSAGE_NAMES[cls.ID]) for cls in MESSAGE_TYPES.values()],
    signature=SIGNATURE,
    error=MalformedMessage,
    wording=_WORDING,
    invalid_text=InvalidText,
)

HeaderEncoder = Callable[..., bytes]


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


def header_encoder(cls: type[Message]) -> HeaderEncoder:
    """
    The function that encodes frame 1 of a C{cls} from its field values,
    given in wire order (content excluded): for hot paths that send many
    messages of one kind without building a message object for each, e.g.
    C{header_encoder(StreamSend)(subject)}.
    """
    return _CODEC.header_encoder(cls)


def header_start(cls: type[Message], *values: object) -> bytes:
    """
    The start of frame 1 of a C{cls}: signature, id and its first
    C{len(values)} fields. With L{header_tail_encoder} it encodes a header
    whose first fields repeat (a stream and its writer) once for many.
    """
    return _CODEC.header_start(cls, *values)


def header_tail_encoder(cls: type[Message], after: int) -> HeaderEncoder:
    """
    The function that encodes the fields of a C{cls} header from the
    C{after}-th on, given in wire order: the bytes that follow
    C{header_start(cls, *first_after_values)}.
    """
    return _CODEC.header_tail_encoder(cls, after)


# Bound once: no Python call of their own on the hot path.

# encode_header(message): encode frame 1 (signature, id and fields) of message.
encode_header: Final[Callable[[Message], bytes]] = _CODEC.encode_header

# encode(message): the list of ZeroMQ frames that carry message. Raises
# MalformedMessage for a field value that does not fit.
encode: Final[Callable[[Message], list[bytes]]] = _CODEC.encode

# decode(frames): decode the frames of one message. A string that is not
# valid UTF-8 is kept as it is (with surrogateescape), so it re-encodes to
# the same bytes: for a client, which takes whatever a broker relays.
# Raises MalformedMessage if the frames are not one well-formed message.
decode: Final[Callable[[Sequence[bytes]], Message]] = _CODEC.decode

# decode_checked(frames): decode the frames of one message and check its
# strings: for a broker, which refuses a name, address or subject that is not
# valid UTF-8. Raises InvalidText for such a string (the exception carries
# the message, decoded as decode would), MalformedMessage if the frames are
# not one well-formed message.
decode_checked: Final[Callable[[Sequence[bytes]], Message]] = _CODEC.decode_checked


def message_fields(message: Message) -> dict[str, object]:
    """The field values of ``message`` by name, content included."""
    return {f.name: getattr(message, f.name) for f in fields(message)}


def message_id(frames: Sequence[bytes]) -> int:
    """
    The message id of the frames of one message (compare it with a class's
    C{ID}), read without decoding its fields: for hot paths that only tell
    kinds apart, such as a load generator counting deliveries. The fields
    are not checked; L{decode} checks them.

    @raise MalformedMessage: if there is no frame, or frame 1 is too short
        or does not start with the signature.
    """
    if not frames:
        raise MalformedMessage("no frames")
    header = frames[0]
    if len(header) < 3 or header[0] != 0xAA or header[1] != 0xA8:
        raise MalformedMessage(f"no MLM header in {header[:3].hex()}")
    return header[2]
