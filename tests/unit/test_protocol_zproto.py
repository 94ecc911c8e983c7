"""
Tests for L{malamute_pack.protocol.zproto}, the layout engine, on a codec
made here for it: each field kind's bytes, round trips, the header's
checks, the wording a codec gives its errors, and the positional encoders.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import zproto
from malamute_pack.protocol.errors import Malformed


class Refused(Malformed):
    """The test codec's error."""


@dataclass(frozen=True)
class Flat:
    ID = 1
    name: str = ""
    count: int = 0
    big: int = 0
    long: str = ""
    content: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Inner:
    label: str = ""
    weight: float = 0.0


@dataclass(frozen=True)
class Nested:
    ok: bool = False
    maybe: str | None = None
    limit: int | None = None
    items: list[Inner] = field(default_factory=list)
    table: dict[str, int] = field(default_factory=dict)
    pair: tuple[str, int] = ("", 0)
    when: float | None = None
    ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Rest:
    size: int = 0
    blob: bytes = b""


_INNER = (("label", zproto.STRING), ("weight", zproto.REAL8))

CODEC: zproto.Codec[Flat | Nested | Rest] = zproto.Codec(
    [
        zproto.Spec(
            1,
            "FLAT",
            Flat,
            (("name", "s"), ("count", "2"), ("big", "8"), ("long", "S")),
            ("content", zproto.Content(tuple)),
        ),
        zproto.Spec(
            2,
            "NESTED",
            Nested,
            (
                ("", zproto.Flags("maybe", "ok", "limit")),
                ("maybe", zproto.Optional(zproto.STRING)),
                ("limit", zproto.Optional(zproto.NUMBER4, absent=0)),
                (
                    "items",
                    zproto.ListOf(zproto.Record(Inner, (("label", "s"), ("weight", "d"))), list),
                ),
                ("table", zproto.ListOf(zproto.Tuple("s", "4"), dict)),
                ("pair", zproto.Tuple("S", "1")),
                ("when", zproto.OPTIONAL_REAL8),
            ),
            ("ids", zproto.Ids()),
        ),
        zproto.Spec(3, "REST", Rest, (("size", "1"), ("blob", zproto.Rest(size="size")))),
    ],
    signature=b"\xaa\xa9",
    version=7,
    error=Refused,
    text=zproto.STRICT,
)


class LayoutTests(SynchronousTestCase):
    def test_flatBytes(self) -> None:
        """
        A message's first frame is signature, id, version, then each field
        in wire order: a string after its length byte, numbers big-endian,
        a longstr after its 4-byte length; content follows as frames.
        """
        frames = CODEC.encode(Flat("ab", 258, 1, "é", (b"x", b"")))
        self.assertEqual(
            frames,
            [
                bytes.fromhex("aa a9 01 07 02 61 62 01 02 0000000000000001 00000002 c3 a9"),
                b"x",
                b"",
            ],
        )

    def test_nestedBytes(self) -> None:
        """
        A flags byte's bits say which optional fields follow (or hold a
        boolean); a list is its 4-byte count then its items; a fixed
        optional field takes its bytes even when absent; an absent double
        travels as NaN; ids travel as a frame of 8-byte numbers.
        """
        message = Nested(True, None, None, [Inner("a", 1.0)], {"k": 3}, ("p", 9), None, [1, 2])
        header, ids = CODEC.encode(message)
        self.assertEqual(
            header,
            bytes.fromhex(
                "aa a9 02 07 02 00000000 00000001 01 61 3ff0000000000000"
                "00000001 01 6b 00000003 00000001 70 09 7ff8000000000000"
            ),
        )
        self.assertEqual(ids, bytes.fromhex("0000000000000001 0000000000000002"))

    def test_headerEncoders(self) -> None:
        """
        The positional encoders give the same bytes as encoding a message:
        the whole first frame, its start, and the rest after the start.
        """
        header = CODEC.header_encoder(Flat)("n", 1, 2, "l")
        self.assertEqual(header, CODEC.encode_header(Flat("n", 1, 2, "l")))
        start = CODEC.header_start(Flat, "n", 1)
        self.assertEqual(start + CODEC.header_tail_encoder(Flat, 2)(2, "l"), header)
        self.assertRaises(ValueError, CODEC.header_start, Flat, "n", 1, 2, "l", "x")

    def test_prefix(self) -> None:
        """The prefix is signature, id and version, or version first if so declared."""
        self.assertEqual(CODEC.prefix(3), b"\xaa\xa9\x03\x07")
        first: zproto.Codec[Rest] = zproto.Codec(
            [], signature=b"Z", version=2, version_first=True, error=Refused
        )
        self.assertEqual(first.prefix(5), b"Z\x02\x05")

    def test_notAMessage(self) -> None:
        """Encoding an object the codec does not declare is a TypeError."""
        self.assertRaises(TypeError, CODEC.encode, "flat")
        self.assertRaises(TypeError, CODEC.encode_header, 3)

    def test_reservedNames(self) -> None:
        """A field may not take a name the generated functions use."""
        spec = zproto.Spec(1, "BAD", Rest, (("end", "1"),))
        self.assertRaises(ValueError, zproto.Codec, [spec], signature=b"", error=Refused)

    def test_fieldsMustBeTheClasss(self) -> None:
        """A layout that does not set exactly the class's fields is refused when compiled."""
        spec = zproto.Spec(1, "BAD", Rest, (("size", "1"),))
        self.assertRaises(ValueError, zproto.Codec, [spec], signature=b"", error=Refused)


# Text without lone surrogates (which a strict codec cannot encode).
_text = st.text(max_size=20).map(lambda s: s.encode("utf-8", "ignore").decode("utf-8"))
_nested = st.builds(
    Nested,
    st.booleans(),
    st.none() | _text,
    st.none() | st.integers(0, 2**32 - 1),
    st.lists(st.builds(Inner, _text, st.floats(allow_nan=False)), max_size=3),
    st.dictionaries(_text, st.integers(0, 2**32 - 1), max_size=3),
    st.tuples(_text, st.integers(0, 255)),
    st.none() | st.floats(allow_nan=False),
    st.lists(st.integers(0, 2**64 - 1), max_size=3),
)
_flat = st.builds(
    Flat,
    _text,
    st.integers(0, 2**16 - 1),
    st.integers(0, 2**64 - 1),
    _text,
    st.lists(st.binary(max_size=8), max_size=3).map(tuple),
)


class PropertyTests(SynchronousTestCase):
    @given(_flat | _nested)
    def test_roundTrip(self, message: Flat | Nested) -> None:
        """Any message encodes to frames that decode to an equal message."""
        self.assertEqual(CODEC.decode(CODEC.encode(message)), message)

    @given(_flat | _nested, st.data())
    def test_everyCutRefused(self, message: Flat | Nested, data: st.DataObject) -> None:
        """A first frame cut short anywhere raises the codec's error, nothing else."""
        frames = CODEC.encode(message)
        cut = data.draw(st.integers(0, len(frames[0]) - 1))
        self.assertRaises(Refused, CODEC.decode, [frames[0][:cut], *frames[1:]])

    @given(st.lists(st.binary(max_size=40), max_size=3))
    def test_anyBytes(self, frames: list[bytes]) -> None:
        """Arbitrary frames decode or raise the codec's error, nothing else."""
        with contextlib.suppress(Refused):
            CODEC.decode(frames)


class RefusalTests(SynchronousTestCase):
    def assertRefused(self, frames: list[bytes], text: str) -> None:
        with self.assertRaises(Refused) as caught:
            CODEC.decode(frames)
        self.assertEqual(str(caught.exception), text)

    def test_header(self) -> None:
        """No frames, a short frame, a wrong signature, version or id are refused, saying so."""
        self.assertRefused([], "no frames")
        self.assertRefused([b"\xaa\xa9\x01"], "frame of 3 bytes is too short for a header")
        self.assertRefused([b"\xaa\xa8\x01\x07"], "bad signature aaa8")
        self.assertRefused([b"\xaa\xa9\x01\x06"], "version 6, expected 7")
        self.assertRefused([b"\xaa\xa9\x09\x07"], "unknown message id 9")

    def test_fields(self) -> None:
        """Each field that runs past the end, or is not what it must be, is refused by name."""
        flat = CODEC.encode_header(Flat("ab", 1, 2, "cd"))
        self.assertRefused([flat[:4]], "FLAT truncated: no name length")
        self.assertRefused([flat[:6]], "FLAT truncated: name of 2 bytes runs past the end")
        self.assertRefused([flat[:8]], "FLAT truncated: no count")
        self.assertRefused([flat[:-2]], "FLAT truncated: long of 2 bytes runs past the end")
        self.assertRefused([flat + b"\0"], "FLAT has 1 trailing bytes")
        bad = flat[:4] + b"\x01\xff" + flat[6:]
        self.assertRefused([bad], "FLAT name is not valid UTF-8 (ff)")
        self.assertRefused([CODEC.encode_header(Rest(3, b"ab"))], "REST blob: not of its size")
        nested = CODEC.encode(Nested())
        self.assertRefused([nested[0]], "NESTED has 1 frames, not its header and ids")
        self.assertRefused([nested[0], b"\0"], "NESTED ids: not a whole number of ids")
        self.assertRefused([b"\xaa\xa9\x02\x07\x08"], "NESTED flags cannot be 8")
        huge = nested[0][:9] + b"\xff\xff\xff\xff" + nested[0][13:]
        self.assertRefused(
            [huge, nested[1]], "NESTED items count 4294967295 overruns the 17 bytes left"
        )
        self.assertRefused(
            [CODEC.encode_header(Rest()), b""], "REST has 1 unexpected content frames"
        )

    def test_encode(self) -> None:
        """A value that does not fit its field cannot be encoded, and says why."""
        with self.assertRaises(Refused) as caught:
            CODEC.encode(Flat(name="x" * 256))
        self.assertEqual(str(caught.exception), "cannot encode name: 256 bytes, at most 255")
        with self.assertRaises(Refused) as caught:
            CODEC.encode(Flat(count=1 << 16))
        self.assertIn("cannot encode a number: out of range", str(caught.exception))
        with self.assertRaises(Refused) as caught:
            CODEC.encode(Flat(long="\ud800"))
        self.assertIn("not encodable as UTF-8", str(caught.exception))

    def test_wording(self) -> None:
        """A codec words its errors as its L{zproto.Wording} says."""
        codec: zproto.Codec[Rest] = zproto.Codec(
            [zproto.Spec(3, "REST", Rest, (("size", "1"), ("blob", zproto.Rest())))],
            signature=b"",
            error=Refused,
            wording=zproto.Wording(number_past="{name}: {field} (number{width}) is missing"),
        )
        with self.assertRaises(Refused) as caught:
            codec.decode([b"\x03"])
        self.assertEqual(str(caught.exception), "REST: size (number1) is missing")


class LenientTests(SynchronousTestCase):
    def test_lenientKeepsBytes(self) -> None:
        """A lenient codec keeps a string's bytes that are not UTF-8, and gives them back."""
        codec: zproto.Codec[Inner] = zproto.Codec(
            [zproto.Spec(1, "INNER", Inner, (("label", "s"), ("weight", "d")))],
            signature=b"",
            error=Refused,
        )
        frame = b"\x01\x02\xffa" + bytes(8)
        message = codec.decode_frame(frame)
        self.assertEqual(message.label, "\udcffa")
        self.assertEqual(codec.encode_header(message), frame)
