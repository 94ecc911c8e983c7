"""
Tests for L{malamute_pack.broker.limits}: the broker's bounds, their
defaults and validation, and the checks of names against a byte bound.
"""

from __future__ import annotations

import dataclasses

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.errors import Refused
from malamute_pack.broker.limits import Limits, check_name, longer_than
from malamute_pack.protocol import mlm

MIB = 1024 * 1024


class LimitsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """The defaults are the ones the README documents."""
        self.assertEqual(
            dataclasses.asdict(Limits()),
            {
                "max_message_bytes": 4 * MIB,
                "max_frames": 64,
                "max_subject": 255,
                "max_address": 255,
                "mailbox_max_messages": 100_000,
                "mailbox_max_bytes": 256 * MIB,
                "service_max_messages": 100_000,
                "service_max_bytes": 256 * MIB,
                "max_clients": 10_000,
                "max_subscriptions": 1_000,
            },
        )

    def test_overrideOne(self) -> None:
        """Setting one limit leaves the others at their defaults; limits cannot be changed."""
        limits = Limits(max_clients=7)
        self.assertEqual(limits, dataclasses.replace(Limits(), max_clients=7))
        with self.assertRaises(dataclasses.FrozenInstanceError):
            limits.max_clients = 8  # type: ignore[misc]

    def test_positiveIntegersOnly(self) -> None:
        """Zero, a negative number or a non-integer is refused, naming the limit."""
        for value in (0, -1, 1.5, "10"):
            with self.assertRaises(ValueError) as ctx:
                Limits(max_frames=value)  # type: ignore[arg-type]
            self.assertIn("max_frames", str(ctx.exception))
        self.assertEqual(Limits(max_frames=1).max_frames, 1)

    def test_namesFitTheWire(self) -> None:
        """Subject and address bounds cannot exceed the wire's 255-byte strings."""
        for name in ("max_subject", "max_address"):
            with self.assertRaises(ValueError) as ctx:
                Limits(**{name: 256})
            self.assertIn("255", str(ctx.exception))
            self.assertEqual(getattr(Limits(**{name: 255}), name), 255)


class LongerThanTests(SynchronousTestCase):
    def test_countsUtf8Bytes(self) -> None:
        """Length is in UTF-8 bytes: é takes 2, a clef 4; a text at the limit is not longer."""
        self.assertFalse(longer_than("abc", 3))
        self.assertTrue(longer_than("abcd", 3))
        self.assertTrue(longer_than("é" * 2, 3))
        self.assertFalse(longer_than("é" * 2, 4))
        self.assertTrue(longer_than("\U0001d11e", 3))
        self.assertFalse(longer_than("\U0001d11e", 4))

    def test_undecodableBytes(self) -> None:
        """A byte a C client sent that is not UTF-8 (kept as a surrogate) counts as one byte."""
        self.assertFalse(longer_than("a\udcff", 2))
        self.assertTrue(longer_than("ab\udcff", 2))


class CheckNameTests(SynchronousTestCase):
    def test_emptyRefused(self) -> None:
        """An empty name is refused with status 300 and a reason naming what it is."""
        error = self.assertRaises(Refused, check_name, "stream name", "", 10)
        self.assertEqual(error.code, mlm.FAILED)
        self.assertEqual(error.reason, "invalid stream name: it is empty")
        self.assertEqual(error.kind, "invalid stream name")

    def test_emptyAllowed(self) -> None:
        """Where allowed (an anonymous client's address), an empty name passes."""
        check_name("address", "", 10, allow_empty=True)

    def test_tooLongRefused(self) -> None:
        """A name longer than the limit in bytes is refused; one at the limit passes."""
        check_name("address", "é" * 5, 10)
        error = self.assertRaises(Refused, check_name, "address", "é" * 5 + "x", 10)
        self.assertEqual(error.reason, "invalid address: longer than 10 bytes")
