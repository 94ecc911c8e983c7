"""Tests for L{malamute_pack.protocol.multicast}, the multicast bridge's codec (packs)."""

from __future__ import annotations

import contextlib
import struct

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial import unittest

from malamute_pack.protocol import multicast
from malamute_pack.protocol.multicast import Header, MalformedBridgeMessage, OtherVersion

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
        """
        A message is one frame: the signature, version 2 and the source's
        four strings, then each record: three numbers, its frame count,
        sender and subject, and each content frame after its length.
        """
        frames = multicast.encode(_sample(), [b"21C", b""])
        start = struct.pack(">2sB", b"MB", 2)
        source = [b"a1b2", b"tcp://10.0.0.1:9999", b"weather", b"temp.*"]
        record = struct.pack(">QQQH", 7, 5, 1_700_000_000_000_000, 2)
        names = [b"station", b"temp.paris"]
        content = struct.pack(">I", 3) + b"21C" + struct.pack(">I", 0)
        expected = (
            start
            + b"".join(bytes((len(s),)) + s for s in source)
            + record
            + b"".join(bytes((len(s),)) + s for s in names)
            + content
        )
        self.assertEqual(frames, [expected])

    def test_pack(self) -> None:
        """
        A pack carries several records after one source, each with its own
        numbers, sender, subject and content, in order.
        """
        source = multicast.encode_source("a1b2", "tcp://10.0.0.1:9999", "weather", "temp.*")
        records = [
            multicast.encode_record(7, 5, 70, "station", "temp.paris", [b"21C"]),
            multicast.encode_record(8, 7, 80, "", "temp.rome", []),
            multicast.encode_record(11, 8, 110, "other", "", [b"a", b"", b"c" * 300]),
        ]
        [frame] = multicast.encode_pack(source, records)
        self.assertEqual(frame, multicast.pack_start(source) + b"".join(records))
        pack = multicast.decode_pack([frame])
        self.assertEqual(
            (pack.origin, pack.stream, pack.endpoint, pack.pattern, pack.beat),
            ("a1b2", "weather", "tcp://10.0.0.1:9999", "temp.*", 0),
        )
        self.assertEqual(
            pack.records,
            [
                (7, 5, 70, "station", "temp.paris", [b"21C"]),
                (8, 7, 80, "", "temp.rome", []),
                (11, 8, 110, "other", "", [b"a", b"", b"c" * 300]),
            ],
        )
        self.assertEqual([h.seq for h, _ in pack.headers()], [7, 8, 11])
        self.assertRaises(MalformedBridgeMessage, multicast.decode, [frame])

    def test_beat(self) -> None:
        """
        A beat is one frame: the signature "MH", the version, the source,
        then the last number published and the time.
        """
        beat = _sample(seq=9, prev=0, sender="", subject="", beat=True)
        [frame] = multicast.encode(beat, [])
        source = multicast.encode_source("a1b2", "tcp://10.0.0.1:9999", "weather", "temp.*")
        expected = b"MH\x02" + source + struct.pack(">QQ", 9, beat.timestamp)
        self.assertEqual(frame, expected)
        self.assertEqual(multicast.decode([frame]), (beat, []))
        self.assertEqual(multicast.decode_pack([frame]).records, [])
        self.assertTrue(frame.startswith(multicast.PREFIX))

    def test_long_string(self) -> None:
        """A string longer than 255 bytes cannot be encoded."""
        self.assertRaises(ValueError, multicast.encode, _sample(subject="s" * 256), [])

    def test_too_many_frames(self) -> None:
        """A record of more than MAX_FRAMES content frames cannot be encoded."""
        content = [b""] * (multicast.MAX_FRAMES + 1)
        self.assertRaises(ValueError, multicast.encode_record, 1, 0, 0, "", "", content)


class MalformedTests(unittest.TestCase):
    def _refused(self, frame: bytes, reason: str) -> None:
        error = self.assertRaises(MalformedBridgeMessage, multicast.decode, [frame])
        self.assertIn(reason, str(error))

    def test_truncated(self) -> None:
        """Every truncation of a pack is refused (the whole pack)."""
        source = multicast.encode_source("a1b2", "", "weather", "")
        records = [
            multicast.encode_record(7, 5, 70, "station", "temp.paris", [b"21C", b"x"]),
            multicast.encode_record(8, 7, 80, "", "", []),
        ]
        [frame] = multicast.encode_pack(source, records)
        whole = len(frame) - len(records[1])
        for end in range(len(frame)):
            if end != whole:  # the first record alone is a pack
                self.assertRaises(MalformedBridgeMessage, multicast.decode_pack, [frame[:end]])

    def test_lengthPastTheEnd(self) -> None:
        """A content frame whose length goes past the pack's end is refused."""
        frame = multicast.encode(_sample(), [b"abc"])[0]
        self._refused(frame[:-7] + struct.pack(">I", 4) + b"abc", "length goes past")

    def test_trailing(self) -> None:
        """Bytes after the last record are refused."""
        self._refused(multicast.encode(_sample(), [])[0] + b"x", "ends inside a record")

    def test_moreFrames(self) -> None:
        """A pack is one frame: a message of more is refused."""
        [frame] = multicast.encode(_sample(), [b"x"])
        self.assertRaises(MalformedBridgeMessage, multicast.decode_pack, [frame, b"x"])

    def test_version1(self) -> None:
        """
        A message of version 1 (a record's header frame, then its content)
        raises L{OtherVersion}, naming both versions.
        """
        header = struct.pack(">2sBQQQ", b"MB", 1, 7, 5, 1_700_000_000_000_000)
        header += b"".join(bytes((len(s),)) + s for s in (b"a1b2", b"", b"weather", b"", b"", b"s"))
        error = self.assertRaises(OtherVersion, multicast.decode_pack, [header, b"21C"])
        self.assertIn("version 1: this broker speaks version 2", str(error))

    def test_signature(self) -> None:
        """Another signature is refused."""
        self._refused(b"XX" + multicast.encode(_sample(), [])[0][2:], "signature")

    def test_version(self) -> None:
        """Another version is refused, naming both."""
        frame = multicast.encode(_sample(), [])[0]
        self._refused(frame[:2] + b"\x09" + frame[3:], "version 9: this broker speaks version 2")

    def test_numbers(self) -> None:
        """A sequence number of 0, or a previous number not below it, is refused."""
        self._refused(multicast.encode(_sample(seq=0, prev=0), [])[0], "sequence number 0")
        self._refused(multicast.encode(_sample(seq=5, prev=5), [])[0], "sequence number 5")

    def test_not_utf8(self) -> None:
        """A string that is not UTF-8 is refused."""
        frame = multicast.encode(_sample(subject="ab"), [])[0]
        self._refused(frame.replace(b"ab", b"\xff\xfe"), "UTF-8")

    def test_empty_names(self) -> None:
        """A header without its origin or its stream is refused."""
        self._refused(multicast.encode(_sample(origin=""), [])[0], "origin or stream")
        self._refused(multicast.encode(_sample(stream=""), [])[0], "origin or stream")

    def test_beat_with_a_record(self) -> None:
        """A beat that carries a record, more bytes, more frames, or names no number is refused."""
        [record] = multicast.encode(_sample(), [b"x"])
        self._refused(b"MH" + record[2:], "a beat is its source and two numbers")
        [frame] = multicast.encode(_sample(seq=9, prev=0, sender="", subject="", beat=True), [])
        self._refused(frame + b"x", "a beat is its source and two numbers")
        self.assertRaises(MalformedBridgeMessage, multicast.decode, [frame, b"content"])
        [nothing] = multicast.encode(_sample(seq=0, prev=0, sender="", subject="", beat=True), [])
        self._refused(nothing, "a beat names no record published")

    def test_empty_message(self) -> None:
        """A message of no frames is refused."""
        self.assertRaises(MalformedBridgeMessage, multicast.decode, [])

    @given(st.binary(max_size=80))
    def test_any_bytes(self, frame: bytes) -> None:
        """Any bytes decode or raise L{MalformedBridgeMessage}, nothing else."""
        with contextlib.suppress(MalformedBridgeMessage):
            multicast.decode_pack([frame])

    @given(st.binary(max_size=80))
    def test_any_records(self, tail: bytes) -> None:
        """Any bytes after a valid source decode or raise L{MalformedBridgeMessage}."""
        source = multicast.encode_source("a1b2", "", "weather", "")
        with contextlib.suppress(MalformedBridgeMessage):
            multicast.decode_pack([multicast.pack_start(source) + tail])
