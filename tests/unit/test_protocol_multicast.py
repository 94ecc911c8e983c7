"""Tests for L{malamute_pack.protocol.multicast}, the multicast bridge's codec."""

from __future__ import annotations

import contextlib
import struct

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial import unittest

from malamute_pack.protocol import multicast
from malamute_pack.protocol.multicast import Header, MalformedBridgeMessage

_names = st.text(max_size=40)
_headers = st.builds(
    Header,
    origin=st.text(min_size=1, max_size=60),
    stream=st.text(min_size=1, max_size=60),
    seq=st.integers(2, 2**64 - 1),
    prev=st.just(1),
    timestamp=st.integers(0, 2**64 - 1),
    endpoint=_names,
    pattern=_names,
    sender=_names,
    subject=_names,
    beat=st.just(False),
)


def _sample(**changes: object) -> Header:
    fields: dict[str, object] = dict(
        origin="a1b2",
        stream="weather",
        seq=7,
        prev=5,
        timestamp=1_700_000_000_000_000,
        endpoint="tcp://10.0.0.1:9999",
        pattern="temp.*",
        sender="station",
        subject="temp.paris",
    )
    fields.update(changes)
    return Header(**fields)  # type: ignore[arg-type]


class RoundTripTests(unittest.TestCase):
    @given(_headers, st.lists(st.binary(max_size=50), max_size=4))
    def test_round_trip(self, header: Header, content: list[bytes]) -> None:
        """Any header and content decode to what was encoded."""
        self.assertEqual(multicast.decode(multicast.encode(header, content)), (header, content))

    def test_layout(self) -> None:
        """The header is the signature, version, three numbers, then six strings."""
        frames = multicast.encode(_sample(), [b"21C"])
        fixed = struct.pack(">2sBQQQ", b"MB", 1, 7, 5, 1_700_000_000_000_000)
        strings = [b"a1b2", b"tcp://10.0.0.1:9999", b"weather", b"temp.*", b"station"]
        strings.append(b"temp.paris")
        expected = fixed + b"".join(bytes((len(s),)) + s for s in strings)
        self.assertEqual(frames, [expected, b"21C"])

    def test_source_once(self) -> None:
        """A header built from an encoded source part is the same as one encoded whole."""
        header = _sample()
        source = multicast.encode_source("a1b2", "tcp://10.0.0.1:9999", "weather", "temp.*")
        frame = multicast.encode_header(
            source, 7, 5, header.timestamp, header.sender, header.subject
        )
        self.assertEqual(frame, multicast.encode(header, [])[0])

    def test_beat(self) -> None:
        """
        A beat is one frame: the record header's layout with the signature
        "MH", the last number published, no previous, sender or subject.
        """
        beat = _sample(seq=9, prev=0, sender="", subject="", beat=True)
        [frame] = multicast.encode(beat, [])
        self.assertEqual(frame[:2], b"MH")
        self.assertEqual(frame[2:], multicast.encode(beat._replace(beat=False), [])[0][2:])
        self.assertEqual(multicast.decode([frame]), (beat, []))
        self.assertTrue(frame.startswith(multicast.PREFIX))

    def test_long_string(self) -> None:
        """A string longer than 255 bytes cannot be encoded."""
        self.assertRaises(ValueError, multicast.encode, _sample(subject="s" * 256), [])


class MalformedTests(unittest.TestCase):
    def _refused(self, frame: bytes, reason: str) -> None:
        error = self.assertRaises(MalformedBridgeMessage, multicast.decode, [frame])
        self.assertIn(reason, str(error))

    def test_truncated(self) -> None:
        """Every truncation of a header is refused."""
        frame = multicast.encode(_sample(), [])[0]
        for end in range(len(frame)):
            self.assertRaises(MalformedBridgeMessage, multicast.decode_header, frame[:end])

    def test_trailing(self) -> None:
        """Bytes after the last string are refused."""
        self._refused(multicast.encode(_sample(), [])[0] + b"x", "after the header")

    def test_signature(self) -> None:
        """Another signature is refused."""
        self._refused(b"XX" + multicast.encode(_sample(), [])[0][2:], "signature")

    def test_version(self) -> None:
        """Another version is refused, naming both."""
        frame = multicast.encode(_sample(), [])[0]
        self._refused(frame[:2] + b"\x09" + frame[3:], "version 9: this broker speaks version 1")

    def test_numbers(self) -> None:
        """A sequence number of 0, or a previous number not below it, is refused."""
        self._refused(multicast.encode(_sample(seq=0, prev=0), [])[0], "sequence number 0")
        self._refused(multicast.encode(_sample(seq=5, prev=5), [])[0], "sequence number 5")

    def test_not_utf8(self) -> None:
        """A string that is not UTF-8 is refused."""
        frame = multicast.encode(_sample(subject="ab"), [])[0]
        self._refused(frame[:-2] + b"\xff\xfe", "UTF-8")

    def test_empty_names(self) -> None:
        """A header without its origin or its stream is refused."""
        self._refused(multicast.encode(_sample(origin=""), [])[0], "origin or stream")
        self._refused(multicast.encode(_sample(stream=""), [])[0], "origin or stream")

    def test_beat_with_a_record(self) -> None:
        """A beat that names a record (previous, sender, subject) or carries content is refused."""
        for fields in ({"prev": 3}, {"sender": "x"}, {"subject": "y"}):
            beat = _sample(seq=9, prev=0, sender="", subject="", beat=True)._replace(**fields)
            source = multicast.encode_source(beat.origin, beat.endpoint, beat.stream, beat.pattern)
            frame = (
                b"MH"
                + multicast.encode_header(
                    source, beat.seq, beat.prev, beat.timestamp, beat.sender, beat.subject
                )[2:]
            )
            self._refused(frame, "a beat names no record")
        [frame] = multicast.encode(_sample(seq=9, prev=0, sender="", subject="", beat=True), [])
        self.assertRaises(MalformedBridgeMessage, multicast.decode, [frame, b"content"])

    def test_empty_message(self) -> None:
        """A message of no frames is refused."""
        self.assertRaises(MalformedBridgeMessage, multicast.decode, [])

    @given(st.binary(max_size=80))
    def test_any_bytes(self, frame: bytes) -> None:
        """Any bytes decode or raise L{MalformedBridgeMessage}, nothing else."""
        with contextlib.suppress(MalformedBridgeMessage):
            multicast.decode_header(frame)
