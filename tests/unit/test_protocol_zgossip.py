"""
Tests for L{malamute_pack.protocol.zgossip}: each message's bytes written
out by hand from the protocol, round trips of arbitrary messages, every
kind of malformed frame, and that decoding arbitrary bytes raises nothing
but L{zgossip.MalformedGossip}.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import zgossip
from malamute_pack.protocol.zgossip import (
    GossipMessage,
    Hello,
    Invalid,
    MalformedGossip,
    Ping,
    Pong,
    Publish,
)

# A Zyre node's tuple: its uuid as 32 uppercase hex characters, its inbox.
ZYRE_KEY = "0123456789ABCDEF0123456789ABCDEF"
ZYRE_VALUE = "tcp://10.77.0.1:42191"

# (message, frame as hex), written out by hand from the protocol.
VECTORS: list[tuple[GossipMessage, str]] = [
    (Hello(), "aa a0 01 01"),
    (Ping(), "aa a0 03 01"),
    (Pong(), "aa a0 04 01"),
    (Invalid(), "aa a0 05 01"),
    (Publish("k", "v"), "aa a0 02 01  01 6b  00 00 00 01 76  00 00 00 00"),
    (Publish("", ""), "aa a0 02 01  00  00 00 00 00  00 00 00 00"),
    (Publish("ab", "xyz", 7), "aa a0 02 01  02 61 62  00 00 00 03 78 79 7a  00 00 00 07"),
    # Lengths count UTF-8 bytes: e-acute is two, the euro sign three.
    (Publish("\u00e9", "\u20ac"), "aa a0 02 01  02 c3 a9  00 00 00 03 e2 82 ac  00 00 00 00"),
    (
        Publish(ZYRE_KEY, ZYRE_VALUE),
        "aa a0 02 01  20" + ZYRE_KEY.encode().hex() + "00 00 00 15" + ZYRE_VALUE.encode().hex()
        + "00 00 00 00",
    ),
]  # fmt: skip


class VectorTests(SynchronousTestCase):
    def test_encode(self) -> None:
        """Every message encodes to exactly the bytes the protocol gives."""
        for message, frame in VECTORS:
            self.assertEqual(zgossip.encode(message), bytes.fromhex(frame), message)

    def test_decode(self) -> None:
        """Every hand-written frame decodes to its message."""
        for message, frame in VECTORS:
            self.assertEqual(zgossip.decode(bytes.fromhex(frame)), message)

    def test_ttlDefaultsToZero(self) -> None:
        """A PUBLISH made without a ttl carries 0, as CZMQ always sends."""
        self.assertEqual(Publish("k", "v").ttl, 0)

    def test_messagesFrozen(self) -> None:
        """Messages are immutable values (shared instances are safe)."""
        message = Publish("k", "v")
        with self.assertRaises(AttributeError):
            message.key = "other"  # type: ignore[misc]


# Any Unicode scalar value (1 to 4 UTF-8 bytes), lone surrogates excluded.
# Built from code points rather than st.text(), whose character tables take
# seconds to build in a fresh Hypothesis directory (trial's temp directory).
_char = st.one_of(st.integers(0, 0xD7FF), st.integers(0xE000, 0x10FFFF)).map(chr)


def _text(max_size: int) -> st.SearchStrategy[str]:
    return st.lists(_char, max_size=max_size).map("".join)


@st.composite
def _publishes(draw: st.DrawFn) -> Publish:
    key = draw(_text(80).filter(lambda s: len(s.encode("utf-8")) <= 255))
    value = draw(_text(300))
    return Publish(key, value, draw(st.integers(0, 0xFFFFFFFF)))


_messages = st.one_of(st.sampled_from([Hello(), Ping(), Pong(), Invalid()]), _publishes())


class RoundTripTests(SynchronousTestCase):
    @given(_messages)
    def test_roundTrip(self, message: GossipMessage) -> None:
        """Any message encodes to a frame that decodes to an equal message."""
        self.assertEqual(zgossip.decode(zgossip.encode(message)), message)

    @given(st.binary(max_size=64))
    def test_decodeRaisesOnlyMalformed(self, frame: bytes) -> None:
        """Decoding arbitrary bytes gives a message or raises MalformedGossip, nothing else."""
        try:
            message = zgossip.decode(frame)
        except MalformedGossip:
            return
        self.assertEqual(zgossip.encode(message), frame)

    @given(st.sampled_from([1, 2, 3, 4, 5, 6, 0, 255]), st.binary(max_size=64))
    def test_decodeAfterValidHeader(self, ident: int, body: bytes) -> None:
        """
        Arbitrary bodies behind a valid header (where the parser does its
        real work) also give a message or raise MalformedGossip only, and
        whatever decodes re-encodes to the same bytes.
        """
        frame = b"\xaa\xa0" + bytes((ident, 1)) + body
        try:
            message = zgossip.decode(frame)
        except MalformedGossip:
            return
        self.assertEqual(zgossip.encode(message), frame)


class MalformedTests(SynchronousTestCase):
    def assertMalformed(self, frame: str, fragment: str) -> None:
        with self.assertRaises(MalformedGossip) as ctx:
            zgossip.decode(bytes.fromhex(frame))
        self.assertIn(fragment, str(ctx.exception))

    def test_isValueError(self) -> None:
        """MalformedGossip is a ValueError, for callers that catch those."""
        self.assertTrue(issubclass(MalformedGossip, ValueError))

    def test_empty(self) -> None:
        """An empty frame is malformed."""
        self.assertMalformed("", "too short")

    def test_shortHeader(self) -> None:
        """A frame shorter than the four header bytes is malformed."""
        self.assertMalformed("aa a0 01", "too short")

    def test_badSignature(self) -> None:
        """A ZRE signature (AA A1) or any other is refused."""
        self.assertMalformed("aa a1 01 01", "signature")
        self.assertMalformed("00 00 01 01", "signature")

    def test_unknownId(self) -> None:
        """Ids 0 and 6 and above are unknown."""
        self.assertMalformed("aa a0 00 01", "unknown message id 0")
        self.assertMalformed("aa a0 06 01", "unknown message id 6")

    def test_wrongVersion(self) -> None:
        """Only version 1 is spoken."""
        self.assertMalformed("aa a0 01 02", "version 2")
        self.assertMalformed("aa a0 02 00 01 6b 00 00 00 01 76 00 00 00 00", "version 0")

    def test_trailingOnBare(self) -> None:
        """A message without a body that has bytes after its header is malformed."""
        self.assertMalformed("aa a0 03 01 00", "PING has 1 trailing bytes")

    def test_trailingOnPublish(self) -> None:
        """A PUBLISH with bytes after its ttl is malformed."""
        self.assertMalformed("aa a0 02 01 01 6b 00 00 00 01 76 00 00 00 00 ff", "trailing")

    def test_truncatedPublish(self) -> None:
        """A PUBLISH cut anywhere in its body is malformed, saying where."""
        self.assertMalformed("aa a0 02 01", "no key length")
        self.assertMalformed("aa a0 02 01 05 6b", "key of 5 bytes")
        self.assertMalformed("aa a0 02 01 01 6b 00 00", "no value length")
        self.assertMalformed("aa a0 02 01 01 6b 00 00 00 09 76", "value of 9 bytes")
        self.assertMalformed("aa a0 02 01 01 6b 00 00 00 01 76 00 00", "no ttl")

    def test_nonUtf8(self) -> None:
        """A key or value that is not valid UTF-8 is malformed."""
        self.assertMalformed("aa a0 02 01 01 ff 00 00 00 01 76 00 00 00 00", "key is not valid")
        self.assertMalformed("aa a0 02 01 01 6b 00 00 00 01 c3 00 00 00 00", "value is not valid")


class EncodeRefusalTests(SynchronousTestCase):
    def test_keyTooLong(self) -> None:
        """A key over 255 UTF-8 bytes cannot be encoded, even if 255 characters or fewer."""
        zgossip.encode(Publish("k" * 255, ""))
        with self.assertRaises(MalformedGossip) as ctx:
            zgossip.encode(Publish("\u00e9" * 128, ""))
        self.assertIn("256 bytes", str(ctx.exception))

    def test_ttlOutOfRange(self) -> None:
        """A ttl that is not a u32 cannot be encoded."""
        for ttl in (-1, 1 << 32):
            self.assertRaises(MalformedGossip, zgossip.encode, Publish("k", "v", ttl))

    def test_surrogates(self) -> None:
        """A string with a lone surrogate (not UTF-8 encodable) cannot be encoded."""
        self.assertRaises(MalformedGossip, zgossip.encode, Publish("\udcff", "v"))
        self.assertRaises(MalformedGossip, zgossip.encode, Publish("k", "\ud800"))
