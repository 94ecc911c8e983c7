"""
Tests for L{malamute_pack.cli.files} (the files export writes and import
reads) and the batching of L{malamute_pack.cli.transfer}.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from twisted.trial import unittest

from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.files import JsonLinesWriter, open_writer, read_rows
from malamute_pack.cli.records import Record
from malamute_pack.cli.transfer import APPEND_RECORDS, batches

RECORDS = [
    Record("s", 1, 1700000000.0, "a", "text", (b"hello",)),
    Record("s", 2, 1700000000.5, "", "binary", (b"\xff\x00",)),
    Record("s", 3, None, "b", "frames", (b"one", b"\x01")),
    Record("s", 4, 1700000001.0, "b", "none", ()),
]
ROWS = [(r.subject, r.frames) for r in RECORDS]


class FileTests(unittest.SynchronousTestCase):
    """Records written and read back keep their subjects and bytes."""

    def path(self, name: str) -> Path:
        directory = Path(self.mktemp())
        directory.mkdir()
        return directory / name

    def round_trip(self, name: str) -> None:
        path = self.path(name)
        writer = open_writer(str(path))
        writer.write(RECORDS[:2])
        writer.write(RECORDS[2:])
        writer.close()
        self.assertEqual(list(read_rows(str(path))), ROWS)

    def test_json_lines(self) -> None:
        """JSON lines: one object a record, read back exactly."""
        self.round_trip("out.jsonl")
        path = self.path("x.jsonl")
        writer = JsonLinesWriter(str(path))
        writer.write(RECORDS[:1])
        writer.close()
        self.assertIn('"body": "hello"', path.read_text())

    def test_parquet(self) -> None:
        """Parquet (with pyarrow): read back exactly."""
        if importlib.util.find_spec("pyarrow") is None:
            raise unittest.SkipTest("pyarrow is not installed")
        self.round_trip("out.parquet")

    def test_unwritable(self) -> None:
        """A file that cannot be written is a CommandError naming it."""
        error = self.assertRaises(CommandError, open_writer, "/nonexistent/dir/out.jsonl")
        self.assertIn("cannot write /nonexistent/dir/out.jsonl", str(error))

    def test_unreadable(self) -> None:
        """A file that cannot be read, or holds something else, is a CommandError."""
        error = self.assertRaises(CommandError, list, read_rows("/nonexistent.jsonl"))
        self.assertIn("cannot read", str(error))
        path = self.path("bad.jsonl")
        path.write_text('{"subject": "a", "body": "x"}\nnot json\n')
        error = self.assertRaises(CommandError, list, read_rows(str(path)))
        self.assertIn("line 2", str(error))
        path.write_bytes(b"\xff\xfe\n")
        error = self.assertRaises(CommandError, list, read_rows(str(path)))
        self.assertIn("not UTF-8", str(error))

    def test_not_parquet(self) -> None:
        """A .parquet name that is not Parquet is a CommandError."""
        if importlib.util.find_spec("pyarrow") is None:
            raise unittest.SkipTest("pyarrow is not installed")
        path = self.path("bad.parquet")
        path.write_text("hello")
        error = self.assertRaises(CommandError, list, read_rows(str(path)))
        self.assertIn("bad.parquet", str(error))


class BatchTests(unittest.SynchronousTestCase):
    """Records grouped into appends."""

    def test_count(self) -> None:
        """At most APPEND_RECORDS records an append."""
        rows = [("s", (b"x",))] * (APPEND_RECORDS + 1)
        sizes = [len(batch) for batch in batches(rows, 1 << 20)]
        self.assertEqual(sizes, [APPEND_RECORDS, 1])

    def test_bytes(self) -> None:
        """No append larger than the broker takes."""
        rows = [("s", (b"x" * 100,))] * 5
        # Each record: 1 + 1 (subject) + 4 + 4 + 100 = 110 bytes.
        sizes = [len(batch) for batch in batches(rows, 250)]
        self.assertEqual(sizes, [2, 2, 1])

    def test_too_large(self) -> None:
        """A record larger than one append is refused, saying so."""
        error = self.assertRaises(CommandError, list, batches([("s", (b"x" * 100,))], 50))
        self.assertIn("larger than", str(error))
