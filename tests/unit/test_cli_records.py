"""
Tests for L{malamute_pack.cli.records} (bodies as text, hex and JSON),
L{malamute_pack.cli.positions} (C{--from} and C{--to}) and the settings of
L{malamute_pack.cli.connection} (options and environment).
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import zmq.auth
from twisted.trial import unittest

from malamute_pack.cli.connection import DEFAULT_ENDPOINT, settings_from, unique_address
from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.positions import EARLIEST, LATEST, Position, parse_position
from malamute_pack.cli.records import (
    Record,
    body_json,
    body_text,
    format_time,
    frames_from_json,
    record_json,
    record_line,
    records_from_chunk,
)
from malamute_pack.client.bulk import RangeChunk
from malamute_pack.protocol import mlm
from malamute_pack.protocol.chunks import encode_frames


class BodyTests(unittest.SynchronousTestCase):
    """Bodies as text or hex, and as JSON that keeps their bytes."""

    def test_text(self) -> None:
        """Printable UTF-8 is shown as it is."""
        self.assertEqual(body_text([b"21.5 \xc2\xb0C"]), "21.5 \u00b0C")

    def test_hex(self) -> None:
        """Bytes that are not UTF-8, or not printable, are shown as hex."""
        self.assertEqual(body_text([b"\xff\x00"]), "hex:ff00")
        self.assertEqual(body_text([b"a\nb"]), "hex:610a62")

    def test_frames(self) -> None:
        """Several frames are joined with a bar; none is empty."""
        self.assertEqual(body_text([b"a", b"\x01"]), "a | hex:01")
        self.assertEqual(body_text([]), "")

    def test_json_round_trip(self) -> None:
        """Whatever the frames, the JSON gives back the same bytes."""
        for frames in [(b"text",), (b"\xff\xfe",), (), (b"a", b"\x00"), (b"line\n",)]:
            self.assertEqual(frames_from_json(body_json(frames)), frames)
        self.assertEqual(body_json([b"hi"]), {"body": "hi"})
        self.assertEqual(body_json([b"\xff"]), {"body_hex": "ff"})
        self.assertEqual(body_json([b"a", b"b"]), {"frames_hex": ["61", "62"]})

    def test_json_without_body(self) -> None:
        """A JSON object with no body field is refused with what is expected."""
        error = self.assertRaises(ValueError, frames_from_json, {"subject": "x"})
        self.assertIn("body_hex", str(error))


class RecordTests(unittest.SynchronousTestCase):
    """A stream record as a line and as JSON."""

    record = Record("weather", 7, 1700000000.25, "", "temp.paris", (b"21.5",))

    def test_time(self) -> None:
        """Times are ISO 8601 in UTC to the millisecond."""
        self.assertEqual(format_time(1700000000.25), "2023-11-14T22:13:20.250Z")
        self.assertEqual(format_time(None), "-")

    def test_line(self) -> None:
        """Sequence, time, sender (- if anonymous), subject, body."""
        self.assertEqual(record_line(self.record), "7 2023-11-14T22:13:20.250Z - temp.paris 21.5")

    def test_json(self) -> None:
        """The JSON object export writes."""
        self.assertEqual(
            record_json(self.record),
            {
                "stream": "weather",
                "seq": 7,
                "timestamp": "2023-11-14T22:13:20.250Z",
                "sender": "",
                "subject": "temp.paris",
                "body": "21.5",
            },
        )

    def test_from_chunk(self) -> None:
        """A range read's chunk gives its records, frames decoded."""
        chunk = RangeChunk(
            "s", [1, 2], [1_000_000, 2_500_000], ["a", "b"], ["x", "y"],
            [encode_frames([b"one"]), encode_frames([b"t", b"wo"])],
        )  # fmt: skip
        self.assertEqual(
            records_from_chunk(chunk),
            [
                Record("s", 1, 1.0, "a", "x", (b"one",)),
                Record("s", 2, 2.5, "b", "y", (b"t", b"wo")),
            ],
        )


class PositionTests(unittest.SynchronousTestCase):
    """What C{--from} and C{--to} accept."""

    def test_words(self) -> None:
        """earliest and latest (and their synonyms)."""
        self.assertEqual(parse_position("earliest"), EARLIEST)
        self.assertEqual(parse_position("LATEST"), LATEST)
        self.assertEqual(parse_position("now"), LATEST)

    def test_sequence(self) -> None:
        """Digits are a sequence number, from 1."""
        self.assertEqual(parse_position("42"), Position(mlm.SEQUENCE, 42))
        self.assertRaises(argparse.ArgumentTypeError, parse_position, "0")

    def test_unix_seconds(self) -> None:
        """@SECONDS, or seconds with a decimal point, are a time in ms."""
        self.assertEqual(parse_position("@1700000000"), Position(mlm.TIME, 1700000000000))
        self.assertEqual(parse_position("1700000000.5"), Position(mlm.TIME, 1700000000500))

    def test_iso(self) -> None:
        """ISO 8601 with a zone, Z included."""
        self.assertEqual(parse_position("2023-11-14T22:13:20Z"), Position(mlm.TIME, 1700000000000))
        self.assertEqual(
            parse_position("2023-11-14T23:13:20+01:00"), Position(mlm.TIME, 1700000000000)
        )

    def test_iso_local(self) -> None:
        """An ISO 8601 time without a zone is local time."""
        local = datetime(2023, 11, 14, 22, 13, 20).timestamp()
        self.assertEqual(
            parse_position("2023-11-14T22:13:20"), Position(mlm.TIME, round(local * 1000))
        )

    def test_bad(self) -> None:
        """Anything else is refused, saying what is accepted."""
        error = self.assertRaises(argparse.ArgumentTypeError, parse_position, "yesterday")
        self.assertIn("ISO 8601", str(error))

    def test_describe(self) -> None:
        """Positions in words."""
        self.assertEqual(EARLIEST.describe(), "earliest")
        self.assertEqual(Position(mlm.SEQUENCE, 3).describe(), "sequence 3")
        when = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
        self.assertIn("2023-11-1", Position(mlm.TIME, int(when.timestamp() * 1000)).describe())


def _settings(environ: dict[str, str] | None = None, **options: str | float | None) -> object:
    given: dict[str, str | float | None] = {
        "endpoint": None,
        "timeout": None,
        "user": None,
        "password_file": None,
        "curve_server_key": None,
        "curve_keys": None,
        "address": None,
    }
    given.update(options)
    return settings_from(environ=environ or {}, **given)  # type: ignore[arg-type]


class SettingsTests(unittest.SynchronousTestCase):
    """Connection settings from options and the environment."""

    def test_defaults(self) -> None:
        """The default endpoint and timeout, no credentials."""
        settings = settings_from(
            endpoint=None, timeout=None, user=None, password_file=None,
            curve_server_key=None, curve_keys=None, address=None, environ={},
        )  # fmt: skip
        self.assertEqual(settings.endpoints, (DEFAULT_ENDPOINT,))
        self.assertEqual(settings.timeout, 5.0)
        self.assertIsNone(settings.plain)
        self.assertIsNone(settings.curve)

    def test_environment(self) -> None:
        """MALAMUTE_ENDPOINT (a comma list), MALAMUTE_USER and MALAMUTE_PASSWORD."""
        settings = settings_from(
            endpoint=None, timeout=None, user=None, password_file=None,
            curve_server_key=None, curve_keys=None, address=None,
            environ={
                "MALAMUTE_ENDPOINT": "tcp://a:1,tcp://b:2",
                "MALAMUTE_USER": "alice",
                "MALAMUTE_PASSWORD": "secret",
            },
        )  # fmt: skip
        self.assertEqual(settings.endpoints, ("tcp://a:1", "tcp://b:2"))
        self.assertEqual(settings.plain, ("alice", "secret"))

    def test_option_wins(self) -> None:
        """An option wins over the environment; the password file over MALAMUTE_PASSWORD."""
        path = Path(self.mktemp())
        path.write_text("from-file\n")
        settings = settings_from(
            endpoint="ipc://@/x", timeout=1.5, user="bob", password_file=str(path),
            curve_server_key=None, curve_keys=None, address="me",
            environ={"MALAMUTE_ENDPOINT": "tcp://a:1", "MALAMUTE_PASSWORD": "env"},
        )  # fmt: skip
        self.assertEqual(settings.endpoints, ("ipc://@/x",))
        self.assertEqual(settings.plain, ("bob", "from-file"))
        self.assertEqual(settings.timeout, 1.5)
        self.assertEqual(settings.address, "me")
        self.assertEqual(settings.options("me").heartbeat, 0.5)

    def test_errors(self) -> None:
        """Settings that cannot work are refused, naming the fix."""
        cases: list[tuple[dict[str, str | float | None], dict[str, str], str]] = [
            ({"user": "bob"}, {}, "MALAMUTE_PASSWORD"),
            ({"password_file": "/nonexistent"}, {}, "needs a user"),
            ({"user": "bob", "password_file": "/nonexistent"}, {}, "cannot read"),
            ({"endpoint": "nonsense"}, {}, "tcp://HOST:PORT"),
            ({"timeout": 0.0}, {}, "more than 0"),
            ({"curve_server_key": "x" * 40}, {}, "--curve-keys"),
            ({"curve_keys": "/nonexistent", "curve_server_key": "x" * 40}, {}, "cannot read"),
        ]
        for options, environ, expected in cases:
            error = self.assertRaises(CommandError, _settings, environ, **options)
            self.assertIn(expected, str(error), options)

    def test_curve(self) -> None:
        """CURVE keys from the client's secret certificate and the broker's public one."""
        directory = Path(self.mktemp())
        directory.mkdir()
        server_public, _ = zmq.auth.create_certificates(str(directory), "server")
        client_public, client_secret = zmq.auth.create_certificates(str(directory), "client")
        settings = settings_from(
            endpoint=None, timeout=None, user=None, password_file=None,
            curve_server_key=server_public, curve_keys=client_secret, address=None,
            environ={},
        )  # fmt: skip
        assert settings.curve is not None
        server_key, _ = zmq.auth.load_certificate(server_public)
        self.assertEqual(settings.curve.server, server_key.decode())
        client_key, _ = zmq.auth.load_certificate(client_public)
        self.assertEqual(settings.curve.public, client_key.decode())

    def test_unique_address(self) -> None:
        """Each run's address is its own."""
        first, second = unique_address(), unique_address()
        self.assertTrue(first.startswith("malamute-cli."))
        self.assertNotEqual(first, second)
