"""
Tests for L{malamute_pack.protocol.packlink}: every message's frames written
out by hand from the layout (also kept in ``tests/vectors/packlink.jsonl``
for other implementations), every decoding error with its reason, the
values encode refuses, and properties: arbitrary frames decode to a message
or raise L{MalformedLink} only, and arbitrary valid messages round-trip.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import packlink
from malamute_pack.protocol.packlink import (
    DONE,
    EARLIEST,
    MAILBOX,
    SEQUENCE,
    SERVICE,
    STORED,
    TIME,
    Address,
    Answer,
    Confirm,
    Forward,
    Interest,
    LinkMessage,
    MalformedLink,
    Offer,
    Owner,
    Sync,
    Uninterest,
)

VECTOR_FILE = Path(__file__).parents[1] / "vectors" / "packlink.jsonl"

# The name each message type has in the vector file.
TYPE_NAMES: dict[type[LinkMessage], str] = {
    packlink.Sync: "SYNC",
    packlink.Interest: "INTEREST",
    packlink.Uninterest: "UNINTEREST",
    packlink.Address: "ADDRESS",
    packlink.Offer: "OFFER",
    packlink.Forward: "FORWARD",
    packlink.Letter: "LETTER",
    packlink.Answer: "ANSWER",
    packlink.Confirm: "CONFIRM",
    packlink.Owner: "OWNER",
    packlink.GroupJoin: "GROUP_JOIN",
    packlink.GroupCredit: "GROUP_CREDIT",
    packlink.GroupCommit: "GROUP_COMMIT",
    packlink.GroupLeave: "GROUP_LEAVE",
    packlink.GroupRecord: "GROUP_RECORD",
    packlink.GroupCommitted: "GROUP_COMMITTED",
    packlink.GroupEnded: "GROUP_ENDED",
    packlink.GroupPosition: "GROUP_POSITION",
}

# (name, message, frames as hex), written out by hand from the layout:
# AA A3 | id | version 03 | fields (string: length byte + UTF-8; numbers
# big-endian), then the content frames of FORWARD and LETTER.
VECTORS: list[tuple[str, LinkMessage, list[str]]] = [
    ("sync", Sync("pack-a"), ["aa a3 01 03  06 7061636b2d61  0003"]),
    ("sync empty", Sync("", 0), ["aa a3 01 03  00  0000"]),
    # Lengths count UTF-8 bytes: e-acute is two, the euro sign three.
    ("sync utf-8", Sync("\u00e9\u20ac", 0x0102), ["aa a3 01 03  05 c3a9 e282ac  0102"]),
    (
        "interest earliest with history",
        Interest("weather", "temp.*", EARLIEST, 0, 1),
        ["aa a3 02 03  07 77656174686572  06 74656d702e2a  01  0000000000000000  01"],
    ),
    (
        "interest from a sequence",
        Interest("weather", "temp.*", SEQUENCE, 42),
        ["aa a3 02 03  07 77656174686572  06 74656d702e2a  02  000000000000002a  00"],
    ),
    ("interest latest", Interest("s", ""), ["aa a3 02 03  01 73  00  00  0000000000000000  00"]),
    (
        "interest at the largest time",
        Interest("s", "", TIME, 0xFFFFFFFFFFFFFFFF, 1),
        ["aa a3 02 03  01 73  00  03  ffffffffffffffff  01"],
    ),
    (
        "uninterest",
        Uninterest("weather", "temp.*"),
        ["aa a3 03 03  07 77656174686572  06 74656d702e2a"],
    ),
    ("address present", Address("alice"), ["aa a3 04 03  05 616c696365  01"]),
    ("address gone", Address("alice", 0), ["aa a3 04 03  05 616c696365  00"]),
    ("offer", Offer("echo", "ping.*", 3), ["aa a3 05 03  04 6563686f  06 70696e672e2a  00000003"]),
    (
        "offer withdrawn",
        Offer("echo", "ping.*", 0),
        ["aa a3 05 03  04 6563686f  06 70696e672e2a  00000000"],
    ),
    (
        "forward with content",
        Forward("weather", 7, 1_700_000_000_000_000, "writer", "temp.paris", 0, (b"21C", b"")),
        [
            "aa a3 06 03  07 77656174686572  0000000000000007  00060a24181e4000"
            "  06 777269746572  0a 74656d702e7061726973  00",
            "323143",
            "",
        ],
    ),
    (
        "forward of history without content",
        Forward("weather", 0x0102030405060708, 0, "", "", 1),
        ["aa a3 06 03  07 77656174686572  0102030405060708  0000000000000000  00  00  01"],
    ),
    (
        "letter to a mailbox",
        packlink.Letter(MAILBOX, 5, "bob", "alice", "hi", "t-1", 30_000, (b"hello",)),
        [
            "aa a3 07 03  01  0000000000000005  03 626f62  05 616c696365  02 6869  03 742d31"
            "  00007530",
            "68656c6c6f",
        ],
    ),
    (
        "letter to a service without content",
        packlink.Letter(SERVICE, 0xFFFFFFFFFFFFFFFF, "", "echo", "", "", 0xFFFFFFFF),
        ["aa a3 07 03  02  ffffffffffffffff  00  04 6563686f  00  00  ffffffff"],
    ),
    ("answer stored", Answer(5), ["aa a3 08 03  0000000000000005  01  00c8  00"]),
    ("answer done", Answer(6, DONE), ["aa a3 08 03  0000000000000006  02  00c8  00"]),
    (
        "answer refused",
        Answer(5, STORED, 503, "full"),
        ["aa a3 08 03  0000000000000005  01  01f7  04 66756c6c"],
    ),
    (
        "confirm",
        Confirm("bob", "t-1", 200, "OK"),
        ["aa a3 09 03  03 626f62  03 742d31  00c8  02 4f4b"],
    ),
    (
        "owner",
        Owner("alice", "alice", 1_700_000_000_000_000),
        ["aa a3 0a 03  05 616c696365  05 616c696365  00060a24181e4000"],
    ),
    (
        "group join",
        packlink.GroupJoin("s", "g", "m1", "k.*", packlink.SEQUENCE, 42, "alice"),
        ["aa a3 0b 03  01 73  01 67  02 6d31  03 6b2e2a  02  000000000000002a  05 616c696365"],
    ),
    (
        "group credit",
        packlink.GroupCredit("s", "g", "m1", 64),
        ["aa a3 0c 03  01 73  01 67  02 6d31  00000040"],
    ),
    (
        "group commit",
        packlink.GroupCommit("s", "g", "m1", 7),
        ["aa a3 0d 03  01 73  01 67  02 6d31  0000000000000007"],
    ),
    ("group leave", packlink.GroupLeave("s", "g", "m1"), ["aa a3 0e 03  01 73  01 67  02 6d31"]),
    (
        "group record",
        packlink.GroupRecord("s", "g", "m1", 7, 1_700_000_000_000_000, "w", "k.1", (b"x",)),
        [
            "aa a3 0f 03  01 73  01 67  02 6d31  0000000000000007  00060a24181e4000  01 77"
            "  03 6b2e31",
            "78",
        ],
    ),
    (
        "group committed",
        packlink.GroupCommitted("s", "g", "m1", 7, 300, "gone"),
        ["aa a3 10 03  01 73  01 67  02 6d31  0000000000000007  012c  04 676f6e65"],
    ),
    (
        "group ended",
        packlink.GroupEnded("s", "g", "m1", 403, "no"),
        ["aa a3 11 03  01 73  01 67  02 6d31  0193  02 6e6f"],
    ),
    (
        "group position",
        packlink.GroupPosition(
            "s", "g", 1_700_000_000_000_000, (b"A1", bytes.fromhex("0000000000000009"))
        ),
        ["aa a3 12 03  01 73  01 67  00060a24181e4000", "4131", "0000000000000009"],
    ),
]


def _frames(hexes: Sequence[str]) -> list[bytes]:
    return [bytes.fromhex(h) for h in hexes]


def _json_fields(message: LinkMessage) -> dict[str, Any]:
    """A message's fields as the vector file writes them (content as hex)."""
    fields = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
    if "content" in fields:
        fields["content"] = [frame.hex() for frame in fields["content"]]
    return fields


def _table_as_json() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "type": TYPE_NAMES[type(message)],
            "id": message.ID,
            "fields": _json_fields(message),
            "frames": [f.hex() for f in _frames(hexes)],
        }
        for name, message, hexes in VECTORS
    ]


def _load_vectors() -> list[dict[str, Any]]:
    return [json.loads(line) for line in VECTOR_FILE.read_text().splitlines() if line.strip()]


def _message_of(vector: dict[str, Any]) -> LinkMessage:
    """The message a vector-file line describes, built from its fields."""
    cls = packlink.MESSAGE_TYPES[vector["id"]]
    fields = dict(vector["fields"])
    if "content" in fields:
        fields["content"] = tuple(bytes.fromhex(h) for h in fields["content"])
    message: LinkMessage = cls(**fields)
    return message


class VectorTests(SynchronousTestCase):
    def test_encode(self) -> None:
        """Every message encodes to exactly the frames written out by hand."""
        for name, message, hexes in VECTORS:
            self.assertEqual(packlink.encode(message), _frames(hexes), name)

    def test_decode(self) -> None:
        """Every hand-written frame list decodes to its message."""
        for name, message, hexes in VECTORS:
            self.assertEqual(packlink.decode(_frames(hexes)), message, name)

    def test_everyTypeCovered(self) -> None:
        """Every message type of the protocol has at least one vector."""
        self.assertEqual(
            {type(message) for _, message, _ in VECTORS}, set(packlink.MESSAGE_TYPES.values())
        )
        self.assertEqual(set(TYPE_NAMES), set(packlink.MESSAGE_TYPES.values()))

    def test_fileMatchesTable(self) -> None:
        """The vector file holds exactly the vectors of this module, in order."""
        self.assertEqual(_load_vectors(), _table_as_json())

    def test_fileVectors(self) -> None:
        """
        Every line of the vector file, its message built from its fields,
        encodes to its frames and its frames decode to that message.
        """
        for vector in _load_vectors():
            message = _message_of(vector)
            frames = _frames(vector["frames"])
            self.assertEqual(TYPE_NAMES[type(message)], vector["type"], vector["name"])
            self.assertEqual(packlink.encode(message), frames, vector["name"])
            self.assertEqual(packlink.decode(frames), message, vector["name"])

    def test_ids(self) -> None:
        """Message ids are 1 to 18, in the order of the protocol."""
        self.assertEqual(
            [(cls.ID, TYPE_NAMES[cls]) for cls in packlink.MESSAGE_TYPES.values()],
            [
                (1, "SYNC"),
                (2, "INTEREST"),
                (3, "UNINTEREST"),
                (4, "ADDRESS"),
                (5, "OFFER"),
                (6, "FORWARD"),
                (7, "LETTER"),
                (8, "ANSWER"),
                (9, "CONFIRM"),
                (10, "OWNER"),
                (11, "GROUP_JOIN"),
                (12, "GROUP_CREDIT"),
                (13, "GROUP_COMMIT"),
                (14, "GROUP_LEAVE"),
                (15, "GROUP_RECORD"),
                (16, "GROUP_COMMITTED"),
                (17, "GROUP_ENDED"),
                (18, "GROUP_POSITION"),
            ],
        )

    def test_contentDecodesAsTuple(self) -> None:
        """Content frames decode as a tuple (a hashable, immutable message)."""
        message = packlink.decode([bytes.fromhex("aa a3 06 03 00" + "00" * 16 + "000000"), b"x"])
        assert isinstance(message, Forward)
        self.assertEqual(message.content, (b"x",))
        hash(message)

    def test_messagesFrozen(self) -> None:
        """Messages are immutable values."""
        message = Address("alice")
        with self.assertRaises(AttributeError):
            message.address = "bob"  # type: ignore[misc]


class MalformedTests(SynchronousTestCase):
    def assertMalformed(self, hexes: Sequence[str], fragment: str) -> None:
        with self.assertRaises(MalformedLink) as ctx:
            packlink.decode(_frames(hexes))
        self.assertIn(fragment, str(ctx.exception))

    def test_isValueError(self) -> None:
        """MalformedLink is a ValueError, for callers that catch those."""
        self.assertTrue(issubclass(MalformedLink, ValueError))

    def test_noFrames(self) -> None:
        """An empty frame list is malformed."""
        self.assertMalformed([], "no frames")

    def test_shortHeader(self) -> None:
        """A first frame shorter than the four header bytes is malformed."""
        self.assertMalformed([""], "header of 0 bytes is too short")
        self.assertMalformed(["aa a3 01"], "header of 3 bytes is too short")

    def test_badSignature(self) -> None:
        """A ZRE (AA A1), zgossip (AA A0), MLM (AA A8) or any other signature is refused."""
        self.assertMalformed(["aa a1 01 01 00 00 01"], "bad signature aaa1")
        self.assertMalformed(["aa a0 01 01"], "bad signature aaa0")
        self.assertMalformed(["aa a8 01 01"], "bad signature aaa8")
        self.assertMalformed(["00 00 01 01"], "bad signature 0000")

    def test_unknownId(self) -> None:
        """Ids 0 and 19 and above are unknown."""
        self.assertMalformed(["aa a3 00 03"], "unknown message id 0")
        self.assertMalformed(["aa a3 13 03"], "unknown message id 19")
        self.assertMalformed(["aa a3 ff 03"], "unknown message id 255")

    def test_wrongVersion(self) -> None:
        """Only version 3 is spoken; another (2, before consumer groups) is refused naming both."""
        self.assertMalformed(["aa a3 01 00 00 00 01"], "version 0, this broker speaks 3")
        self.assertMalformed(["aa a3 01 01 00 00 01"], "version 1, this broker speaks 3")
        self.assertMalformed(["aa a3 01 02 00 00 01"], "version 2, this broker speaks 3")

    def test_truncatedStringLength(self) -> None:
        """A frame that ends where a string's length byte should be is malformed."""
        self.assertMalformed(["aa a3 03 03"], "stream: string length runs past the end")
        self.assertMalformed(["aa a3 03 03 01 73"], "pattern: string length runs past the end")

    def test_truncatedString(self) -> None:
        """A string whose length runs past the end of the frame is malformed."""
        self.assertMalformed(["aa a3 03 03 05 61"], "stream: string runs past the end")
        self.assertMalformed(["aa a3 09 03 00 00 00 c8 02 4f"], "reason: string runs past the end")

    def test_truncatedNumber(self) -> None:
        """A number cut short (of any width) is malformed, naming the field."""
        self.assertMalformed(["aa a3 01 03 00 00"], "version: number runs past the end")
        self.assertMalformed(["aa a3 04 03 01 61"], "present: number runs past the end")
        self.assertMalformed(["aa a3 05 03 01 73 00 00 00 01"], "workers: number runs past the end")
        self.assertMalformed(
            ["aa a3 08 03 00 00 00 00 00 00 00"], "relay_id: number runs past the end"
        )

    def test_trailingBytes(self) -> None:
        """Bytes after the last field of the first frame are malformed."""
        self.assertMalformed(["aa a3 01 03 00 00 01 ff"], "1 trailing bytes")
        self.assertMalformed(["aa a3 04 03 01 61 01 00 00"], "2 trailing bytes")

    def test_notUtf8(self) -> None:
        """A string that is not UTF-8 (a stray byte, a cut sequence, a surrogate) is malformed."""
        self.assertMalformed(["aa a3 03 03 01 ff 00"], "stream: not UTF-8")
        self.assertMalformed(["aa a3 03 03 00 01 c3"], "pattern: not UTF-8")
        self.assertMalformed(["aa a3 03 03 03 ed a0 80 00"], "stream: not UTF-8")

    def test_contentOnMessageWithout(self) -> None:
        """Frames after the first on a message that carries no content are malformed."""
        self.assertMalformed(["aa a3 01 03 00 00 01", ""], "message 1 carries no content frames")
        self.assertMalformed(
            ["aa a3 04 03 01 61 01", "78", "79"], "message 4 carries no content frames"
        )


class EncodeRefusalTests(SynchronousTestCase):
    def test_stringTooLong(self) -> None:
        """A string over 255 UTF-8 bytes cannot be encoded, even if 255 characters or fewer."""
        self.assertEqual(len(packlink.encode(Sync("k" * 255))[0]), 4 + 1 + 255 + 2)
        with self.assertRaises(MalformedLink) as ctx:
            packlink.encode(Sync("k" * 256))
        self.assertIn("broker: string of 256 bytes is longer than 255", str(ctx.exception))
        with self.assertRaises(MalformedLink) as ctx:
            packlink.encode(Confirm("a", "t", 200, "\u00e9" * 128))
        self.assertIn("reason: string of 256 bytes", str(ctx.exception))

    def test_numberOutOfRange(self) -> None:
        """A number below 0 or past its width cannot be encoded, whatever its width."""
        refused: list[LinkMessage] = [
            Address("a", 256),
            Address("a", -1),
            Sync("a", 1 << 16),
            Answer(1, STORED, -1),
            Offer("s", "", 1 << 32),
            Interest("s", "", EARLIEST, 1 << 64),
            Answer(-1),
        ]
        for message in refused:
            with self.assertRaises(MalformedLink) as ctx:
                packlink.encode(message)
            self.assertIn("number out of range", str(ctx.exception))

    def test_numberLimits(self) -> None:
        """The largest value of each width encodes."""
        packlink.encode(Address("a", 255))
        packlink.encode(Sync("a", 0xFFFF))
        packlink.encode(Offer("s", "", 0xFFFFFFFF))
        packlink.encode(Interest("s", "", EARLIEST, 0xFFFFFFFFFFFFFFFF))


# Any Unicode scalar value (1 to 4 UTF-8 bytes), lone surrogates excluded;
# built from code points rather than st.text(), whose character tables take
# seconds to build in a fresh Hypothesis directory (trial's temp directory).
_char = st.one_of(st.integers(0, 0xD7FF), st.integers(0xE000, 0x10FFFF)).map(chr)
_strings = st.one_of(
    # At most 63 characters: at most 252 bytes whatever they are.
    st.lists(_char, max_size=63).map("".join),
    # Up to the longest string there is (255 bytes).
    st.lists(st.integers(0x20, 0x7E).map(chr), max_size=255).map("".join),
)
_content = st.lists(st.binary(max_size=32), max_size=4).map(tuple)


def _field(kind: str) -> st.SearchStrategy[Any]:
    if kind == "s":
        return _strings
    return st.integers(0, (1 << (8 * int(kind))) - 1)


@st.composite
def _messages(draw: st.DrawFn) -> LinkMessage:
    cls = draw(st.sampled_from(list(packlink.MESSAGE_TYPES.values())))
    values = {name: draw(_field(kind)) for name, kind in cls.LAYOUT}
    if cls.HAS_CONTENT:
        values["content"] = draw(_content)
    message: LinkMessage = cls(**values)
    return message


_any_frames = st.lists(st.binary(max_size=48), max_size=4)


class PropertyTests(SynchronousTestCase):
    @given(_messages())
    def test_roundTrip(self, message: LinkMessage) -> None:
        """Any valid message encodes to frames that decode to an equal message."""
        self.assertEqual(packlink.decode(packlink.encode(message)), message)

    @given(_any_frames)
    def test_decodeRaisesOnlyMalformed(self, frames: list[bytes]) -> None:
        """
        Decoding an arbitrary frame list gives a message or raises
        MalformedLink, nothing else; what decodes re-encodes to the same frames.
        """
        try:
            message = packlink.decode(frames)
        except MalformedLink:
            return
        self.assertEqual(packlink.encode(message), frames)

    @given(st.integers(0, 10), st.binary(max_size=64), _any_frames)
    def test_decodeAfterValidHeader(self, ident: int, body: bytes, more: list[bytes]) -> None:
        """
        Arbitrary bodies and frames behind a valid header (where the parser
        does its real work) also give a message or raise MalformedLink only,
        and whatever decodes re-encodes to the same frames.
        """
        frames = [b"\xaa\xa3" + bytes((ident, 1)) + body, *more]
        try:
            message = packlink.decode(frames)
        except MalformedLink:
            return
        self.assertEqual(packlink.encode(message), frames)

    @given(_messages(), st.data())
    def test_everyTruncationMalformed(self, message: LinkMessage, data: st.DataObject) -> None:
        """Any message's first frame cut short anywhere (past the header) is malformed."""
        frames = packlink.encode(message)
        cut = data.draw(st.integers(4, len(frames[0]) - 1))
        with self.assertRaises(MalformedLink):
            packlink.decode([frames[0][:cut], *frames[1:]])


_STRINGS = st.sampled_from(["", "s", "x.y.z", "é" * 127, "é" * 128, "\ud800"])


class EncodeForwardTests(SynchronousTestCase):
    @given(
        _STRINGS,
        st.integers(0, 2**64),
        st.integers(0, 2**64 - 1),
        _STRINGS,
        _STRINGS,
        st.integers(0, 1),
        st.lists(st.binary(max_size=20), max_size=4),
    )
    def test_sameAsEncode(
        self,
        stream: str,
        seq: int,
        timestamp: int,
        sender: str,
        subject: str,
        history: int,
        content: list[bytes],
    ) -> None:
        """encode_forward gives exactly the frames encode gives for the same FORWARD."""
        message = packlink.Forward(stream, seq, timestamp, sender, subject, history, tuple(content))
        try:
            expected = packlink.encode(message)
        except packlink.MalformedLink:
            with self.assertRaises(packlink.MalformedLink):
                packlink.encode_forward(stream, seq, timestamp, sender, subject, history, content)
            return
        self.assertEqual(
            packlink.encode_forward(stream, seq, timestamp, sender, subject, history, content),
            expected,
        )


class GroupCodecTests(SynchronousTestCase):
    def test_roundTrip(self) -> None:
        """A vector of origins and numbers travels as frame pairs and comes back the same."""
        vector = {"A1": 9, "B2": 2**64 - 1, "\u00e9": 0}
        self.assertEqual(packlink.decode_vector(packlink.encode_vector(vector)), vector)

    def test_malformed(self) -> None:
        """An odd frame count, a number not 8 bytes, an empty or non-UTF-8 origin are refused."""
        for content in (
            [b"A1"],
            [b"A1", b"\x00" * 7],
            [b"", b"\x00" * 8],
            [b"\xff", b"\x00" * 8],
            [b"A", b"\x00" * 8] * (packlink.MAX_ORIGINS + 1),
        ):
            with self.assertRaises(MalformedLink):
                packlink.decode_vector(content)

    def test_groupRecordFastPath(self) -> None:
        """encode_group_record gives the frames encode gives for the same GROUP_RECORD."""
        message = packlink.GroupRecord("s", "g", "m1", 7, 1_700_000_000, "w", "k.1", (b"x", b""))
        self.assertEqual(
            packlink.encode_group_record("s", "g", "m1", 7, 1_700_000_000, "w", "k.1", [b"x", b""]),
            packlink.encode(message),
        )
