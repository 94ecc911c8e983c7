"""
Tests for L{malamute_pack.cli.tables} and L{malamute_pack.cli.views}: plain
text tables and how each section of the C{$broker} service is shown.
"""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from malamute_pack.cli import commands, views
from malamute_pack.cli.tables import (
    Column,
    duration,
    plain,
    rate,
    render_pairs,
    render_table,
    size,
)


class ValueTests(unittest.SynchronousTestCase):
    """Values shown for people."""

    def test_plain(self) -> None:
        """None is -, booleans yes/no, floats 3 significant digits, lists joined."""
        self.assertEqual(plain(None), "-")
        self.assertEqual(plain(True), "yes")
        self.assertEqual(plain(False), "no")
        self.assertEqual(plain(0.123456), "0.123")
        self.assertEqual(plain(12345.6), "12346")
        self.assertEqual(plain(["a", "b"]), "a, b")
        self.assertEqual(plain([]), "-")
        self.assertEqual(plain({"x": 1}), "x=1")
        self.assertEqual(plain(7), "7")

    def test_size(self) -> None:
        """Byte counts in binary units; what is not a number as plain."""
        self.assertEqual(size(0), "0 B")
        self.assertEqual(size(1023), "1023 B")
        self.assertEqual(size(1536), "1.5 KiB")
        self.assertEqual(size(5 * 1024 * 1024), "5.0 MiB")
        self.assertEqual(size(None), "-")
        self.assertEqual(size(True), "yes")

    def test_duration(self) -> None:
        """Seconds in the largest two units that fit."""
        self.assertEqual(duration(4.25), "4.2s")
        self.assertEqual(duration(187), "3m07s")
        self.assertEqual(duration(2 * 3600 + 300), "2h05m")
        self.assertEqual(duration(3 * 86400 + 4 * 3600), "3d04h")
        self.assertEqual(duration(None), "-")

    def test_rate(self) -> None:
        """A rate per second."""
        self.assertEqual(rate(12.5), "12.5/s")
        self.assertEqual(rate(0), "0/s")
        self.assertEqual(rate(None), "-")


class TableTests(unittest.SynchronousTestCase):
    """Tables and key/value lists."""

    def test_widths_from_content(self) -> None:
        """Each column is as wide as its widest cell; numbers aligned right."""
        text = render_table(
            [{"name": "weather", "n": 5}, {"name": "x", "n": 12345}],
            [Column("name", "NAME"), Column("n", "N", right=True)],
        )
        self.assertEqual(
            text.splitlines(),
            ["NAME         N", "weather      5", "x        12345"],
        )

    def test_missing_key(self) -> None:
        """A key a row lacks shows as -."""
        text = render_table([{}], [Column("name", "NAME")])
        self.assertEqual(text.splitlines(), ["NAME", "-"])

    def test_pairs(self) -> None:
        """Values line up after the longest key."""
        self.assertEqual(render_pairs([("a", "1"), ("long", "2")]), "a:    1\nlong: 2")
        self.assertEqual(render_pairs([]), "")


def _client(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": "c1",
        "address": "weather-reader",
        "user": None,
        "version": 2,
        "credit": None,
        "subscriptions": 1,
        "queued": 0,
        "held": 0,
        "connected_s": 75.0,
        "internal": False,
    }
    row.update(changes)
    return row


class ViewTests(unittest.SynchronousTestCase):
    """Each section of the C{$broker} service as text."""

    def test_service_name(self) -> None:
        """The command asks the service the broker offers."""
        from malamute_pack.ops import management

        self.assertEqual(commands.SERVICE, management.SERVICE)

    def test_overview(self) -> None:
        """The overview lists identity, sizes, counters with their rates and refusals."""
        text = views.render_section(
            "overview",
            {
                "version": "1.0",
                "uptime_s": 3661.0,
                "pid": 42,
                "rss_bytes": 2 * 1024 * 1024,
                "endpoints": ["ipc://@/malamute"],
                "journal": True,
                "clients": 3,
                "streams": 1,
                "mailboxes": 0,
                "services": 1,
                "counters": {"stream_messages": 10, "refused": 1},
                "rates": {"stream_messages": 2.5},
                "refused_by_reason": {"max-clients": 1},
            },
        )
        self.assertIn("uptime:", text)
        self.assertIn("1h01m", text)
        self.assertIn("2.0 MiB", text)
        self.assertIn("stream messages:", text)
        self.assertIn("10 (2.5/s)", text)
        self.assertIn("refused: max-clients:", text)

    def test_clients_hide_internal(self) -> None:
        """Internal clients are left out of the table, and the table says so."""
        text = views.render_section(
            "clients", [_client(), _client(address="$broker", internal=True)]
        )
        lines = text.splitlines()
        self.assertEqual(lines[0].split()[:4], ["ADDRESS", "USER", "V", "CREDIT"])
        self.assertIn("weather-reader", lines[1])
        self.assertIn("unlimited", lines[1])
        self.assertIn("1m15s", lines[1])
        self.assertEqual(lines[2], "(1 internal not shown; --json shows them)")

    def test_empty(self) -> None:
        """An empty section says there is nothing."""
        self.assertEqual(views.render_section("streams", []), "(no streams)")
        self.assertEqual(views.render_section("mailboxes", []), "(no mailboxes)")
        self.assertEqual(views.render_section("services", []), "(no services)")

    def test_streams(self) -> None:
        """Streams as a table with rates and retained bytes."""
        text = views.render_section(
            "streams",
            [
                {
                    "name": "weather",
                    "writers": 1,
                    "readers": 2,
                    "messages": 10,
                    "deliveries": 20,
                    "rate": 1.5,
                    "first_seq": 1,
                    "last_seq": 10,
                    "retained_records": 10,
                    "retained_bytes": 2048,
                }
            ],
        )
        self.assertIn("weather", text)
        self.assertIn("1.5/s", text)
        self.assertIn("2.0 KiB", text)

    def test_consumers(self) -> None:
        """Consumers with their kind; a group with members shows them, connected."""
        row = {"stream": "s", "position": 3, "lag": 1, "idle_s": 2.0}
        text = views.render_section(
            "consumers",
            [
                {**row, "name": "c1", "kind": "reader", "connected": False, "members": []},
                {
                    **row,
                    "name": "g",
                    "kind": "group",
                    "connected": True,
                    "members": ["m1", "m2", "m3", "m4", "m5"],
                },
            ],
        )
        lines = text.splitlines()
        self.assertIn("MEMBERS", lines[0])
        self.assertIn("KIND", lines[0])
        [group] = [line for line in lines if " g " in line]
        self.assertIn("group", group)
        self.assertIn("yes", group)
        self.assertIn("m1,m2,m3 +2", group)

    def test_pack(self) -> None:
        """No pack says so; a pack shows its state and its members."""
        self.assertIn("no pack", views.render_section("pack", {"enabled": False}))
        text = views.render_section(
            "pack",
            {
                "enabled": True,
                "name": "north",
                "members": [{"name": "b2", "endpoint": "tcp://10.0.0.2:9999", "streams": 3}],
            },
        )
        self.assertIn("name: north", text)
        self.assertIn("MEMBER", text)
        self.assertIn("tcp://10.0.0.2:9999", text)

    def test_unknown_shape(self) -> None:
        """A section of a shape the views do not know is shown as JSON."""
        self.assertEqual(views.render_section("clients", {"odd": 1}), '{\n  "odd": 1\n}')
        self.assertEqual(views.render_section("journal", {"a": 1}), '{\n  "a": 1\n}')
