"""
Tests for L{malamute_pack.broker.limits}: the broker's bounds, their
defaults and validation, and the checks of names against a byte bound.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.errors import Refused
from malamute_pack.broker.limits import Limits, check_name, longer_than
from malamute_pack.protocol import mlm

MIB = 1024 * 1024


def _readme_number(text: str) -> int:
    """A default as the README writes it: C{10000}, C{4 MiB}, C{0 (none)}."""
    number, _, unit = text.partition(" ")
    return int(number) * (MIB if unit == "MiB" else 1)


class LimitsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """
        Every limit has a row in the README's limits table, under its config
        key, that gives its default.
        """
        readme = (Path(__file__).parents[2] / "README.md").read_text()
        table = readme.split("| limit | default |", 1)[1].split("\n\n", 1)[0]
        documented: dict[str, str] = {}
        for row in re.findall(r"^\| (`[a-z-]+`(?:, `[a-z-]+`)*) \| ([^|]+) \|", table, re.M):
            names = re.findall(r"`([a-z-]+)`", row[0])
            values = [v.strip() for v in row[1].split(",")]
            if len(values) == 1:
                values = values * len(names)
            documented.update(zip(names, values, strict=True))
        for field in dataclasses.fields(Limits):
            key = field.name.replace("_", "-")
            self.assertIn(key, documented, f"{key} is not in the README's limits table")
            self.assertEqual(_readme_number(documented[key]), getattr(Limits(), field.name), key)

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
