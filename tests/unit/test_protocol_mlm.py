"""
Tests for L{malamute_pack.protocol.mlm}: the reference vectors byte for byte,
round trips of arbitrary messages, and every kind of malformed input.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from tests.support import SHARED

VECTORS = SHARED / "vectors" / "mlm_proto.jsonl"


def _load_vectors() -> list[dict[str, object]]:
    return [json.loads(line) for line in VECTORS.read_text().splitlines() if line.strip()]


def _expected_fields(vector: dict[str, object]) -> dict[str, object]:
    raw = vector["fields"]
    assert isinstance(raw, dict)
    result = dict(raw)
    if "content" in result:
        content = result["content"]
        assert isinstance(content, list)
        result["content"] = [bytes.fromhex(h) for h in content]
    return result


class VectorTests(SynchronousTestCase):
    def test_vectorsPresent(self) -> None:
        """
        The shared vector file exists and covers every message id the
        server and client exchange (1-18).
        """
        ids = {v["id"] for v in _load_vectors()}
        self.assertEqual(ids, set(range(1, 19)))

    def test_decodeMatchesFields(self) -> None:
        """
        Every vector's frames decode to a message of its id whose fields are
        exactly the vector's fields.
        """
        for vector in _load_vectors():
            frames = [bytes.fromhex(h) for h in vector["frames"]]  # type: ignore[attr-defined]
            message = mlm.decode(frames)
            self.assertEqual(message.ID, vector["id"], vector["label"])
            self.assertEqual(mlm.MESSAGE_NAMES[message.ID], vector["name"])
            self.assertEqual(mlm.message_fields(message), _expected_fields(vector), vector["label"])

    def test_encodeMatchesFrames(self) -> None:
        """
        Every vector's fields encode to the vector's frames, byte for byte.
        """
        for vector in _load_vectors():
            cls = mlm.MESSAGE_TYPES[vector["id"]]  # type: ignore[index]
            message = cls(**_expected_fields(vector))
            self.assertEqual(
                [f.hex() for f in mlm.encode(message)], vector["frames"], vector["label"]
            )


_text = st.text(max_size=40).filter(lambda s: len(s.encode("utf-8", "surrogateescape")) <= 255)
_content = st.lists(st.binary(max_size=64), max_size=4)


@st.composite
def _messages(draw: st.DrawFn) -> mlm.Message:
    cls = draw(st.sampled_from(sorted(mlm.MESSAGE_TYPES.values(), key=lambda c: c.ID)))
    kwargs: dict[str, object] = {}
    for name, kind in cls.LAYOUT:
        if kind == "s":
            kwargs[name] = draw(_text)
        else:
            kwargs[name] = draw(st.integers(0, (1 << (8 * int(kind))) - 1))
    if cls.HAS_CONTENT:
        kwargs["content"] = draw(_content)
    return cls(**kwargs)


class RoundTripTests(SynchronousTestCase):
    @given(_messages())
    def test_roundTrip(self, message: mlm.Message) -> None:
        """
        Any message encodes to frames that decode to an equal message.
        """
        self.assertEqual(mlm.decode(mlm.encode(message)), message)

    @given(st.binary(max_size=30))
    def test_subjectBytesPreserved(self, raw: bytes) -> None:
        """
        A subject that is not valid UTF-8 decodes and re-encodes to the
        same bytes, so nothing a C client sends is altered.
        """
        frame = b"\xaa\xa8\x07" + bytes((len(raw),)) + raw
        self.assertEqual(mlm.encode(mlm.decode([frame])), [frame])


class MalformedTests(SynchronousTestCase):
    def assertMalformed(self, frames: list[bytes], fragment: str) -> None:
        with self.assertRaises(mlm.MalformedMessage) as ctx:
            mlm.decode(frames)
        self.assertIn(fragment, str(ctx.exception))

    def test_noFrames(self) -> None:
        """An empty message is malformed."""
        self.assertMalformed([], "no frames")

    def test_shortFrame(self) -> None:
        """A header frame shorter than signature plus id is malformed."""
        self.assertMalformed([b"\xaa\xa8"], "too short")

    def test_wrongSignature(self) -> None:
        """A header that does not start with AA A8 is malformed."""
        self.assertMalformed([b"\xaa\xa1\x02"], "signature")

    def test_unknownId(self) -> None:
        """An id outside 1-35 is malformed."""
        self.assertMalformed([b"\xaa\xa8\x24"], "unknown message id 36")
        self.assertMalformed([b"\xaa\xa8\x00"], "unknown message id 0")

    def test_stringPastEnd(self) -> None:
        """A string length that runs past the end of the frame is malformed."""
        self.assertMalformed([b"\xaa\xa8\x05\x09abc"], "runs past the end")

    def test_missingString(self) -> None:
        """A frame that ends where a string length should be is malformed."""
        self.assertMalformed([b"\xaa\xa8\x05"], "runs past the end")

    def test_numberPastEnd(self) -> None:
        """A number that runs past the end of the frame is malformed."""
        self.assertMalformed([b"\xaa\xa8\x10\x01"], "number2 runs past the end")
        self.assertMalformed([b"\xaa\xa8\x09\x00\x00\x00\x00\x00"], "number4 runs past the end")
        self.assertMalformed([b"\xaa\xa8\x19" + bytes(7)], "number8 runs past the end")

    def test_version2Layout(self) -> None:
        """
        A version 2 message encodes its number8 fields big-endian in eight
        bytes, between the string fields, and content as further frames.
        """
        frames = mlm.encode(mlm.StreamRecord("s", "w", "t", 258, 1, [b"x"]))
        self.assertEqual(
            frames,
            [
                b"\xaa\xa8\x14\x01s\x01w\x01t" + (258).to_bytes(8, "big") + (1).to_bytes(8, "big"),
                b"x",
            ],
        )

    def test_trailingBytes(self) -> None:
        """Bytes after the last field are malformed."""
        self.assertMalformed([b"\xaa\xa8\x02\x00"], "1 trailing bytes")

    def test_contentOnContentlessMessage(self) -> None:
        """Content frames on a message that has none are malformed."""
        self.assertMalformed([b"\xaa\xa8\x02", b"x"], "carries no content")

    def test_encodeLongString(self) -> None:
        """A string over 255 bytes cannot be encoded and says so."""
        with self.assertRaises(mlm.MalformedMessage):
            mlm.encode(mlm.StreamWrite(stream="x" * 256))

    def test_encodeNumberOutOfRange(self) -> None:
        """A number too large for its field cannot be encoded and says so."""
        with self.assertRaises(mlm.MalformedMessage):
            mlm.encode(mlm.Credit(amount=70000))


class HeaderEncoderTests(SynchronousTestCase):
    @given(_messages())
    def test_headerEncoderMatchesEncode(self, message: mlm.Message) -> None:
        """
        The header encoder of a message's class, given its field values in
        wire order, encodes the same frame 1 as encoding the message.
        """
        values = [getattr(message, name) for name, _ in message.LAYOUT]
        self.assertEqual(mlm.header_encoder(type(message))(*values), mlm.encode(message)[0])

    @given(_messages(), st.integers(min_value=0, max_value=6))
    def test_startAndTail(self, message: mlm.Message, split: int) -> None:
        """
        A header's start (its first fields) followed by the tail encoder's
        output for the remaining fields is the whole header.
        """
        values = [getattr(message, name) for name, _ in message.LAYOUT]
        split = min(split, len(values))
        start = mlm.header_start(type(message), *values[:split])
        tail = mlm.header_tail_encoder(type(message), split)(*values[split:])
        self.assertEqual(start + tail, mlm.encode(message)[0])

    def test_encoderRefusesBadValues(self) -> None:
        """Field-level encoders refuse a string over 255 bytes and a number out of range."""
        with self.assertRaises(mlm.MalformedMessage):
            mlm.header_encoder(mlm.StreamSend)("x" * 256)
        with self.assertRaises(mlm.MalformedMessage):
            mlm.header_tail_encoder(mlm.Done, 0)(-1, 200, "")
        with self.assertRaises(mlm.MalformedMessage):
            mlm.header_start(mlm.Credit, 70000)
        with self.assertRaises(ValueError):
            mlm.header_start(mlm.Credit, 1, 2)


class MessageIdTests(SynchronousTestCase):
    @given(_messages())
    def test_messageIdIsTheClassId(self, message: mlm.Message) -> None:
        """The message id read from encoded frames is the id of the message's class."""
        self.assertEqual(mlm.message_id(mlm.encode(message)), type(message).ID)

    def test_messageIdRefusesNonHeaders(self) -> None:
        """No frame, a frame too short for a header, or a wrong signature is malformed."""
        for frames in ([], [b""], [b"\xaa\xa8"], [b"\xaa\xa9\x01"], [b"GET / HTTP/1.1"]):
            self.assertRaises(mlm.MalformedMessage, mlm.message_id, frames)


class CheckedDecodeTests(SynchronousTestCase):
    def test_validTextDecodes(self) -> None:
        """A message whose strings are UTF-8 decodes the same, checked or not."""
        frames = mlm.encode(mlm.MailboxSend("bob", "héllo", "t", 5, [b"\xff"]))
        self.assertEqual(mlm.decode_checked(frames), mlm.decode(frames))

    def test_invalidTextRaisesWithTheMessage(self) -> None:
        """
        A string that is not valid UTF-8 raises InvalidText naming the first
        such field and its bytes, and carrying the message decoded anyway.
        """
        frame = b"\xaa\xa8\x06\x04\xffbad\x03\xfe.x"  # STREAM_READ, both strings bad
        with self.assertRaises(mlm.InvalidText) as raised:
            mlm.decode_checked([frame])
        error = raised.exception
        self.assertEqual(error.field, "stream")
        self.assertIn("invalid stream: not valid UTF-8 (ff 62 61 64)", str(error))
        self.assertEqual(mlm.encode(error.message), [frame])
        self.assertIsInstance(error, mlm.MalformedMessage)

    def test_structureCheckedFirst(self) -> None:
        """A message that is malformed as well is reported as malformed."""
        with self.assertRaises(mlm.MalformedMessage) as raised:
            mlm.decode_checked([b"\xaa\xa8\x05\x09\xff"])
        self.assertNotIsInstance(raised.exception, mlm.InvalidText)

    @given(st.binary(max_size=30))
    def test_checkedMatchesUtf8(self, raw: bytes) -> None:
        """A subject is refused by the checked decoder exactly when it is not UTF-8."""
        frame = b"\xaa\xa8\x07" + bytes((len(raw),)) + raw
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            self.assertRaises(mlm.InvalidText, mlm.decode_checked, [frame])
        else:
            self.assertEqual(mlm.decode_checked([frame]), mlm.decode([frame]))
