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
(P, catch-up), an operator's stream delete (X) and retention (T), and the
clients' security state (S: passwords, CURVE keys, access rules; never
written to the passive's disk). Integers are big-endian; a string is a
4-byte length and UTF-8; a float is an IEEE double. Anything that does not
decode raises :class:`MalformedPairMessage`.

Version 2 (this one) added the kinds O, P, X, T and S and CATCHUP_BEGIN's
first retained sequence numbers; version 1 brokers cannot pair with it.

=================  ==========  ============================================
command            direction   fields / frames
=================  ==========  ============================================
HEARTBEAT (1)      both        role, state, in_sync, incarnation, epoch, link,
                               leads
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
=================  ==========  ============================================

Tests: ``tests/unit/test_protocol_pair.py``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from malamute_pack.broker.store import QueuedRecord
from malamute_pack.journal.records import StreamRow, decode_frames, encode_frames
from malamute_pack.journal.retention import RetentionPolicy

SIGNATURE: Final = b"MP"
# The link's version: brokers of a pair must speak the same one.
VERSION: Final = 2

# Catch-up modes: what the passive keeps of its own journal.
INCREMENTAL: Final = 0  # it follows this history: keep it all
TRUNCATE: Final = 1  # it led the history before: cut back to the takeover point
FULL: Final = 2  # unrelated: keep nothing, copy everything


class MalformedPairMessage(ValueError):
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
)
PairMessage: TypeAlias = (
    Heartbeat | Hello | CatchupBegin | Ship | Items | CatchupEnd | CaughtUp | Ack
)

_HEARTBEAT, _HELLO, _BEGIN, _SHIP, _ITEMS, _END, _CAUGHT_UP, _ACK = range(1, 9)
_ROW, _LETTER, _REMOVED, _APPENDED, _KEY = b"RQDAK"
_OWNER, _OWNERS, _DELETED, _RETENTION, _SECURITY = b"OPXTS"

_U8: Final = struct.Struct(">B")
_U32: Final = struct.Struct(">I")
_U64: Final = struct.Struct(">Q")
_F64: Final = struct.Struct(">d")
_ROW_FIXED: Final = struct.Struct(">QdQQ")  # seq, ts, origin_seq, bytes
_ROW_HEAD: Final = b"R"
_LETTER_FIXED: Final = struct.Struct(">QddQ")  # id, deadline, created, relay_id
# A retention policy: which limits it has (bits 0, 1, 2: count, age, bytes), then each.
_POLICY: Final = struct.Struct(">BQdQ")


class _Writer:
    """Builds one frame."""

    __slots__ = ("parts",)

    def __init__(self, head: bytes = b"") -> None:
        self.parts: list[bytes] = [head] if head else []

    def u8(self, value: int) -> _Writer:
        self.parts.append(_U8.pack(value))
        return self

    def u64(self, value: int) -> _Writer:
        self.parts.append(_U64.pack(value))
        return self

    def string(self, value: str) -> _Writer:
        data = value.encode("utf-8", "surrogateescape")
        self.parts.append(_U32.pack(len(data)))
        self.parts.append(data)
        return self

    def blob(self, value: bytes) -> _Writer:
        self.parts.append(_U32.pack(len(value)))
        self.parts.append(value)
        return self

    def u32(self, value: int) -> _Writer:
        self.parts.append(_U32.pack(value))
        return self

    def f64(self, value: float) -> _Writer:
        self.parts.append(_F64.pack(value))
        return self

    def counts(self, values: dict[str, int]) -> _Writer:
        self.parts.append(_U32.pack(len(values)))
        for name, value in values.items():
            self.string(name)
            self.u64(value)
        return self

    def frame(self) -> bytes:
        return b"".join(self.parts)


class _Reader:
    """Reads one frame; every shortfall is a MalformedPairMessage."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data = data
        self.at = at

    def _take(self, size: int) -> bytes:
        end = self.at + size
        if end > len(self.data):
            raise MalformedPairMessage("a frame ends too soon")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def u8(self) -> int:
        return int(_U8.unpack(self._take(1))[0])

    def u32(self) -> int:
        return int(_U32.unpack(self._take(4))[0])

    def u64(self) -> int:
        return int(_U64.unpack(self._take(8))[0])

    def f64(self) -> float:
        return float(_F64.unpack(self._take(8))[0])

    def string(self) -> str:
        size = self.u32()
        try:
            return self._take(size).decode("utf-8", "surrogateescape")
        except UnicodeDecodeError as e:  # pragma: no cover - surrogateescape takes any bytes
            raise MalformedPairMessage(str(e)) from e

    def blob(self) -> bytes:
        return self._take(self.u32())

    def counts(self) -> dict[str, int]:
        return {self.string(): self.u64() for _ in range(self._count(12))}

    def _count(self, least_each: int) -> int:
        """A count of items of at least C{least_each} bytes each, checked against the frame."""
        count = self.u32()
        if count * least_each > len(self.data) - self.at:
            raise MalformedPairMessage("a count larger than its frame")
        return count

    def rest(self) -> bytes:
        chunk = self.data[self.at :]
        self.at = len(self.data)
        return chunk

    def end(self) -> None:
        if self.at != len(self.data):
            raise MalformedPairMessage("trailing bytes in a frame")


def _ids(values: Sequence[int]) -> bytes:
    return struct.pack(f">{len(values)}Q", *values)


def _read_ids(frame: bytes) -> list[int]:
    if len(frame) % 8:
        raise MalformedPairMessage("a list of ids whose length is not a multiple of 8")
    return list(struct.unpack(f">{len(frame) // 8}Q", frame))


def _head(command: int) -> _Writer:
    return _Writer(SIGNATURE + bytes((VERSION, command)))


def encode_change(change: Change) -> bytes:
    """One journal change as a frame."""
    if type(change) is tuple:
        return _encode_row(change)
    if isinstance(change, QueuedRecord):
        w = _Writer(bytes((_LETTER,)))
        w.parts.append(
            _LETTER_FIXED.pack(
                change.id,
                math.nan if change.deadline is None else change.deadline,
                change.created,
                change.relay_id,
            )
        )
        for text in (
            change.kind,
            change.address,
            change.sender,
            change.subject,
            change.tracker,
            change.relay_origin,
        ):
            w.string(text)
        w.parts.append(encode_frames(change.content))
        return w.frame()
    if isinstance(change, Removed):
        return bytes((_REMOVED,)) + _U64.pack(change.record_id)
    if isinstance(change, Appended):
        w = _Writer(bytes((_APPENDED,)))
        _key(w, change.key)
        w.parts.append(_U32.pack(len(change.forget)))
        for stream, key in change.forget:
            w.string(stream).string(key)
        w.parts.append(_U32.pack(len(change.rows)))
        for row in change.rows:
            encoded = _encode_row(row)
            w.parts.append(_U32.pack(len(encoded)))
            w.parts.append(encoded)
        return w.frame()
    if isinstance(change, AppendKey):
        w = _Writer(bytes((_KEY,)))
        _key(w, change.key)
        return w.frame()
    if isinstance(change, OwnerClaimed):
        w = _Writer(bytes((_OWNER,)))
        return w.string(change.address).string(change.user).f64(change.claimed).frame()
    if isinstance(change, OwnersPage):
        w = _Writer(bytes((_OWNERS,)))
        w.u8((change.after is not None) | change.final << 1)
        if change.after is not None:
            w.string(change.after)
        w.u32(len(change.claims))
        for claim in change.claims:
            w.string(claim.address).string(claim.user).f64(claim.claimed)
        return w.frame()
    if isinstance(change, StreamDeleted):
        return _Writer(bytes((_DELETED,))).string(change.stream).u64(change.through).frame()
    if isinstance(change, Retention):
        w = _Writer(bytes((_RETENTION,)))
        _policy(w, change.default)
        w.u32(len(change.streams))
        for stream, policy in change.streams.items():
            _policy(w.string(stream), policy)
        return w.frame()
    if isinstance(change, ClientSecurity):
        w = _Writer(bytes((_SECURITY,)))
        w.u8((change.passwords is not None) | (change.curve_keys is not None) << 1)
        if change.passwords is not None:
            w.u32(len(change.passwords))
            for user, password in change.passwords.items():
                w.string(user).string(password)
        if change.curve_keys is not None:
            w.u32(len(change.curve_keys))
            for public, user in change.curve_keys.items():
                w.blob(public).string(user)
        w.u32(len(change.rules))
        for right, by_user in change.rules.items():
            w.string(right).u32(len(by_user))
            for user, globs in by_user.items():
                w.string(user).u32(len(globs))
                for glob in globs:
                    w.string(glob)
        return w.frame()
    # The message names the kind only: a change may hold passwords.
    raise TypeError(f"not a journal change: {type(change).__name__}")


def _policy(w: _Writer, policy: RetentionPolicy) -> None:
    count, age, size = policy.max_count, policy.max_age_s, policy.max_bytes
    flags = (count is not None) | (age is not None) << 1 | (size is not None) << 2
    w.parts.append(_POLICY.pack(flags, count or 0, age or 0.0, size or 0))


def _read_policy(r: _Reader) -> RetentionPolicy:
    flags, count, age, size = _POLICY.unpack(r._take(_POLICY.size))
    if flags > 7:
        raise MalformedPairMessage(f"a retention policy's flags are {flags}")
    return RetentionPolicy(
        count if flags & 1 else None, age if flags & 2 else None, size if flags & 4 else None
    )


def _read_claim(r: _Reader) -> OwnerClaimed:
    return OwnerClaimed(r.string(), r.string(), r.f64())


def _encode_row(row: StreamRow) -> bytes:
    # The hot path of replication (every stream record): no writer object.
    stream, seq, ts, sender, subject, blob, size, origin, origin_seq = row
    texts = [t.encode("utf-8", "surrogateescape") for t in (stream, sender, subject, origin)]
    return b"".join(
        (
            _ROW_HEAD,
            _ROW_FIXED.pack(seq, ts, origin_seq, size),
            _U32.pack(len(texts[0])),
            texts[0],
            _U32.pack(len(texts[1])),
            texts[1],
            _U32.pack(len(texts[2])),
            texts[2],
            _U32.pack(len(texts[3])),
            texts[3],
            blob,
        )
    )


def _key(w: _Writer, key: tuple[str, str, int, int, float]) -> None:
    stream, name, first, last, created = key
    w.string(stream).string(name).u64(first).u64(last)
    w.parts.append(_F64.pack(created))


def _read_key(r: _Reader) -> tuple[str, str, int, int, float]:
    return (r.string(), r.string(), r.u64(), r.u64(), r.f64())


def decode_change(frame: bytes) -> Change:
    """The journal change a frame of L{encode_change} holds."""
    if not frame:
        raise MalformedPairMessage("an empty change")
    kind = frame[0]
    r = _Reader(frame, 1)
    if kind == _ROW:
        return _decode_row(r)
    if kind == _LETTER:
        rid, deadline, created, relay_id = _LETTER_FIXED.unpack(r._take(_LETTER_FIXED.size))
        kind_name, address, sender, subject, tracker, relay_origin = (r.string() for _ in range(6))
        try:
            content = decode_frames(r.rest())
        except ValueError as e:
            raise MalformedPairMessage(f"a letter's content: {e}") from e
        return QueuedRecord(
            rid,
            kind_name,
            address,
            sender,
            subject,
            tracker,
            None if math.isnan(deadline) else deadline,
            created,
            content,
            relay_origin,
            relay_id,
        )
    if kind == _REMOVED:
        rid = r.u64()
        r.end()
        return Removed(rid)
    if kind == _APPENDED:
        key = _read_key(r)
        forget = [(r.string(), r.string()) for _ in range(r._count(8))]
        rows: list[StreamRow] = []
        for _ in range(r._count(4)):
            size = r.u32()
            end = r.at + size
            if end > len(r.data) or size < 1 or r.data[r.at] != _ROW:
                raise MalformedPairMessage("an append holds something other than whole records")
            r.at += 1
            rows.append(_decode_row(r, end))
        r.end()
        return Appended(rows, key, forget)
    if kind == _KEY:
        key = _read_key(r)
        r.end()
        return AppendKey(key)
    change: Change
    if kind == _OWNER:
        change = _read_claim(r)
    elif kind == _OWNERS:
        flags = r.u8()
        if flags > 3:
            raise MalformedPairMessage(f"an owners page's flags are {flags}")
        after = r.string() if flags & 1 else None
        claims = [_read_claim(r) for _ in range(r._count(16))]
        change = OwnersPage(after, bool(flags & 2), claims)
    elif kind == _DELETED:
        change = StreamDeleted(r.string(), r.u64())
    elif kind == _RETENTION:
        default = _read_policy(r)
        change = Retention(
            default, {r.string(): _read_policy(r) for _ in range(r._count(4 + _POLICY.size))}
        )
    elif kind == _SECURITY:
        change = _read_security(r)
    else:
        raise MalformedPairMessage(f"unknown change kind {kind}")
    r.end()
    return change


def _read_security(r: _Reader) -> ClientSecurity:
    flags = r.u8()
    if flags > 3:
        raise MalformedPairMessage(f"a security state's flags are {flags}")
    passwords = {r.string(): r.string() for _ in range(r._count(8))} if flags & 1 else None
    keys = {r.blob(): r.string() for _ in range(r._count(8))} if flags & 2 else None
    rules: dict[str, dict[str, list[str]]] = {}
    for _ in range(r._count(8)):
        right = r.string()
        by_user = rules.setdefault(right, {})
        for _ in range(r._count(8)):
            user = r.string()
            by_user[user] = [r.string() for _ in range(r._count(4))]
    return ClientSecurity(passwords, keys, rules)


def _decode_row(r: _Reader, end: int | None = None) -> StreamRow:
    """A record from C{r}, its content running to C{end} (the frame's end by default)."""
    # The hot path of applying replication: offsets, not reader calls.
    data, at = r.data, r.at
    stop = len(data) if end is None else end
    try:
        seq, ts, origin_seq, size = _ROW_FIXED.unpack_from(data, at)
        at += _ROW_FIXED.size
        texts = []
        for _ in range(4):
            (length,) = _U32.unpack_from(data, at)
            at += 4
            if at + length > stop:
                raise MalformedPairMessage("a frame ends too soon")
            texts.append(data[at : at + length].decode("utf-8", "surrogateescape"))
            at += length
    except struct.error as e:
        raise MalformedPairMessage("a frame ends too soon") from e
    if at > stop:
        raise MalformedPairMessage("a frame ends too soon")
    blob = data[at:stop]
    r.at = stop
    if len(blob) != size:
        raise MalformedPairMessage("a record's size is not its content's")
    return (texts[0], seq, ts, texts[1], texts[2], blob, size, texts[3], origin_seq)


def encode(message: PairMessage) -> list[bytes]:
    """The frames of C{message}."""
    if isinstance(message, Heartbeat):
        w = _head(_HEARTBEAT).string(message.role).string(message.state)
        w.u8(1 if message.in_sync else 0).string(message.incarnation).string(message.epoch)
        return [w.u64(message.link).u8(1 if message.leads else 0).frame()]
    if isinstance(message, Hello):
        w = _head(_HELLO).string(message.incarnation).string(message.epoch)
        w.u64(message.last_id).counts(message.streams)
        return [w.frame(), _ids(message.letters)]
    if isinstance(message, CatchupBegin):
        w = _head(_BEGIN).u64(message.link).u64(message.base).u8(message.mode)
        w.string(message.epoch).counts(message.truncate).u64(message.truncate_id)
        w.counts(message.counters).u64(message.last_id).counts(message.firsts)
        return [w.frame(), _ids(message.delete)]
    if isinstance(message, Ship):
        head = _head(_SHIP).u64(message.link).u64(message.first).frame()
        return [head, *map(encode_change, message.changes)]
    if isinstance(message, Items):
        head = _head(_ITEMS).u64(message.link).frame()
        return [head, *map(encode_change, message.changes)]
    if isinstance(message, Ack):
        return [_head(_ACK).u64(message.link).u64(message.position).u64(message.items).frame()]
    command = _END if isinstance(message, CatchupEnd) else _CAUGHT_UP
    return [_head(command).u64(message.link).u64(message.position).frame()]


def decode(frames: Sequence[bytes]) -> PairMessage:
    """The message C{frames} hold; raises L{MalformedPairMessage}."""
    if not frames or len(frames[0]) < 4 or frames[0][:2] != SIGNATURE:
        raise MalformedPairMessage("not a pair link message (no signature)")
    if frames[0][2] != VERSION:
        raise MalformedPairMessage(
            f"the partner speaks pair link version {frames[0][2]}, this broker {VERSION}:"
            " run the same malamute_pack on both"
        )
    command = frames[0][3]
    r = _Reader(frames[0], 4)
    message: PairMessage
    extra = 0
    if command == _HEARTBEAT:
        role, state = r.string(), r.string()
        flag, incarnation, epoch = r.u8(), r.string(), r.string()
        if flag > 1:
            raise MalformedPairMessage(f"a heartbeat's in-sync flag is {flag}, not 0 or 1")
        in_sync = flag == 1
        link, leads = r.u64(), r.u8()
        if leads > 1:
            raise MalformedPairMessage(f"a heartbeat's leads flag is {leads}, not 0 or 1")
        message = Heartbeat(role, state, in_sync, incarnation, epoch, link, leads == 1)
    elif command == _HELLO:
        incarnation, epoch, last_id = r.string(), r.string(), r.u64()
        streams = r.counts()
        if len(frames) != 2:
            raise MalformedPairMessage("HELLO without its list of letters")
        message = Hello(incarnation, epoch, last_id, streams, _read_ids(frames[1]))
        extra = 1
    elif command == _BEGIN:
        link, base, mode, epoch = r.u64(), r.u64(), r.u8(), r.string()
        truncate, truncate_id = r.counts(), r.u64()
        counters, last_id, firsts = r.counts(), r.u64(), r.counts()
        if len(frames) != 2 or mode not in (INCREMENTAL, TRUNCATE, FULL):
            raise MalformedPairMessage("a malformed CATCHUP_BEGIN")
        message = CatchupBegin(
            link, base, mode, epoch, truncate, truncate_id, counters, last_id,
            _read_ids(frames[1]), firsts,
        )  # fmt: skip
        extra = 1
    elif command == _SHIP:
        link, first = r.u64(), r.u64()
        message = Ship(link, first, [decode_change(f) for f in frames[1:]])
        extra = len(frames) - 1
    elif command == _ITEMS:
        message = Items(r.u64(), [decode_change(f) for f in frames[1:]])
        extra = len(frames) - 1
    elif command == _ACK:
        message = Ack(r.u64(), r.u64(), r.u64())
    elif command in (_END, _CAUGHT_UP):
        kind = CatchupEnd if command == _END else CaughtUp
        message = kind(r.u64(), r.u64())
    else:
        raise MalformedPairMessage(f"unknown pair command {command}")
    r.end()
    if len(frames) != 1 + extra:
        raise MalformedPairMessage("unexpected frames after the message")
    return message
