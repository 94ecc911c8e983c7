"""
Tests for L{malamute_pack.protocol.pair}: every message type and every kind
of journal change round-trips, the header layout is the documented one,
every kind of malformed input raises L{MalformedPairMessage}, and properties:
arbitrary valid messages (any strings, including non-UTF-8 text carried as
surrogate escapes, any sizes and ids) round-trip, and arbitrary or mutated
frames decode to a message or raise L{MalformedPairMessage} only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.journal.records import stream_row
from malamute_pack.journal.retention import DEFAULT_RETENTION
from malamute_pack.protocol import pair
from malamute_pack.protocol.chunks import encode_frames
from malamute_pack.protocol.pair import (
    FULL,
    INCREMENTAL,
    SIGNATURE,
    TRUNCATE,
    VERSION,
    Ack,
    Appended,
    AppendKey,
    CatchupBegin,
    CatchupEnd,
    CaughtUp,
    Change,
    ClientSecurity,
    Compaction,
    ConsumerChanged,
    Heartbeat,
    Hello,
    Items,
    MalformedPairMessage,
    OwnerClaimed,
    OwnersPage,
    PairMessage,
    Refill,
    RefillAsk,
    Removed,
    Retention,
    Ship,
    StreamDeleted,
    Unwritten,
)
from malamute_pack.protocol.records import (
    ConsumerPosition,
    QueuedRecord,
    RetentionPolicy,
    StreamRow,
)
from malamute_pack.protocol.rowblock import encode_rows

U64_MAX = 2**64 - 1

# Text that is not UTF-8 on the wire: what decoding b"\xff\xfe" gives.
NOT_UTF8 = b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")

ROW: StreamRow = stream_row("weather", 7, 1700000000.25, "station-1", "temp.paris", [b"21.5"])
ROW_FROM_PEER: StreamRow = stream_row(
    "weather", U64_MAX, 0.0, NOT_UTF8, "", [b"", b"\x00" * 3], origin="pack-b", origin_seq=42
)
LETTER = QueuedRecord(
    12, "mailbox", "alice", "bob", "hello", "track-1", 1700000060.5, 1700000000.0, (b"hi",)
)
LETTER_NO_DEADLINE = QueuedRecord(
    U64_MAX, "service", "echo", NOT_UTF8, "", "", None, 0.0, (), "pack-b", 99
)
LETTER_MANY_FRAMES = QueuedRecord(
    3, "service", "echo", "c", "s", "", 5.0, 1.0, (b"", b"one", b"\x00" * 300)
)
REMOVED = Removed(U64_MAX)
KEY = ("weather", "batch-1", 7, 9, 1700000000.5)
APPENDED = Appended(
    [ROW, ROW_FROM_PEER], KEY, [("weather", "batch-0"), (NOT_UTF8, "")]
)  # fmt: skip
APPENDED_EMPTY = Appended([], ("", "", 0, 0, 0.0), [])
APPEND_KEY = AppendKey(KEY)
OWNER = OwnerClaimed("alice", "alice", 1700000000.5)
OWNER_ODD = OwnerClaimed(NOT_UTF8, "", 0.0)
OWNERS_FIRST = OwnersPage(None, False, [OWNER, OwnerClaimed("bob", "bob", 2.0)])
OWNERS_LAST = OwnersPage("bob", True, [OWNER_ODD])
OWNERS_EMPTY = OwnersPage(None, True, [])
DELETED = StreamDeleted("weather", 41)
DELETED_ODD = StreamDeleted(NOT_UTF8, U64_MAX)
RETENTION = Retention(
    DEFAULT_RETENTION,
    {"weather": RetentionPolicy(max_count=2), NOT_UTF8: RetentionPolicy(0, 0.0, 0)},
)
RETENTION_NONE = Retention(RetentionPolicy(), {})
SECURITY = ClientSecurity(
    {"alice": "wonderland", "bob": NOT_UTF8},
    {b"rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7": "alice"},
    {"write": {"alice": ["prices.*", "x"], "*": []}, "role": {"alice": ["admin"]}, "read": {}},
)
SECURITY_PLAIN_ONLY = ClientSecurity({}, None, {})
SECURITY_NONE = ClientSecurity(None, None, {})
CONSUMER = ConsumerChanged(ConsumerPosition("weather", "reader", "c1", 41, b"", 1.5))
CONSUMER_GONE = ConsumerChanged(
    ConsumerPosition(NOT_UTF8, "group", NOT_UTF8, U64_MAX, b"\x00" * 300, 0.0), forget=True
)
COMPACTION = Compaction(["ticks", NOT_UTF8])
COMPACTION_NONE = Compaction([], rebuild=True)
UNWRITTEN = Unwritten([("ticks", 3, 9), (NOT_UTF8, U64_MAX, U64_MAX)], [("ticks", "k", 3)], [7, 8])
UNWRITTEN_NONE = Unwritten([], [], [])

# One of each kind of change, in every variant named by the codec.
CHANGES: list[Change] = [
    ROW,
    ROW_FROM_PEER,
    LETTER,
    LETTER_NO_DEADLINE,
    LETTER_MANY_FRAMES,
    REMOVED,
    APPENDED,
    APPENDED_EMPTY,
    APPEND_KEY,
    OWNER,
    OWNER_ODD,
    OWNERS_FIRST,
    OWNERS_LAST,
    OWNERS_EMPTY,
    DELETED,
    DELETED_ODD,
    RETENTION,
    RETENTION_NONE,
    SECURITY,
    SECURITY_PLAIN_ONLY,
    SECURITY_NONE,
    CONSUMER,
    CONSUMER_GONE,
    COMPACTION,
    COMPACTION_NONE,
    UNWRITTEN,
    UNWRITTEN_NONE,
]

# One or more of each message type.
MESSAGES: list[PairMessage] = [
    Heartbeat("primary", "active", True, "inc-1", "epoch-1", 3),
    Heartbeat("backup", "starting", False, "", "", 0),
    Hello("inc-2", "epoch-1", 41, {"weather": 7, NOT_UTF8: U64_MAX}, [1, 2, U64_MAX]),
    Hello("", "", 0, {}, []),
    CatchupBegin(
        5, 100, TRUNCATE, "epoch-2", {"weather": 6}, 40, {"letters": 3, "s": 0}, 41, [9, 10]
    ),
    CatchupBegin(1, 0, INCREMENTAL, "", {}, 0, {}, 0),
    CatchupBegin(
        U64_MAX, U64_MAX, FULL, NOT_UTF8, {}, U64_MAX, {}, U64_MAX, [U64_MAX], {NOT_UTF8: 1}
    ),
    CatchupBegin(2, 9, INCREMENTAL, "e", {}, 0, {"s": 9, "t": 4}, 3, [], {"s": 10, "t": 2}),
    Ship(5, 101, list(CHANGES)),
    Ship(5, 0, []),
    Items(5, list(CHANGES)),
    Items(0, []),
    CatchupEnd(5, 110),
    CaughtUp(5, U64_MAX),
    Ack(5, 110, 12),
    Ack(0, 0),
    RefillAsk(5, "weather", 150, 1_000_149),
    Refill(5, "weather", 150, 1149, [ROW]),
    Refill(5, "weather", 1150, 1_000_149, []),
]

# Messages whose every frame is protected by lengths and counts: cutting
# any frame short anywhere must be caught. (A letter's content is the rest
# of its frame, and a list of ids is a whole frame: see the specific tests.)
TRUNCATABLE: list[PairMessage] = [
    message
    for message in MESSAGES
    if not isinstance(message, (Ship, Items))
    or not any(isinstance(c, QueuedRecord) and c.content for c in message.changes)
]
TRUNCATABLE += [
    Ship(5, 101, [c for c in CHANGES if not isinstance(c, QueuedRecord) or not c.content])
]


# Every kind byte of a change.
KINDS = [b"R", b"Q", b"D", b"A", b"K", b"O", b"P", b"X", b"T", b"S"]


def _frames_with_ids(message: PairMessage) -> bool:
    """Whether the second frame of C{message} is a list of ids (HELLO, CATCHUP_BEGIN)."""
    return isinstance(message, (Hello, CatchupBegin))


class ChangeRoundTripTests(SynchronousTestCase):
    """Every kind of journal change encodes to a frame that decodes back."""

    def assertRoundTrip(self, change: Change) -> None:
        self.assertEqual(pair.decode_change(pair.encode_change(change)), change)

    def test_streamRow(self) -> None:
        """A stream record written locally (no origin) round-trips as a row tuple."""
        self.assertRoundTrip(ROW)

    def test_streamRowFromPeer(self) -> None:
        """A stream record with an origin, an empty subject and several frames round-trips."""
        self.assertRoundTrip(ROW_FROM_PEER)

    def test_streamRowIsTuple(self) -> None:
        """A decoded row is a plain tuple of the nine StreamRow fields."""
        decoded = pair.decode_change(pair.encode_change(ROW))
        self.assertIs(type(decoded), tuple)
        self.assertEqual(len(decoded), 9)  # type: ignore[arg-type]

    def test_letterWithDeadline(self) -> None:
        """A letter with a deadline round-trips with the same deadline."""
        self.assertRoundTrip(LETTER)

    def test_letterWithoutDeadline(self) -> None:
        """A letter with no deadline (None) round-trips as None, with its relay fields."""
        decoded = pair.decode_change(pair.encode_change(LETTER_NO_DEADLINE))
        self.assertEqual(decoded, LETTER_NO_DEADLINE)
        assert isinstance(decoded, QueuedRecord)
        self.assertIsNone(decoded.deadline)

    def test_letterDeadlineZero(self) -> None:
        """A deadline of 0.0 stays 0.0, not None (only NaN on the wire means none)."""
        letter = QueuedRecord(1, "mailbox", "a", "b", "s", "", 0.0, 0.0, ())
        decoded = pair.decode_change(pair.encode_change(letter))
        assert isinstance(decoded, QueuedRecord)
        self.assertEqual(decoded.deadline, 0.0)

    def test_letterManyFrames(self) -> None:
        """A letter's content of several frames, empty ones included, round-trips."""
        self.assertRoundTrip(LETTER_MANY_FRAMES)

    def test_removed(self) -> None:
        """A removed letter's id (up to the largest u64) round-trips."""
        self.assertRoundTrip(REMOVED)
        self.assertRoundTrip(Removed(0))

    def test_appended(self) -> None:
        """An idempotent append with rows and keys to forget round-trips."""
        self.assertRoundTrip(APPENDED)

    def test_appendedEmpty(self) -> None:
        """An append with no rows and nothing to forget round-trips."""
        self.assertRoundTrip(APPENDED_EMPTY)

    def test_appendKey(self) -> None:
        """An append key alone round-trips."""
        self.assertRoundTrip(APPEND_KEY)

    def test_notAChange(self) -> None:
        """Encoding something that is not a journal change is a TypeError (a program error)."""
        self.assertRaises(TypeError, pair.encode_change, "row")

    def test_ownerClaimed(self) -> None:
        """An address's owner and when it was claimed round-trip, any text included."""
        self.assertRoundTrip(OWNER)
        self.assertRoundTrip(OWNER_ODD)

    def test_ownersPage(self) -> None:
        """
        A page of the owners table round-trips: the first (no lower bound),
        the last (to the end of the table), and an empty table's only page.
        """
        for page in (OWNERS_FIRST, OWNERS_LAST, OWNERS_EMPTY):
            self.assertRoundTrip(page)
        self.assertRoundTrip(OwnersPage("", False, []))

    def test_streamDeleted(self) -> None:
        """A stream delete (the stream and the last sequence number deleted) round-trips."""
        self.assertRoundTrip(DELETED)
        self.assertRoundTrip(DELETED_ODD)

    def test_retention(self) -> None:
        """
        Retention round-trips: the default and each stream's policy, each
        limit absent (None), zero or set.
        """
        self.assertRoundTrip(RETENTION)
        self.assertRoundTrip(RETENTION_NONE)
        decoded = pair.decode_change(pair.encode_change(RETENTION_NONE))
        assert isinstance(decoded, Retention)
        self.assertEqual(decoded.default, RetentionPolicy(None, None, None))

    def test_clientSecurity(self) -> None:
        """
        The clients' security round-trips: passwords, CURVE keys (bytes) and
        rules; no passwords or no keys (None) stay None, apart from empty ones.
        """
        self.assertRoundTrip(SECURITY)
        for state in (SECURITY_PLAIN_ONLY, SECURITY_NONE):
            decoded = pair.decode_change(pair.encode_change(state))
            assert isinstance(decoded, ClientSecurity)
            self.assertEqual(
                (decoded.passwords, decoded.curve_keys), (state.passwords, state.curve_keys)
            )

    def test_securityReprHasNoPasswords(self) -> None:
        """The clients' security state's repr (a log line, a failure) never shows a password."""
        self.assertNotIn("wonderland", repr(SECURITY))
        self.assertIn("alice", repr(SECURITY))


class MessageRoundTripTests(SynchronousTestCase):
    """Every message type encodes to frames that decode back."""

    def assertRoundTrip(self, message: PairMessage) -> None:
        self.assertEqual(pair.decode(pair.encode(message)), message)

    def test_heartbeat(self) -> None:
        """HEARTBEAT round-trips, in sync or not."""
        for message in MESSAGES:
            if isinstance(message, Heartbeat):
                self.assertRoundTrip(message)

    def test_hello(self) -> None:
        """HELLO round-trips with and without streams and letters, in two frames."""
        for message in MESSAGES:
            if isinstance(message, Hello):
                self.assertEqual(len(pair.encode(message)), 2)
                self.assertRoundTrip(message)

    def test_catchupBegin(self) -> None:
        """CATCHUP_BEGIN round-trips in each mode, with and without letters to delete."""
        modes = set()
        for message in MESSAGES:
            if isinstance(message, CatchupBegin):
                modes.add(message.mode)
                self.assertEqual(len(pair.encode(message)), 2)
                self.assertRoundTrip(message)
        self.assertEqual(modes, {INCREMENTAL, TRUNCATE, FULL})

    def test_ship(self) -> None:
        """SHIP round-trips with every kind of change (one frame each) and with none."""
        message = Ship(5, 101, list(CHANGES))
        self.assertEqual(len(pair.encode(message)), 1 + len(CHANGES))
        self.assertRoundTrip(message)
        self.assertRoundTrip(Ship(5, 0, []))

    def test_items(self) -> None:
        """ITEMS round-trips with every kind of change and with none."""
        self.assertRoundTrip(Items(5, list(CHANGES)))
        self.assertRoundTrip(Items(0, []))

    def test_catchupEnd(self) -> None:
        """CATCHUP_END round-trips."""
        self.assertRoundTrip(CatchupEnd(5, 110))

    def test_caughtUp(self) -> None:
        """CAUGHT_UP round-trips, and is not confused with CATCHUP_END."""
        decoded = pair.decode(pair.encode(CaughtUp(5, U64_MAX)))
        self.assertIs(type(decoded), CaughtUp)
        self.assertEqual(decoded, CaughtUp(5, U64_MAX))

    def test_ack(self) -> None:
        """ACK round-trips, with its count of ITEMS applied defaulting to 0."""
        self.assertRoundTrip(Ack(5, 110, 12))
        self.assertRoundTrip(Ack(0, 0))

    def test_catchupBeginFirsts(self) -> None:
        """CATCHUP_BEGIN carries each stream's first retained sequence number (none by default)."""
        message = next(m for m in MESSAGES if isinstance(m, CatchupBegin) and len(m.firsts) == 2)
        decoded = pair.decode(pair.encode(message))
        assert isinstance(decoded, CatchupBegin)
        self.assertEqual(decoded.firsts, {"s": 10, "t": 2})
        self.assertEqual(CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0).firsts, {})

    def test_allExamples(self) -> None:
        """Every example message (all eight types) round-trips."""
        self.assertEqual({type(m) for m in MESSAGES}, set(PairMessage.__args__))
        for message in MESSAGES:
            self.assertRoundTrip(message)


class LayoutTests(SynchronousTestCase):
    """The bytes are the documented layout."""

    def test_headerCommands(self) -> None:
        """Each header frame starts with the signature "MP" then the command byte 1..10."""
        commands = {
            Heartbeat: 1,
            Hello: 2,
            CatchupBegin: 3,
            Ship: 4,
            Items: 5,
            CatchupEnd: 6,
            CaughtUp: 7,
            Ack: 8,
            RefillAsk: 9,
            Refill: 10,
        }
        for message in MESSAGES:
            head = pair.encode(message)[0]
            self.assertEqual(head[:2], SIGNATURE)
            self.assertEqual(head[2], VERSION)
            self.assertEqual(head[3], commands[type(message)])

    def test_version(self) -> None:
        """
        This codec is version 8 of the link (version 1 had no owners,
        deletes, retention; version 2 carried an append's rows a frame each;
        version 3 had no consumer positions; version 4's heartbeat no
        previous epoch nor pack identity; version 5's no ceiling; version
        6's one ceiling for stream numbers and letter ids; version 7 no
        REFILL_ASK nor REFILL).
        """
        self.assertEqual(VERSION, 8)

    def test_catchupEndBytes(self) -> None:
        """CATCHUP_END is MP, version 8, 6, link and position as big-endian u64s."""
        self.assertEqual(
            pair.encode(CatchupEnd(1, 0x0102)),
            [b"MP\x08\x06" + bytes.fromhex("0000000000000001 0000000000000102")],
        )

    def test_catchupBeginFirstsLast(self) -> None:
        """CATCHUP_BEGIN's first retained sequence numbers are its header's last field."""
        with_firsts = pair.encode(CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0, [], {"s": 3}))[0]
        without = pair.encode(CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0, [], {}))[0]
        self.assertEqual(without[-4:], bytes(4))
        self.assertEqual(
            with_firsts,
            without[:-4] + bytes.fromhex("00000001 00000001 73 0000000000000003"),
        )

    def test_newChangeBytes(self) -> None:
        """
        An owner is O, address, user and a double; a stream delete X, the
        stream and a u64; retention T with each policy's flags (count, age,
        bytes) then the three values; an owners page P with its flags (has
        a lower bound, final).
        """
        self.assertEqual(
            pair.encode_change(OwnerClaimed("a", "u", 1.5)),
            b"O" + bytes.fromhex("00000001 61 00000001 75") + struct.pack(">d", 1.5),
        )
        self.assertEqual(
            pair.encode_change(StreamDeleted("s", 258)),
            b"X" + bytes.fromhex("00000001 73 0000000000000102"),
        )
        self.assertEqual(
            pair.encode_change(Retention(RetentionPolicy(max_count=5), {})),
            b"T" + struct.pack(">BQdQ", 1, 5, 0.0, 0) + bytes(4),
        )
        self.assertEqual(
            pair.encode_change(OwnersPage("a", True, [])),
            b"P\x03" + bytes.fromhex("00000001 61 00000000"),
        )
        self.assertEqual(pair.encode_change(OwnersPage(None, False, [])), b"P\x00" + bytes(4))

    def test_heartbeatBytes(self) -> None:
        """
        HEARTBEAT strings are a 4-byte length then UTF-8; in_sync and leads
        one byte each (0 or 1: another value is malformed); the previous
        epoch, the pack identity, then the ceilings of stream numbers and of
        letter ids (big-endian u64s), last.
        """
        self.assertEqual(
            pair.encode(Heartbeat("p", "\u00e9", True, "", "e", 2, True, "d", "AB", 7, 9)),
            [
                b"MP\x08\x01"
                + bytes.fromhex("00000001 70  00000002 c3a9  01  00000000  00000001 65")
                + bytes.fromhex("0000000000000002 01  00000001 64  00000002 4142")
                + bytes.fromhex("0000000000000007 0000000000000009")
            ],
        )
        frame = pair.encode(Heartbeat("p", "s", False, "", "", 0, False))[0]
        in_sync = 4 + 5 + 5  # after the header and the two one-letter strings
        leads = len(frame) - 25  # before the empty previous epoch, pack identity, ceilings
        self.assertEqual((frame[in_sync], frame[leads]), (0, 0))
        for bad in (
            frame[:leads] + b"\x02" + frame[leads + 1 :],
            frame[:in_sync] + b"\x02" + frame[in_sync + 1 :],
        ):
            with self.assertRaises(MalformedPairMessage):
                pair.decode([bad])

    def test_helloLetterIds(self) -> None:
        """HELLO's second frame is its letter ids as big-endian u64s."""
        frames = pair.encode(Hello("", "", 0, {}, [1, U64_MAX]))
        self.assertEqual(frames[1], bytes.fromhex("0000000000000001 ffffffffffffffff"))

    def test_removedBytes(self) -> None:
        """A removed letter is the kind byte D then its id."""
        self.assertEqual(pair.encode_change(Removed(258)), b"D" + struct.pack(">Q", 258))

    def test_noDeadlineIsNaN(self) -> None:
        """A letter with no deadline carries NaN where the deadline goes."""
        frame = pair.encode_change(LETTER_NO_DEADLINE)
        (deadline,) = struct.unpack_from(">d", frame, 1 + 8)
        self.assertTrue(math.isnan(deadline))

    def test_nonUtf8Text(self) -> None:
        """Text decoded with surrogate escapes goes back out as its original bytes."""
        frame = pair.encode(Heartbeat(NOT_UTF8, "", False, "", ""))[0]
        self.assertEqual(frame[4:8], struct.pack(">I", 7))
        self.assertEqual(frame[8:15], b"caf\xe9 \xff\xfe")


# Strategies for valid values.

# Any text, and text as the codec decodes arbitrary bytes (surrogate escapes
# for what is not UTF-8). A mix of the two within one string need not
# round-trip: escapes that spell valid UTF-8 come back as the characters.
_strings = st.one_of(
    st.text(max_size=12),
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
_u64 = st.integers(0, U64_MAX)
_floats = st.floats(allow_nan=False)
_ids = st.lists(_u64, max_size=6)
_counts = st.dictionaries(_strings, _u64, max_size=4)
_content = st.lists(st.binary(max_size=16), max_size=4).map(tuple)


@st.composite
def _rows(draw: st.DrawFn) -> StreamRow:
    blob = draw(st.binary(max_size=32))  # opaque to the codec: any bytes
    return (
        draw(_strings),
        draw(_u64),
        draw(_floats),
        draw(_strings),
        draw(_strings),
        blob,
        len(blob),
        draw(_strings),
        draw(_u64),
    )


_letters = st.builds(
    QueuedRecord,
    _u64,
    _strings,
    _strings,
    _strings,
    _strings,
    _strings,
    st.none() | _floats,
    _floats,
    _content,
    _strings,
    _u64,
)
_keys = st.tuples(_strings, _strings, _u64, _u64, _floats)
_owners = st.builds(OwnerClaimed, _strings, _strings, _floats)
_policies = st.builds(
    RetentionPolicy, st.none() | _u64, st.none() | _floats, st.none() | _u64
)  # fmt: skip
_changes: st.SearchStrategy[Change] = st.one_of(
    _rows(),
    _letters,
    st.builds(Removed, _u64),
    st.builds(
        Appended,
        st.lists(_rows(), max_size=3),
        _keys,
        st.lists(st.tuples(_strings, _strings), max_size=3),
    ),
    st.builds(AppendKey, _keys),
    _owners,
    st.builds(OwnersPage, st.none() | _strings, st.booleans(), st.lists(_owners, max_size=3)),
    st.builds(StreamDeleted, _strings, _u64),
    st.builds(Retention, _policies, st.dictionaries(_strings, _policies, max_size=3)),
    st.builds(
        ClientSecurity,
        st.none() | st.dictionaries(_strings, _strings, max_size=3),
        st.none() | st.dictionaries(st.binary(max_size=40), _strings, max_size=3),
        st.dictionaries(
            _strings,
            st.dictionaries(_strings, st.lists(_strings, max_size=3), max_size=3),
            max_size=3,
        ),
    ),
)
_messages: st.SearchStrategy[PairMessage] = st.one_of(
    st.builds(Heartbeat, _strings, _strings, st.booleans(), _strings, _strings, _u64),
    st.builds(Hello, _strings, _strings, _u64, _counts, _ids),
    st.builds(
        CatchupBegin,
        _u64,
        _u64,
        st.sampled_from([INCREMENTAL, TRUNCATE, FULL]),
        _strings,
        _counts,
        _u64,
        _counts,
        _u64,
        _ids,
        _counts,
    ),
    st.builds(Ship, _u64, _u64, st.lists(_changes, max_size=4)),
    st.builds(Items, _u64, st.lists(_changes, max_size=4)),
    st.builds(CatchupEnd, _u64, _u64),
    st.builds(CaughtUp, _u64, _u64),
    st.builds(Ack, _u64, _u64, _u64),
)


class PropertyTests(SynchronousTestCase):
    """Arbitrary valid messages and changes round-trip."""

    @settings(max_examples=300, deadline=None)
    @given(_changes)
    def test_changeRoundTrip(self, change: Change) -> None:
        """Any journal change (any strings, sizes, ids, floats) round-trips."""
        self.assertEqual(pair.decode_change(pair.encode_change(change)), change)

    @settings(max_examples=300, deadline=None)
    @given(_messages)
    def test_messageRoundTrip(self, message: PairMessage) -> None:
        """Any message round-trips, and re-encoding the result gives the same frames."""
        frames = pair.encode(message)
        decoded = pair.decode(frames)
        self.assertEqual(decoded, message)
        self.assertEqual(pair.encode(decoded), frames)

    @given(st.binary(max_size=40))
    def test_anyBytesAsText(self, raw: bytes) -> None:
        """Any bytes decoded with surrogate escapes travel as exactly those bytes."""
        text = raw.decode("utf-8", "surrogateescape")
        message = Hello(text, text, 0, {text: 1}, [])
        frames = pair.encode(message)
        self.assertIn(struct.pack(">I", len(raw)) + raw, frames[0])
        self.assertEqual(pair.decode(frames), message)


class MalformedTests(SynchronousTestCase):
    """Every kind of bad input raises MalformedPairMessage."""

    def assertMalformed(self, frames: Sequence[bytes]) -> None:
        self.assertRaises(MalformedPairMessage, pair.decode, frames)

    def assertChangeMalformed(self, frame: bytes) -> None:
        self.assertRaises(MalformedPairMessage, pair.decode_change, frame)
        self.assertMalformed([pair.encode(Ship(1, 1, []))[0], frame])
        self.assertMalformed([pair.encode(Items(1, []))[0], frame])

    def test_isValueError(self) -> None:
        """MalformedPairMessage is a ValueError, so generic input handlers catch it."""
        self.assertTrue(issubclass(MalformedPairMessage, ValueError))

    def test_noFrames(self) -> None:
        """An empty list of frames is malformed."""
        self.assertMalformed([])

    def test_wrongSignature(self) -> None:
        """A header not starting with "MP" is malformed, whatever follows."""
        for message in MESSAGES:
            frames = pair.encode(message)
            for signature in (b"MQ", b"mp", b"PM", b"\x00\x00"):
                self.assertMalformed([signature + frames[0][2:], *frames[1:]])

    def test_otherVersion(self) -> None:
        """A message of another link version is refused, naming both versions."""
        frames = pair.encode(CatchupEnd(1, 2))
        with self.assertRaises(MalformedPairMessage) as caught:
            pair.decode([frames[0][:2] + bytes((VERSION + 1,)) + frames[0][3:]])
        self.assertIn(f"version {VERSION + 1}, this broker {VERSION}", str(caught.exception))

    def test_version1Refused(self) -> None:
        """
        Every message of a version 1 broker (before owners, deletes,
        retention and security travelled) or a version 2 one (an append's
        rows a frame each) is refused, the line naming both versions and
        what to do: pairing mixed versions is refused.
        """
        for message in MESSAGES:
            frames = pair.encode(message)
            for old in (1, 2, 3, 4, 5, 6, 7):
                with self.assertRaises(MalformedPairMessage) as caught:
                    pair.decode([frames[0][:2] + bytes((old,)) + frames[0][3:], *frames[1:]])
                self.assertEqual(
                    str(caught.exception),
                    f"the partner speaks pair link version {old}, this broker 8:"
                    " run the same malamute_pack on both",
                )

    def test_shortHeader(self) -> None:
        """A header too short for a signature and command is malformed."""
        for head in (b"", b"M", b"MP", b"MP\x01"):
            self.assertMalformed([head])

    def test_unknownCommand(self) -> None:
        """Command bytes 0 and 9..255 are unknown, hence malformed."""
        for command in (0, *range(9, 256)):
            self.assertMalformed([SIGNATURE + bytes((VERSION, command)) + b"\x00" * 64])

    def test_truncatedHeaderEveryLength(self) -> None:
        """Every message's header frame cut short at any length is malformed."""
        for message in MESSAGES:
            frames = pair.encode(message)
            for cut in range(len(frames[0])):
                self.assertMalformed([frames[0][:cut], *frames[1:]])

    def test_truncatedFrameEveryLength(self) -> None:
        """
        Every frame of every message (changes included) cut short at any
        length is malformed; a list of ids cut to a length that is not a
        multiple of 8 too.
        """
        for message in TRUNCATABLE:
            frames = pair.encode(message)
            for index, frame in enumerate(frames):
                ids = index == 1 and _frames_with_ids(message)
                for cut in range(len(frame)):
                    if ids and cut % 8 == 0:
                        continue  # a shorter list of ids is still a list of ids
                    cutFrames = [*frames[:index], frame[:cut], *frames[index + 1 :]]
                    self.assertMalformed(cutFrames)

    def test_truncatedChangeEveryLength(self) -> None:
        """
        Every change frame (letters with no content) cut short at any length
        is malformed; letters with content cut inside a content frame too.
        """
        for change in CHANGES:
            frame = pair.encode_change(change)
            boundaries: set[int] = set()
            if isinstance(change, QueuedRecord):
                # The content is the rest of the frame: cutting it between
                # two content frames leaves a letter with fewer frames.
                at = len(frame) - len(encode_frames(change.content))
                boundaries.add(at)
                for part in change.content:
                    at += 4 + len(part)
                    boundaries.add(at)
            for cut in range(len(frame)):
                if cut not in boundaries:
                    self.assertChangeMalformed(frame[:cut])

    def test_trailingBytesHeader(self) -> None:
        """Any bytes after a header frame's last field are malformed."""
        for message in MESSAGES:
            frames = pair.encode(message)
            for extra in (b"\x00", b"\xff" * 8, b"junk"):
                self.assertMalformed([frames[0] + extra, *frames[1:]])

    def test_trailingBytesChange(self) -> None:
        """
        Bytes after a row, removed id, append or key are malformed, and so are
        bytes after a letter's content that do not make a whole frame.
        """
        for change in CHANGES:
            frame = pair.encode_change(change)
            for extra in (b"\x00", b"\x01\x02\x03"):
                self.assertChangeMalformed(frame + extra)
            if not isinstance(change, QueuedRecord):
                self.assertChangeMalformed(frame + b"\x00" * 8)

    def test_unknownChangeKind(self) -> None:
        """
        A change frame whose kind byte is not R, Q, D, A, K, O, P, X, T or
        S is malformed; an empty one too.
        """
        self.assertChangeMalformed(b"")
        for kind in range(256):
            if bytes((kind,)) not in KINDS:
                self.assertChangeMalformed(bytes((kind,)) + pair.encode_change(REMOVED)[1:])

    def test_badFlags(self) -> None:
        """
        Flag bytes with bits no version defines are malformed: an owners
        page's (two bits), the security state's (two), a retention policy's
        (three).
        """
        page = pair.encode_change(OwnersPage(None, False, []))
        security = pair.encode_change(SECURITY_NONE)
        retention = pair.encode_change(RETENTION_NONE)
        for flags in (4, 8, 255):
            self.assertChangeMalformed(page[:1] + bytes((flags,)) + page[2:])
            self.assertChangeMalformed(security[:1] + bytes((flags,)) + security[2:])
        for flags in (8, 16, 255):
            self.assertChangeMalformed(retention[:1] + bytes((flags,)) + retention[2:])

    def test_newCountsLargerThanFrame(self) -> None:
        """
        The counts of an owners page's claims, of retention's streams and of
        the security state's passwords, keys, rights, users and globs, each
        larger than what is left of the frame, are malformed.
        """
        huge = struct.pack(">I", 0xFFFFFFFF)
        page = pair.encode_change(OwnersPage(None, True, []))
        self.assertChangeMalformed(page[:2] + huge)
        retention = pair.encode_change(RETENTION_NONE)
        self.assertChangeMalformed(retention[:-4] + huge)
        for state in (
            ClientSecurity({}, None, {}),
            ClientSecurity(None, {}, {}),
            ClientSecurity(None, None, {}),
        ):
            frame = pair.encode_change(state)
            self.assertChangeMalformed(frame[:2] + huge + frame[6:])
        rules = pair.encode_change(ClientSecurity(None, None, {"r": {"u": []}}))
        at = 2 + 4 + 4 + 1  # kind, flags, rights count, "r"
        self.assertChangeMalformed(rules[:at] + huge + rules[at + 4 :])
        at += 4 + 4 + 1  # users count, "u"
        self.assertChangeMalformed(rules[:at] + huge)

    def test_appendedHoldsOnlyRows(self) -> None:
        """
        An append whose records are not a whole block of rows is malformed:
        more rows counted than the block holds, or an empty block's text
        column claiming a value.
        """
        frame = pair.encode_change(Appended([ROW], KEY, []))
        block = encode_rows([ROW])
        at = len(frame) - len(block)
        self.assertEqual(frame[at:], block)
        self.assertChangeMalformed(frame[:at] + struct.pack(">I", 2) + block[4:])
        empty = pair.encode_change(Appended([], KEY, []))
        self.assertChangeMalformed(empty[:-4] + struct.pack(">I", 1))

    def test_rowSizeDisagrees(self) -> None:
        """A row whose size field is not its content's length is malformed, alone or appended."""
        stream, seq, ts, sender, subject, blob, size, origin, origin_seq = ROW
        for wrong in (size - 1, size + 1, 0, U64_MAX):
            bad: StreamRow = (stream, seq, ts, sender, subject, blob, wrong, origin, origin_seq)
            self.assertChangeMalformed(pair.encode_change(bad))
            self.assertChangeMalformed(pair.encode_change(Appended([bad], KEY, [])))

    def test_letterContentMalformed(self) -> None:
        """A letter whose content's frame length overruns it is malformed."""
        frame = pair.encode_change(LETTER_NO_DEADLINE)
        self.assertChangeMalformed(frame + struct.pack(">I", 5) + b"abc")

    def test_stringLengthOverruns(self) -> None:
        """A string whose length is larger than the rest of its frame is malformed."""
        head = pair.encode(Heartbeat("p", "s", True, "", ""))[0]
        self.assertMalformed([head[:4] + struct.pack(">I", 0xFFFFFFFF) + head[8:]])

    def test_countLargerThanFrame(self) -> None:
        """Counts (streams, counters, forget keys, rows) larger than their frame are malformed."""
        huge = struct.pack(">I", 0xFFFFFFFF)
        hello = pair.encode(Hello("", "", 0, {}, []))
        at = 4 + 4 + 4 + 8  # the header, two empty strings and last_id
        self.assertMalformed([hello[0][:at] + huge + hello[0][at + 4 :], hello[1]])
        # Three stream counts promised, one given.
        one = pair.encode(Hello("", "", 0, {"s": 1}, []))
        self.assertMalformed([one[0][:at] + struct.pack(">I", 3) + one[0][at + 4 :], one[1]])
        begin = pair.encode(CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0))
        at = 4 + 8 + 8 + 1 + 4  # the header, link, base, mode, empty epoch
        self.assertMalformed([begin[0][:at] + huge + begin[0][at + 4 :], begin[1]])
        at += 4 + 8  # no truncate points, truncate_id
        self.assertMalformed([begin[0][:at] + huge + begin[0][at + 4 :], begin[1]])
        appended = pair.encode_change(APPENDED_EMPTY)
        self.assertChangeMalformed(appended[:-8] + huge + appended[-4:])
        self.assertChangeMalformed(appended[:-4] + huge)
        self.assertChangeMalformed(appended[:-4] + struct.pack(">I", 2))

    def test_idsNotMultipleOf8(self) -> None:
        """A list of ids (HELLO letters, CATCHUP_BEGIN deletions) not 8n bytes long is malformed."""
        for message in (Hello("", "", 0, {}, [1]), CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0, [1])):
            head, ids = pair.encode(message)
            for size in (1, 7, 9, 15, 17):
                self.assertMalformed([head, (ids * 3)[:size]])

    def test_missingFrames(self) -> None:
        """HELLO and CATCHUP_BEGIN without their list of ids are malformed."""
        for message in MESSAGES:
            if _frames_with_ids(message):
                self.assertMalformed(pair.encode(message)[:1])

    def test_extraFrames(self) -> None:
        """Frames beyond a message's own are malformed (for SHIP/ITEMS: they are not changes)."""
        for message in MESSAGES:
            frames = pair.encode(message)
            for extra in (b"", b"\x00" * 8, b"junk"):
                self.assertMalformed([*frames, extra])

    def test_badCatchupMode(self) -> None:
        """A CATCHUP_BEGIN mode other than INCREMENTAL, TRUNCATE or FULL is malformed."""
        head, ids = pair.encode(CatchupBegin(1, 0, FULL, "", {}, 0, {}, 0))
        at = 4 + 8 + 8  # the header, link, base
        for mode in (3, 4, 255):
            self.assertMalformed([head[:at] + bytes((mode,)) + head[at + 1 :], ids])


def _mutations(frames: list[bytes], data: st.DataObject) -> list[bytes]:
    """C{frames} with one frame's bytes flipped, inserted, cut or a frame added or dropped."""
    how = data.draw(st.sampled_from(["flip", "insert", "delete", "add", "drop"]))
    if how == "add":
        return [*frames, data.draw(st.binary(max_size=16))]
    if how == "drop":
        index = data.draw(st.integers(0, len(frames) - 1))
        return frames[:index] + frames[index + 1 :]
    index = data.draw(st.integers(0, len(frames) - 1))
    frame = frames[index]
    at = data.draw(st.integers(0, len(frame)))
    if how == "flip" and at < len(frame):
        frame = frame[:at] + bytes((frame[at] ^ data.draw(st.integers(1, 255)),)) + frame[at + 1 :]
    elif how == "insert":
        frame = frame[:at] + data.draw(st.binary(min_size=1, max_size=8)) + frame[at:]
    else:
        frame = frame[:at] + frame[at + data.draw(st.integers(1, 8)) :]
    return [*frames[:index], frame, *frames[index + 1 :]]


_any_frames = st.lists(st.binary(max_size=64), max_size=5)
_change_kinds = st.sampled_from(KINDS)


class FuzzTests(SynchronousTestCase):
    """Random input decodes to a message or raises MalformedPairMessage, nothing else."""

    def assertOnlyMalformed(self, frames: Sequence[bytes]) -> None:
        try:
            message = pair.decode(frames)
        except MalformedPairMessage:
            return
        # Whatever decodes is a message of the codec that can be encoded again.
        self.assertIsInstance(message, PairMessage.__args__)
        pair.encode(message)

    @settings(max_examples=500, deadline=None)
    @given(_any_frames)
    def test_randomFrames(self, frames: list[bytes]) -> None:
        """Arbitrary frames decode or raise MalformedPairMessage only."""
        self.assertOnlyMalformed(frames)

    @settings(max_examples=500, deadline=None)
    @given(st.integers(0, 10), st.binary(max_size=96), _any_frames)
    def test_randomBodyAfterHeader(self, command: int, body: bytes, more: list[bytes]) -> None:
        """Arbitrary bodies and frames behind a valid signature and command: only Malformed."""
        self.assertOnlyMalformed([SIGNATURE + bytes((VERSION, command)) + body, *more])

    @settings(max_examples=500, deadline=None)
    @given(
        st.sampled_from([4, 5]),
        st.lists(st.tuples(_change_kinds, st.binary(max_size=96)), max_size=4),
    )
    def test_randomChanges(self, command: int, changes: list[tuple[bytes, bytes]]) -> None:
        """Arbitrary change frames with a known kind byte in SHIP/ITEMS: only Malformed."""
        head = SIGNATURE + bytes((VERSION, command)) + b"\x00" * (16 if command == 4 else 8)
        self.assertOnlyMalformed([head, *(kind + body for kind, body in changes)])

    @settings(max_examples=500, deadline=None)
    @given(_messages, st.data())
    def test_mutatedMessages(self, message: PairMessage, data: st.DataObject) -> None:
        """
        Valid messages with bytes flipped, inserted or cut, or frames added or
        dropped, raise only MalformedPairMessage.
        """
        self.assertOnlyMalformed(_mutations(pair.encode(message), data))
