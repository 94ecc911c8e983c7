"""
Tests for L{malamute_pack.protocol.zre}: the HELLO captured from C zyre,
each message's and beacon's bytes written out by hand from RFC 36, round
trips of arbitrary messages, every kind of malformed input, and that
decoding arbitrary bytes raises nothing but the codec's Malformed errors.
"""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import zre
from malamute_pack.protocol.zre import (
    Beacon,
    Goodbye,
    Hello,
    Join,
    Leave,
    MalformedBeacon,
    MalformedZre,
    Ping,
    PingOk,
    Shout,
    Whisper,
    ZreMessage,
)


def _hex(text: str) -> bytes:
    return bytes.fromhex(text)


def _ascii(text: str) -> str:
    return text.encode().hex()


# The HELLO C zyre (v2.0.1) sent, as captured between two namespaces.
C_ZYRE_HELLO = _hex(
    "aaa1 01 02 0001 15"
    + _ascii("tcp://10.77.0.1:42191")
    + "00000001 00000004"
    + _ascii("CHAT")
    + "01 01"
    + _ascii("A")
    + "00000001 06"
    + _ascii("X-ROLE")
    + "00000006"
    + _ascii("broker")
)

UUID = bytes(range(16))

# (message, frames as hex), written out by hand from RFC 36.
VECTORS: list[tuple[ZreMessage, list[str]]] = [
    (Hello(1, "", (), 0, "", ()), ["aa a1 01 02 00 01  00  00 00 00 00  00  00  00 00 00 00"]),
    (
        Hello(7, "e", ("g", "hh"), 3, "n", (("k", "v"),)),
        ["aa a1 01 02 00 07  01 65  00 00 00 02  00 00 00 01 67  00 00 00 02 68 68  03  01 6e"
         "  00 00 00 01  01 6b  00 00 00 01 76"],
    ),
    (Whisper(2, (b"a", b"")), ["aa a1 02 02 00 02", "61", ""]),
    (Whisper(65535, ()), ["aa a1 02 02 ff ff"]),
    (Shout(3, "grp", (b"xy",)), ["aa a1 03 02 00 03  03 67 72 70", "78 79"]),
    (Join(4, "g", 1), ["aa a1 04 02 00 04  01 67  01"]),
    (Leave(5, "g", 255), ["aa a1 05 02 00 05  01 67  ff"]),
    (Ping(6), ["aa a1 06 02 00 06"]),
    (PingOk(0), ["aa a1 07 02 00 00"]),
    (Goodbye(258), ["aa a1 0a 02 01 02"]),
    # Lengths count UTF-8 bytes: e-acute is two, the euro sign three.
    (Join(1, "\u00e9", 2), ["aa a1 04 02 00 01  02 c3 a9  02"]),
    (
        Hello(1, "", ("\u20ac",), 0, "\u00e9", (("\u00e9", "\u20ac"),)),
        ["aa a1 01 02 00 01  00  00 00 00 01  00 00 00 03 e2 82 ac  00  02 c3 a9"
         "  00 00 00 01  02 c3 a9  00 00 00 03 e2 82 ac"],
    ),
]  # fmt: skip


class CapturedTests(SynchronousTestCase):
    def test_cZyreHello(self) -> None:
        """The HELLO captured from C zyre decodes to the values it carries."""
        self.assertEqual(
            zre.decode([C_ZYRE_HELLO]),
            Hello(
                sequence=1,
                endpoint="tcp://10.77.0.1:42191",
                groups=("CHAT",),
                status=1,
                name="A",
                headers=(("X-ROLE", "broker"),),
            ),
        )

    def test_cZyreHelloReencodes(self) -> None:
        """The captured HELLO, decoded and encoded again, is the same bytes."""
        self.assertEqual(zre.encode(zre.decode([C_ZYRE_HELLO])), [C_ZYRE_HELLO])


class VectorTests(SynchronousTestCase):
    def test_encode(self) -> None:
        """Every message encodes to exactly the frames RFC 36 gives."""
        for message, frames in VECTORS:
            self.assertEqual(zre.encode(message), [_hex(f) for f in frames], message)

    def test_decode(self) -> None:
        """Every hand-written message decodes to its message."""
        for message, frames in VECTORS:
            self.assertEqual(zre.decode([_hex(f) for f in frames]), message)

    def test_messagesFrozen(self) -> None:
        """Messages are immutable values."""
        message = Ping(1)
        with self.assertRaises(AttributeError):
            message.sequence = 2  # type: ignore[misc]

    def test_resequence(self) -> None:
        """Resequencing replaces only the sequence number, keeping content frames."""
        frames = zre.encode(Shout(0, "grp", (b"a", b"b")))
        self.assertEqual(zre.resequence(frames, 513), zre.encode(Shout(513, "grp", (b"a", b"b"))))

    def test_header(self) -> None:
        """The header is signature, id, version 2 and the sequence big-endian."""
        self.assertEqual(zre.header(3, 0x1234), _hex("aa a1 03 02 12 34"))


class EncodeErrorTests(SynchronousTestCase):
    def test_longString(self) -> None:
        """A string of more than 255 UTF-8 bytes cannot be encoded."""
        self.assertRaises(MalformedZre, zre.encode, Join(1, "x" * 256, 1))
        self.assertRaises(MalformedZre, zre.encode, Shout(1, "\u00e9" * 128, ()))
        zre.encode(Join(1, "x" * 255, 1))

    def test_sequenceRange(self) -> None:
        """A sequence outside 0..65535 cannot be encoded."""
        self.assertRaises(MalformedZre, zre.encode, Ping(65536))
        self.assertRaises(MalformedZre, zre.encode, Ping(-1))

    def test_statusRange(self) -> None:
        """A status outside 0..255 cannot be encoded."""
        self.assertRaises(MalformedZre, zre.encode, Join(1, "g", 256))
        self.assertRaises(MalformedZre, zre.encode, Hello(1, "", (), -1, "", ()))

    def test_surrogate(self) -> None:
        """A string with a lone surrogate cannot be encoded."""
        self.assertRaises(MalformedZre, zre.encode, Join(1, "\ud800", 1))


class MalformedTests(SynchronousTestCase):
    def assertMalformed(self, frames: list[bytes], reason: str) -> None:
        with self.assertRaises(MalformedZre) as caught:
            zre.decode(frames)
        self.assertIn(reason, str(caught.exception))

    def test_noFrames(self) -> None:
        """No frames at all is malformed."""
        self.assertMalformed([], "no frames")

    def test_shortHeader(self) -> None:
        """A first frame shorter than the header is malformed."""
        self.assertMalformed([_hex("aa a1 06 02 00")], "too short")

    def test_signature(self) -> None:
        """A wrong signature (zgossip's, say) is malformed."""
        self.assertMalformed([_hex("aa a0 06 02 00 01")], "signature")

    def test_unknownId(self) -> None:
        """Ids outside the protocol (0, the draft ELECT 8, 11) are malformed."""
        for ident in (0, 8, 9, 11, 255):
            self.assertMalformed([bytes((0xAA, 0xA1, ident, 2, 0, 1))], "unknown message id")

    def test_version(self) -> None:
        """A version other than 2 is malformed."""
        self.assertMalformed([_hex("aa a1 06 01 00 01")], "version 1")

    def test_trailing(self) -> None:
        """Bytes after the body are malformed."""
        self.assertMalformed([_hex("aa a1 06 02 00 01 00")], "trailing")
        self.assertMalformed([_hex("aa a1 04 02 00 01 01 67 01 00")], "trailing")

    def test_truncated(self) -> None:
        """A body that stops short is malformed."""
        self.assertMalformed([_hex("aa a1 04 02 00 01 05 67")], "truncated")
        self.assertMalformed([_hex("aa a1 04 02 00 01 01 67")], "truncated")
        self.assertMalformed([C_ZYRE_HELLO[:-1]], "truncated")

    def test_countOverruns(self) -> None:
        """A group or header count larger than the bytes left could hold is malformed."""
        self.assertMalformed([_hex("aa a1 01 02 00 01 00 ff ff ff ff")], "overruns")
        self.assertMalformed(
            [_hex("aa a1 01 02 00 01 00 00 00 00 00 00 00 00 00 00 02 00 00 00 00 00")],
            "overruns",
        )

    def test_notUtf8(self) -> None:
        """A string that is not UTF-8 is malformed."""
        self.assertMalformed([_hex("aa a1 04 02 00 01 01 ff 01")], "UTF-8")

    def test_contentOnBareMessage(self) -> None:
        """Extra frames after a message that carries no content are malformed."""
        self.assertMalformed([_hex("aa a1 06 02 00 01"), b"x"], "content")


_text = st.text(max_size=40).filter(lambda s: len(s.encode("utf-8")) <= 255)
_content = st.lists(st.binary(max_size=20), max_size=4).map(tuple)
_seq = st.integers(0, 65535)
_status = st.integers(0, 255)

_messages: st.SearchStrategy[ZreMessage] = st.one_of(
    st.builds(
        Hello,
        _seq,
        _text,
        st.lists(st.text(max_size=20), max_size=4).map(tuple),
        _status,
        _text,
        st.lists(st.tuples(_text, st.text(max_size=20)), max_size=4).map(tuple),
    ),
    st.builds(Whisper, _seq, _content),
    st.builds(Shout, _seq, _text, _content),
    st.builds(Join, _seq, _text, _status),
    st.builds(Leave, _seq, _text, _status),
    st.builds(Ping, _seq),
    st.builds(PingOk, _seq),
    st.builds(Goodbye, _seq),
)


class PropertyTests(SynchronousTestCase):
    @given(_messages)
    def test_roundTrip(self, message: ZreMessage) -> None:
        """Every encodable message decodes back to itself."""
        self.assertEqual(zre.decode(zre.encode(message)), message)

    @given(st.lists(st.binary(max_size=64), max_size=3))
    def test_arbitraryFrames(self, frames: list[bytes]) -> None:
        """Arbitrary frames decode or raise MalformedZre, nothing else."""
        with contextlib.suppress(MalformedZre):
            zre.decode(frames)

    @given(st.sampled_from([1, 2, 3, 4, 5, 6, 7, 10, 8, 0]), st.binary(max_size=64))
    def test_arbitraryBodies(self, ident: int, body: bytes) -> None:
        """Arbitrary bodies behind a valid header decode or raise MalformedZre."""
        with contextlib.suppress(MalformedZre):
            zre.decode([bytes((0xAA, 0xA1, ident, 2, 0, 1)) + body])

    @given(st.binary(max_size=80))
    def test_arbitraryBeacons(self, data: bytes) -> None:
        """Arbitrary datagrams decode as beacons or raise MalformedBeacon."""
        with contextlib.suppress(MalformedBeacon):
            zre.decode_beacon(data)

    @given(st.binary(min_size=16, max_size=16), st.integers(0, 65535))
    def test_beaconRoundTrip(self, uuid: bytes, port: int) -> None:
        """Every beacon decodes back to itself, with or without a key."""
        for beacon in (Beacon(uuid, port), Beacon(uuid, port, bytes(range(32)))):
            self.assertEqual(zre.decode_beacon(zre.encode_beacon(beacon)), beacon)


class BeaconTests(SynchronousTestCase):
    def test_encode(self) -> None:
        """A v1 beacon is ZRE 01, the uuid and the port big-endian: 22 bytes."""
        self.assertEqual(
            zre.encode_beacon(Beacon(UUID, 0x1234)),
            b"ZRE\x01" + UUID + b"\x12\x34",
        )

    def test_encodeCurve(self) -> None:
        """A CURVE beacon is ZRE 03, the uuid, the port and the key: 54 bytes."""
        key = bytes(range(100, 132))
        data = zre.encode_beacon(Beacon(UUID, 5670, key))
        self.assertEqual(data, b"ZRE\x03" + UUID + b"\x16\x26" + key)
        self.assertEqual(len(data), 54)

    def test_decode(self) -> None:
        """Both forms decode; port 0 is a departure beacon."""
        self.assertEqual(zre.decode_beacon(b"ZRE\x01" + UUID + b"\x00\x00"), Beacon(UUID, 0))
        key = b"k" * 32
        self.assertEqual(
            zre.decode_beacon(b"ZRE\x03" + UUID + b"\x00\x01" + key), Beacon(UUID, 1, key)
        )

    def test_decodeRefuses(self) -> None:
        """Wrong sizes, prefixes, and versions that do not match the size are refused."""
        for data in (
            b"",
            b"ZRE",
            b"ZRE\x01" + UUID,
            b"ZRE\x01" + UUID + b"\x00\x01\x00",
            b"ZRF\x01" + UUID + b"\x00\x01",
            b"ZRE\x02" + UUID + b"\x00\x01",
            b"ZRE\x03" + UUID + b"\x00\x01",
            b"ZRE\x01" + UUID + b"\x00\x01" + b"k" * 32,
        ):
            self.assertRaises(MalformedBeacon, zre.decode_beacon, data)

    def test_encodeRefuses(self) -> None:
        """A uuid not of 16 bytes, a port out of range or a short key cannot be encoded."""
        self.assertRaises(MalformedBeacon, zre.encode_beacon, Beacon(b"x", 1))
        self.assertRaises(MalformedBeacon, zre.encode_beacon, Beacon(UUID, 65536))
        self.assertRaises(MalformedBeacon, zre.encode_beacon, Beacon(UUID, 1, b"k"))

    def test_malformedAreValueErrors(self) -> None:
        """Both Malformed errors are ValueErrors."""
        self.assertTrue(issubclass(MalformedBeacon, ValueError))
        self.assertTrue(issubclass(MalformedZre, ValueError))
