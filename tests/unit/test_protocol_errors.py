"""
Tests for L{malamute_pack.protocol.errors}: every codec's error derives
from the one L{Malformed}, and every codec's malformed input raises it.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import chunks, mlm, multicast, packlink, pair, zgossip, zre
from malamute_pack.protocol.errors import Malformed


class MalformedTests(SynchronousTestCase):
    def test_oneBase(self) -> None:
        """Each codec's own error is a Malformed, and a Malformed is a ValueError."""
        for error in (
            mlm.MalformedMessage,
            mlm.InvalidText,
            packlink.MalformedLink,
            zre.MalformedZre,
            zre.MalformedBeacon,
            zgossip.MalformedGossip,
            pair.MalformedPairMessage,
            multicast.MalformedBridgeMessage,
        ):
            self.assertTrue(issubclass(error, Malformed), error)
        self.assertTrue(issubclass(Malformed, ValueError))

    def test_everyCodecRaisesIt(self) -> None:
        """Bytes that are not a message raise Malformed, whichever codec decodes them."""
        refusals: list[Callable[[], object]] = [
            lambda: mlm.decode([b"\xaa\xa8\x05"]),
            lambda: mlm.decode_checked([b"\xaa\xa8\x05\x01\xff"]),
            lambda: packlink.decode([b"\xaa\xa3\x01"]),
            lambda: zre.decode([b"\xaa\xa1\x06\x02\x00"]),
            lambda: zre.decode_beacon(b"ZRE"),
            lambda: zgossip.decode(b"\xaa\xa0\x02\x01"),
            lambda: pair.decode([b"MP"]),
            lambda: pair.decode_change(b"R"),
            lambda: multicast.decode([b"MB"]),
            lambda: chunks.decode_chunk(b"\x00", 1),
        ]
        for refusal in refusals:
            self.assertRaises(Malformed, refusal)

    def test_encodingRaisesIt(self) -> None:
        """A value no codec can put on the wire raises Malformed too."""
        refusals: list[Callable[[], object]] = [
            lambda: mlm.encode(mlm.StreamWrite("x" * 256)),
            lambda: packlink.encode(packlink.Address("a", 256)),
            lambda: zre.encode(zre.Ping(1 << 16)),
            lambda: zre.encode_beacon(zre.Beacon(b"x", 1)),
            lambda: zgossip.encode(zgossip.Publish("k", "v", -1)),
            lambda: pair.encode(pair.Ack(-1, 0)),
        ]
        for refusal in refusals:
            self.assertRaises(Malformed, refusal)
