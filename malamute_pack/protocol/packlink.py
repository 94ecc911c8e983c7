"""
The inter-broker protocol of a pack: what one broker tells a peer broker
over their ZRE link, carried as the content frames of a ZRE WHISPER.

Frame 1 of every message is ``AA A3 | id u8 | version u8 (1) | fields``;
messages with content (FORWARD, LETTER) carry it as the frames after it.
Fields are those of MLM: a string is a length byte and UTF-8 bytes, numbers
are big-endian (``byte`` 1, ``number2`` 2, ``number4`` 4, ``number8`` 8
bytes). ``docs/protocol.md`` ("Packs") says what each message means.

Stateless, like L{malamute_pack.protocol.mlm}: bytes to message objects and
back, nothing else, compiled from the messages' layouts by
L{malamute_pack.protocol.zproto}.

Tests: ``tests/unit/test_protocol_packlink.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Final

from malamute_pack.protocol import zproto
from malamute_pack.protocol.errors import Malformed

SIGNATURE: Final = b"\xaa\xa3"
# 2: OWNER (a CURVE pack's brokers tell each other who owns which address).
# 3: the GROUP_* messages (consumer groups whose members are on several brokers).
VERSION: Final = 3

# Field kinds.
_STRING, _BYTE, _NUMBER2, _NUMBER4, _NUMBER8 = (
    zproto.STRING,
    zproto.NUMBER1,
    zproto.NUMBER2,
    zproto.NUMBER4,
    zproto.NUMBER8,
)

# INTEREST's whence: as MLM's STREAM_READ_FROM.
LATEST, EARLIEST, SEQUENCE, TIME = 0, 1, 2, 3
# LETTER's kind.
MAILBOX, SERVICE = 1, 2
# ANSWER's phase.
STORED, DONE = 1, 2


class MalformedLink(Malformed):
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


@dataclass(frozen=True, slots=True)
class GroupJoin(LinkMessage):
    """
    A client of the sender joins consumer group C{group} of C{stream} as
    member C{member}, and the receiver is the group's home: it assigns the
    member records (L{GroupRecord}) as it would a client of its own.
    C{whence}/C{position} are STREAM_CONSUME's (positions in the home's copy);
    C{user} is the client's authenticated user ("" for none), believed in a
    CURVE pack only.
    """

    ID: ClassVar[int] = 11
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("pattern", _STRING),
        ("whence", _BYTE),
        ("position", _NUMBER8),
        ("user", _STRING),
    )
    stream: str = ""
    group: str = ""
    member: str = ""
    pattern: str = ""
    whence: int = 0
    position: int = 0
    user: str = ""


@dataclass(frozen=True, slots=True)
class GroupCredit(LinkMessage):
    """The sender can take C{credit} more records for member C{member} of the group."""

    ID: ClassVar[int] = 12
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("credit", _NUMBER4),
    )
    stream: str = ""
    group: str = ""
    member: str = ""
    credit: int = 0


@dataclass(frozen=True, slots=True)
class GroupCommit(LinkMessage):
    """
    Member C{member} acknowledges record C{sequence} (of the home's copy)
    and every record it was sent before it: STREAM_COMMIT, passed on.
    """

    ID: ClassVar[int] = 13
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("sequence", _NUMBER8),
    )
    stream: str = ""
    group: str = ""
    member: str = ""
    sequence: int = 0


@dataclass(frozen=True, slots=True)
class GroupLeave(LinkMessage):
    """Member C{member} left the group (its client cancelled, closed or expired)."""

    ID: ClassVar[int] = 14
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
    )
    stream: str = ""
    group: str = ""
    member: str = ""


@dataclass(frozen=True, slots=True)
class GroupRecord(LinkMessage):
    """
    A record the home assigned to member C{member}, numbered C{sequence} in
    the home's copy of C{stream} (the number the member commits);
    C{timestamp} in microseconds since the epoch.
    """

    ID: ClassVar[int] = 15
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("sequence", _NUMBER8),
        ("timestamp", _NUMBER8),
        ("sender", _STRING),
        ("subject", _STRING),
    )
    HAS_CONTENT: ClassVar[bool] = True
    stream: str = ""
    group: str = ""
    member: str = ""
    sequence: int = 0
    timestamp: int = 0
    sender: str = ""
    subject: str = ""
    content: Sequence[bytes] = field(default=())


@dataclass(frozen=True, slots=True)
class GroupCommitted(LinkMessage):
    """The home's answer to a L{GroupCommit}: STREAM_COMMITTED, passed back."""

    ID: ClassVar[int] = 16
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("sequence", _NUMBER8),
        ("code", _NUMBER2),
        ("reason", _STRING),
    )
    stream: str = ""
    group: str = ""
    member: str = ""
    sequence: int = 0
    code: int = 200
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GroupEnded(LinkMessage):
    """
    The home refused member C{member}'s join, or ended its membership (its
    lease expired, another took its name): C{code} and C{reason} say why.
    """

    ID: ClassVar[int] = 17
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("member", _STRING),
        ("code", _NUMBER2),
        ("reason", _STRING),
    )
    stream: str = ""
    group: str = ""
    member: str = ""
    code: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GroupPosition(LinkMessage):
    """
    What the home of group C{group} of C{stream} has acknowledged, in
    origin terms (portable to another home): per origin broker, the highest
    origin sequence number at or below which every record of the group is
    acknowledged, since the group was last reset at C{reset} (µs since the
    epoch; 0: never): a later reset replaces what an earlier one said. The
    content is that vector (L{encode_vector}).
    """

    ID: ClassVar[int] = 18
    LAYOUT: ClassVar[tuple[tuple[str, str], ...]] = (
        ("stream", _STRING),
        ("group", _STRING),
        ("reset", _NUMBER8),
    )
    HAS_CONTENT: ClassVar[bool] = True
    stream: str = ""
    group: str = ""
    reset: int = 0
    content: Sequence[bytes] = field(default=())


# Origins one GROUP_POSITION may name (a pack has fewer brokers).
MAX_ORIGINS: Final = 1024


def encode_vector(vector: dict[str, int]) -> tuple[bytes, ...]:
    """GROUP_POSITION's content: per origin, a frame of its id and one of its number (8 bytes)."""
    frames: list[bytes] = []
    for origin, seq in sorted(vector.items()):
        frames.append(origin.encode())
        frames.append(seq.to_bytes(8, "big"))
    return tuple(frames)


def decode_vector(content: Sequence[bytes]) -> dict[str, int]:
    """The vector a GROUP_POSITION carries; L{MalformedLink} if it is not one."""
    if len(content) % 2 or len(content) > 2 * MAX_ORIGINS:
        raise MalformedLink(f"group position of {len(content)} frames")
    vector: dict[str, int] = {}
    for i in range(0, len(content), 2):
        origin, seq = content[i], content[i + 1]
        if not origin or len(origin) > 255 or len(seq) != 8:
            raise MalformedLink("group position: an origin or a number of the wrong size")
        try:
            vector[origin.decode()] = int.from_bytes(seq, "big")
        except UnicodeDecodeError as e:
            raise MalformedLink("group position: an origin not UTF-8") from e
    return vector


# What a pack's brokers say about consumer groups (L{malamute_pack.pack.groups}).
GROUP_MESSAGES: Final = (
    GroupJoin, GroupCredit, GroupCommit, GroupLeave, GroupRecord, GroupCommitted, GroupEnded,
    GroupPosition,
)  # fmt: skip


MESSAGE_TYPES: Final[dict[int, type[LinkMessage]]] = {
    cls.ID: cls
    for cls in (
        Sync, Interest, Uninterest, Address, Offer, Forward, Letter, Answer, Confirm, Owner,
        *GROUP_MESSAGES,
    )
}  # fmt: skip

_CODEC: Final[zproto.Codec[LinkMessage]] = zproto.Codec(
    [
        zproto.Spec.of(cls, cls.__name__.upper(), zproto.Content(tuple))
        for cls in MESSAGE_TYPES.values()
    ],
    signature=SIGNATURE,
    version=VERSION,
    error=MalformedLink,
    text=zproto.STRICT,
    wording=zproto.Wording(
        too_short="header of {size} bytes is too short",
        version="version {version}, this broker speaks {expected}",
        string_length="{field}: string length runs past the end",
        string_past="{field}: string runs past the end",
        number_past="{field}: number runs past the end",
        trailing="{size} trailing bytes",
        no_content="message {id} carries no content frames",
        not_utf8="{field}: not UTF-8",
        too_long="{field}: string of {size} bytes is longer than 255",
        not_encodable="not encodable as UTF-8: {error}",
        out_of_range="number out of range: {error}",
    ),
)
_encode_forward_header: Final = _CODEC.header_encoder(Forward)
_encode_group_record_header: Final = _CODEC.header_encoder(GroupRecord)


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
    header = _encode_forward_header(stream, origin_seq, timestamp, sender, subject, history)
    return [header, *content]


def encode_group_record(
    stream: str,
    group: str,
    member: str,
    sequence: int,
    timestamp: int,
    sender: str,
    subject: str,
    content: Sequence[bytes],
) -> list[bytes]:
    """
    The frames of a GROUP_RECORD, without making the message object: what
    L{encode} gives for L{GroupRecord} (a group's every record to a member
    on another broker is one).
    """
    header = _encode_group_record_header(
        stream, group, member, sequence, timestamp, sender, subject
    )
    return [header, *content]


# encode(message): the frames of message; MalformedLink for a value that
# does not fit.
encode: Final[Callable[[LinkMessage], list[bytes]]] = _CODEC.encode

# decode(frames): the message frames carry; MalformedLink, with the
# reason, if they are not one.
decode: Final[Callable[[Sequence[bytes]], LinkMessage]] = _CODEC.decode
