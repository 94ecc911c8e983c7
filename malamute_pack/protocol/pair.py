"""
The pair link's codec: the messages two brokers of a primary/backup pair
(:mod:`malamute_pack.pair`) send each other, to bytes and back, with no
state (as ``twisted/names/dns.py`` is for DNS).

A message is one ZeroMQ message of several frames. The first frame is the
header: the signature ``b"MP"``, the link's version byte (L{VERSION}: a
broker refuses another, naming both), a command byte, then the command's fixed
fields. Journal changes travel one per frame after the header, in the
encoding of :func:`encode_change`, each frame starting with its kind byte:
stream records (R), letters stored (Q) and removed (D), idempotent appends
(A), append keys (K), an address's owner (O), a page of the owners table
(P, catch-up), an operator's stream delete (X) and retention (T), the
clients' security state (S: passwords, CURVE keys, access rules; never
written to the passive's disk), a consumer's position (C), the
last-value streams (L), and what the active shipped and then failed to
write itself (U: record ranges, append keys, letter ids the passive
removes too). Integers are big-endian; a string is a
4-byte length and UTF-8; a float is an IEEE double. Anything that does not
decode raises :class:`MalformedPairMessage`. Messages and changes are
declared by layout and compiled by :mod:`malamute_pack.protocol.zproto`.

Version 2 added the kinds O, P, X, T and S and CATCHUP_BEGIN's first
retained sequence numbers. Version 3 carries an append's
records (A) as one block packed by column
(:mod:`malamute_pack.protocol.rowblock`), no longer as a row frame each:
the passive rebuilds a thousand records without running Python code for
each. Version 4 added consumer positions (C), which the catch-up copies
as rows of their table, and the last-value streams (L). Version 5 added
to HEARTBEAT the history an active took over from (of two actives, the
newer serves) and the pack identity the pair shares; version 6, the
numbers a journal that lost records to damage may have given (its
ceiling: the broker that serves numbers past it), and the change U;
version 7 gives that ceiling for stream numbers and for letter
ids apart (a journal's letter ids start past its creation time); version 8
(this one) added REFILL_ASK and REFILL: an active whose journal lost
records to damage (salvaged) asks its caught-up passive for them.
Brokers of other versions cannot pair with it: each refuses the other's
messages, naming both versions.

=================  ==========  ============================================
command            direction   fields / frames
=================  ==========  ============================================
HEARTBEAT (1)      both        role, state, in_sync, incarnation, epoch, link,
                               leads, previous, pack id, ceiling,
                               letter ceiling
HELLO (2)          passive     incarnation, epoch, last id, streams' last
                               sequence numbers; frame: letter ids (u64s)
CATCHUP_BEGIN (3)  active      link, base, mode, epoch, truncate points and
                               id, counters, first sequence numbers
                               retained; frame: letter ids to delete
SHIP (4)           active      link, position of the first change; changes
ITEMS (5)          active      link; changes (catch-up, no position)
CATCHUP_END (6)    active      link, position
CAUGHT_UP (7)      passive     link, position
ACK (8)            passive     link, position, ITEMS applied
REFILL_ASK (9)     active      link, stream, first, last: records it lost
REFILL (10)        passive     link, stream, first, through; the records it
                               holds of first..through (rows), in order
=================  ==========  ============================================

Tests: ``tests/unit/test_protocol_pair.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from malamute_pack.protocol import zproto
from malamute_pack.protocol.chunks import decode_frames, encode_frames
from malamute_pack.protocol.errors import Malformed
from malamute_pack.protocol.records import (
    ConsumerPosition,
    QueuedRecord,
    RetentionPolicy,
    StreamRow,
)
from malamute_pack.protocol.rowblock import decode_rows, encode_rows

SIGNATURE: Final = b"MP"
# The link's version: brokers of a pair must speak the same one.
VERSION: Final = 8

# Catch-up modes: what the passive keeps of its own journal.
INCREMENTAL: Final = 0  # it follows this history: keep it all
TRUNCATE: Final = 1  # it led the history before: cut back to the takeover point
FULL: Final = 2  # unrelated: keep nothing, copy everything


class MalformedPairMessage(Malformed):
    """Bytes from the pair link that are not a message of this codec."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    role: str  # "primary" or "backup"
    state: str  # "starting", "active" or "passive"
    in_sync: bool
    incarnation: str
    epoch: str
    link: int = 0  # the active's current replication link (0: none)
    leads: bool = False  # its journal leads the history the pair last served
    # The history its active took over from ("" for none): of two actives,
    # the one whose previous is the other's epoch is the newer.
    previous: str = ""
    # The identity the pair shows other brokers (a pack): the primary's,
    # which the backup learns from it (32 hex digits; "" for none yet).
    pack_id: str = ""
    # A journal that lost records to damage (salvaged) and so claims no
    # history: the highest stream number and letter id it may have given
    # (0 for none), which the broker that serves numbers past.
    ceiling: int = 0
    letter_ceiling: int = 0


@dataclass(frozen=True, slots=True)
class Hello:
    incarnation: str
    epoch: str
    last_id: int
    streams: dict[str, int]
    letters: list[int]


@dataclass(frozen=True, slots=True)
class CatchupBegin:
    link: int
    base: int
    mode: int
    epoch: str
    truncate: dict[str, int]
    truncate_id: int
    counters: dict[str, int]
    last_id: int
    delete: list[int] = field(default_factory=list)
    # Per stream, the first sequence number the active retains: the
    # passive keeps nothing before it (deleted or pruned there meanwhile).
    firsts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ship:
    link: int
    first: int
    changes: list[Change]


@dataclass(frozen=True, slots=True)
class Items:
    link: int
    changes: list[Change]


@dataclass(frozen=True, slots=True)
class CatchupEnd:
    link: int
    position: int


@dataclass(frozen=True, slots=True)
class CaughtUp:
    link: int
    position: int


@dataclass(frozen=True, slots=True)
class Ack:
    link: int
    position: int
    items: int = 0  # catch-up ITEMS applied on this link


@dataclass(frozen=True, slots=True)
class RefillAsk:
    """The active's journal lost records C{first}..C{last} of C{stream}: send those held."""

    link: int
    stream: str
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Refill:
    """
    The records of C{stream} from C{first} to C{through} the passive holds
    (C{changes}: stream rows, in order; the others there it lacks too).
    """

    link: int
    stream: str
    first: int
    through: int
    changes: list[Change]


@dataclass(frozen=True, slots=True)
class Removed:
    """A letter removed (its recipient is done with it)."""

    record_id: int


@dataclass(frozen=True, slots=True)
class Appended:
    """An idempotent append: its records, its key, the keys it forgets."""

    rows: list[StreamRow]
    key: tuple[str, str, int, int, float]
    forget: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class AppendKey:
    """An append's key alone (catch-up: its records travel as rows)."""

    key: tuple[str, str, int, int, float]


@dataclass(frozen=True, slots=True)
class OwnerClaimed:
    """C{user} owns C{address} since C{claimed} (replacing another owner)."""

    address: str
    user: str
    claimed: float


@dataclass(frozen=True, slots=True)
class OwnersPage:
    """
    Catch-up: the active's owners of the addresses after C{after} (None:
    from the first) up to the last one of C{claims}, or to the end of the
    table if C{final}. The passive keeps no other owner in that range.
    """

    after: str | None
    final: bool
    claims: list[OwnerClaimed]


@dataclass(frozen=True, slots=True)
class StreamDeleted:
    """An operator deleted C{stream}'s records up to C{through}."""

    stream: str
    through: int


@dataclass(frozen=True, slots=True)
class Retention:
    """The retention in force: the default and each stream's own."""

    default: RetentionPolicy
    streams: dict[str, RetentionPolicy]


@dataclass(frozen=True, slots=True)
class Compaction:
    """
    The last-value streams (compacted by subject) from here on: exactly
    C{streams}; with C{rebuild} (a catch-up), each rebuilds its last values
    from the records it retains.
    """

    streams: list[str]
    rebuild: bool = False


@dataclass(frozen=True, slots=True)
class ConsumerChanged:
    """A consumer's position kept (or, with C{forget}, deleted): C{position}."""

    position: ConsumerPosition
    forget: bool = False


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """
    The clients' security in force on the active: the PLAIN passwords
    (user to password; None: no PLAIN endpoint), the CURVE clients (public
    key in Z85 to user; None: no CURVE endpoint) and the access rules
    (right to user to globs). Its repr leaves the passwords out.
    """

    passwords: dict[str, str] | None = field(repr=False)
    curve_keys: dict[bytes, str] | None
    rules: dict[str, dict[str, list[str]]]


@dataclass(frozen=True, slots=True)
class Unwritten:
    """
    What the active shipped and then failed to write itself (a full disk):
    the passive removes it too, so that it never serves what the active
    never had (its writer's retry comes again at new numbers). C{rows}:
    per stream, ranges (first, last) of records; C{keys}: append keys
    (stream, key, first sequence number); C{letters}: letter ids.
    """

    rows: list[tuple[str, int, int]]
    keys: list[tuple[str, str, int]]
    letters: list[int]


Change: TypeAlias = (
    StreamRow
    | QueuedRecord
    | Removed
    | Appended
    | AppendKey
    | OwnerClaimed
    | OwnersPage
    | StreamDeleted
    | Retention
    | ClientSecurity
    | ConsumerChanged
    | Compaction
    | Unwritten
)
PairMessage: TypeAlias = (
    Heartbeat
    | Hello
    | CatchupBegin
    | Ship
    | Items
    | CatchupEnd
    | CaughtUp
    | Ack
    | RefillAsk
    | Refill
)

_HEARTBEAT, _HELLO, _BEGIN, _SHIP, _ITEMS, _END, _CAUGHT_UP, _ACK, _ASK, _REFILL = range(1, 11)
_ROW, _LETTER, _REMOVED, _APPENDED, _KEY = b"RQDAK"
_OWNER, _OWNERS, _DELETED, _RETENTION, _SECURITY = b"OPXTS"
_CONSUMER = ord("C")
_COMPACTION = ord("L")
_UNWRITTEN = ord("U")

# Field kinds beyond zproto's own: a string here has a 4-byte length.
_TEXT: Final = zproto.LONGSTR
_COUNTS: Final = zproto.ListOf(zproto.Tuple(_TEXT, zproto.NUMBER8), dict)
_APPEND_KEY: Final = zproto.Tuple(_TEXT, _TEXT, zproto.NUMBER8, zproto.NUMBER8, zproto.REAL8)
_CLAIM: Final = (("address", _TEXT), ("user", _TEXT), ("claimed", zproto.REAL8))
# A retention policy: which limits it has (bits 0, 1, 2: count, age, bytes),
# then each (0 for none).
_POLICY: Final = zproto.Record(
    RetentionPolicy,
    (
        ("", zproto.Flags("max_count", "max_age_s", "max_bytes")),
        ("max_count", zproto.Optional(zproto.NUMBER8, absent=0)),
        ("max_age_s", zproto.Optional(zproto.REAL8, absent=0.0)),
        ("max_bytes", zproto.Optional(zproto.NUMBER8, absent=0)),
    ),
)
_TEXTS: Final = zproto.ListOf(zproto.Tuple(_TEXT, _TEXT), dict)

# A stream record, the hot path of replication: its fixed fields, its
# texts, then its content BLOB to the end of the frame.
_ROW_SPEC: Final = zproto.Spec(
    _ROW,
    "ROW",
    tuple,
    (
        ("seq", zproto.NUMBER8),
        ("timestamp", zproto.REAL8),
        ("origin_seq", zproto.NUMBER8),
        ("size", zproto.NUMBER8),
        ("stream", _TEXT),
        ("sender", _TEXT),
        ("subject", _TEXT),
        ("origin", _TEXT),
        ("blob", zproto.Rest(size="size")),
    ),
    arguments=(
        "stream", "seq", "timestamp", "sender", "subject", "blob", "size", "origin", "origin_seq"
    ),
)  # fmt: skip
_CHANGE_WORDING: Final = zproto.Wording(
    too_short="an empty change", unknown_id="unknown change kind {id}"
)
# The records an append holds: a block packed by column, to the end of
# the frame (neither end runs Python code per record).
_ROW_BLOCK: Final = zproto.Rest(encode_rows, decode_rows)

_CHANGES: Final[zproto.Codec[Change]] = zproto.Codec(
    [
        _ROW_SPEC,
        zproto.Spec(
            _LETTER,
            "LETTER",
            QueuedRecord,
            (
                ("id", zproto.NUMBER8),
                ("deadline", zproto.OPTIONAL_REAL8),
                ("created", zproto.REAL8),
                ("relay_id", zproto.NUMBER8),
                ("kind", _TEXT),
                ("address", _TEXT),
                ("sender", _TEXT),
                ("subject", _TEXT),
                ("tracker", _TEXT),
                ("relay_origin", _TEXT),
                ("content", zproto.Rest(encode_frames, decode_frames)),
            ),
        ),
        zproto.Spec(_REMOVED, "REMOVED", Removed, (("record_id", zproto.NUMBER8),)),
        zproto.Spec(
            _APPENDED,
            "APPENDED",
            Appended,
            (
                ("key", _APPEND_KEY),
                ("forget", zproto.ListOf(zproto.Tuple(_TEXT, _TEXT), list)),
                ("rows", _ROW_BLOCK),
            ),
        ),
        zproto.Spec(_KEY, "APPEND_KEY", AppendKey, (("key", _APPEND_KEY),)),
        zproto.Spec(_OWNER, "OWNER", OwnerClaimed, _CLAIM),
        zproto.Spec(
            _OWNERS,
            "OWNERS",
            OwnersPage,
            (
                ("", zproto.Flags("after", "final")),
                ("after", zproto.Optional(_TEXT)),
                ("claims", zproto.ListOf(zproto.Record(OwnerClaimed, _CLAIM), list)),
            ),
        ),
        zproto.Spec(
            _DELETED,
            "STREAM_DELETED",
            StreamDeleted,
            (("stream", _TEXT), ("through", zproto.NUMBER8)),
        ),
        zproto.Spec(
            _RETENTION,
            "RETENTION",
            Retention,
            (("default", _POLICY), ("streams", zproto.ListOf(zproto.Tuple(_TEXT, _POLICY), dict))),
        ),
        zproto.Spec(
            _CONSUMER,
            "CONSUMER",
            ConsumerChanged,
            (
                ("forget", zproto.BOOL),
                (
                    "position",
                    zproto.Record(
                        ConsumerPosition,
                        (
                            ("stream", _TEXT),
                            ("kind", _TEXT),
                            ("name", _TEXT),
                            ("seq", zproto.NUMBER8),
                            ("acked", zproto.CHUNK),
                            ("updated", zproto.REAL8),
                            ("owner", _TEXT),
                        ),
                    ),
                ),
            ),
        ),
        zproto.Spec(
            _COMPACTION,
            "COMPACTION",
            Compaction,
            (("rebuild", zproto.BOOL), ("streams", zproto.ListOf(_TEXT, list))),
        ),
        zproto.Spec(
            _UNWRITTEN,
            "UNWRITTEN",
            Unwritten,
            (
                ("rows", zproto.ListOf(zproto.Tuple(_TEXT, zproto.NUMBER8, zproto.NUMBER8), list)),
                ("keys", zproto.ListOf(zproto.Tuple(_TEXT, _TEXT, zproto.NUMBER8), list)),
                ("letters", zproto.ListOf(zproto.NUMBER8, list)),
            ),
        ),
        zproto.Spec(
            _SECURITY,
            "SECURITY",
            ClientSecurity,
            (
                ("", zproto.Flags("passwords", "curve_keys")),
                ("passwords", zproto.Optional(_TEXTS)),
                (
                    "curve_keys",
                    zproto.Optional(zproto.ListOf(zproto.Tuple(zproto.CHUNK, _TEXT), dict)),
                ),
                (
                    "rules",
                    zproto.ListOf(
                        zproto.Tuple(
                            _TEXT,
                            zproto.ListOf(zproto.Tuple(_TEXT, zproto.ListOf(_TEXT, list)), dict),
                        ),
                        dict,
                    ),
                ),
            ),
        ),
    ],
    signature=b"",
    error=MalformedPairMessage,
    wording=_CHANGE_WORDING,
)

_LINK: Final = (("link", zproto.NUMBER8),)
_POSITION: Final = (*_LINK, ("position", zproto.NUMBER8))
_CHANGE_FRAMES: Final = zproto.Each(_CHANGES)

_CODEC: Final[zproto.Codec[PairMessage]] = zproto.Codec(
    [
        zproto.Spec(
            _HEARTBEAT,
            "HEARTBEAT",
            Heartbeat,
            (
                ("role", _TEXT),
                ("state", _TEXT),
                ("in_sync", zproto.BOOL),
                ("incarnation", _TEXT),
                ("epoch", _TEXT),
                ("link", zproto.NUMBER8),
                ("leads", zproto.BOOL),
                ("previous", _TEXT),
                ("pack_id", _TEXT),
                ("ceiling", zproto.NUMBER8),
                ("letter_ceiling", zproto.NUMBER8),
            ),
        ),
        zproto.Spec(
            _HELLO,
            "HELLO",
            Hello,
            (
                ("incarnation", _TEXT),
                ("epoch", _TEXT),
                ("last_id", zproto.NUMBER8),
                ("streams", _COUNTS),
            ),
            ("letters", zproto.Ids()),
        ),
        zproto.Spec(
            _BEGIN,
            "CATCHUP_BEGIN",
            CatchupBegin,
            (
                *_LINK,
                ("base", zproto.NUMBER8),
                ("mode", zproto.Number(zproto.NUMBER1, allowed=(INCREMENTAL, TRUNCATE, FULL))),
                ("epoch", _TEXT),
                ("truncate", _COUNTS),
                ("truncate_id", zproto.NUMBER8),
                ("counters", _COUNTS),
                ("last_id", zproto.NUMBER8),
                ("firsts", _COUNTS),
            ),
            ("delete", zproto.Ids()),
        ),
        zproto.Spec(
            _SHIP,
            "SHIP",
            Ship,
            (*_LINK, ("first", zproto.NUMBER8)),
            ("changes", _CHANGE_FRAMES),
        ),
        zproto.Spec(_ITEMS, "ITEMS", Items, _LINK, ("changes", _CHANGE_FRAMES)),
        zproto.Spec(_END, "CATCHUP_END", CatchupEnd, _POSITION),
        zproto.Spec(_CAUGHT_UP, "CAUGHT_UP", CaughtUp, _POSITION),
        zproto.Spec(_ACK, "ACK", Ack, (*_POSITION, ("items", zproto.NUMBER8))),
        zproto.Spec(
            _ASK,
            "REFILL_ASK",
            RefillAsk,
            (*_LINK, ("stream", _TEXT), ("first", zproto.NUMBER8), ("last", zproto.NUMBER8)),
        ),
        zproto.Spec(
            _REFILL,
            "REFILL",
            Refill,
            (*_LINK, ("stream", _TEXT), ("first", zproto.NUMBER8), ("through", zproto.NUMBER8)),
            ("changes", _CHANGE_FRAMES),
        ),
    ],
    signature=SIGNATURE,
    version=VERSION,
    version_first=True,
    error=MalformedPairMessage,
    wording=zproto.Wording(
        no_frames="not a pair link message (no signature)",
        too_short="not a pair link message (no signature)",
        signature="not a pair link message (no signature)",
        version=(
            "the partner speaks pair link version {version}, this broker {expected}:"
            " run the same malamute_pack on both"
        ),
        unknown_id="unknown pair command {id}",
    ),
)

# encode_change(change): one journal change as a frame (TypeError for
# anything else).
encode_change: Final[Callable[[Change], bytes]] = _CHANGES.encode_header

# decode_change(frame): the journal change a frame of encode_change holds.
decode_change: Final[Callable[[bytes], Change]] = _CHANGES.decode_frame

# encode(message): the frames of message.
encode: Final[Callable[[PairMessage], list[bytes]]] = _CODEC.encode

# decode(frames): the message frames hold; raises MalformedPairMessage.
decode: Final[Callable[[Sequence[bytes]], PairMessage]] = _CODEC.decode
