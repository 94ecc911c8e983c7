"""
Tests of the ``malamute`` Spark data source's pure parts, with no Spark
session and no broker: the ``fields`` map, the options, planning by
sequence numbers, the Arrow conversion, reading a journal file, gaps, how
writes group records into appends, and that PySpark's discovery of data
sources finds ``pyspark_malamute``.
"""

from __future__ import annotations

import datetime
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.bulk import RangeChunk, RangeGap
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.schema import migrate
from malamute_pack.matching.fields import subject_criteria
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.chunks import encode_frames
from malamute_pack.spark import SCHEMA_DDL, SPARK_SCHEMA
from malamute_pack.spark.batch import MalamuteReader
from malamute_pack.spark.fields import subject_fields
from malamute_pack.spark.journal_file import JournalFile, JournalFileError
from malamute_pack.spark.last_values import (
    LastValuesPartition,
    latest_per_subject,
    read_last_values,
)
from malamute_pack.spark.options import (
    DEFAULT_ROWS_PER_PARTITION,
    EARLIEST,
    LATEST,
    OptionError,
    Position,
    Target,
    parse_position,
    parse_read_options,
    parse_write_options,
)
from malamute_pack.spark.partitions import Span, admit, split_spans
from malamute_pack.spark.reading import (
    RangePartition,
    RecordsLostError,
    RecordsLostWarning,
    read_partition,
    report_gap,
)
from malamute_pack.spark.schema import ARROW_SCHEMA
from malamute_pack.spark.streaming import MalamuteStreamReader, end_offset
from malamute_pack.spark.writer import (
    Columns,
    batch_records,
    choose_columns,
    group_appends,
    record_size,
)
from tests.spark_reference import chunk_batch

_NAMES = st.sampled_from(["a", "b", " a ", "", "c d"])
_VALUES = st.sampled_from(["1", " 2 ", "", "x=y", "="])
_PIECES = st.one_of(_NAMES, st.tuples(_NAMES, _VALUES).map("=".join), st.just(" "))
SUBJECTS = st.one_of(
    st.lists(_PIECES, max_size=5).map(";".join), st.text(alphabet="ab=; ", max_size=12)
)


class FieldsTests(SynchronousTestCase):
    """L{subject_fields}: the map of a field-style subject."""

    def test_fieldStyle(self) -> None:
        """
        Pieces split on ``;``, ``name=value`` or a bare name (None), blanks
        trimmed, a value may hold ``=``, empty names ignored.
        """
        self.assertEqual(
            subject_fields(" currency = USD ;market=forex;urgent; ;=x;expr=a=b"),
            {"currency": "USD", "market": "forex", "urgent": None, "expr": "a=b"},
        )

    def test_notFieldStyle(self) -> None:
        """A subject without ``=`` or ``;`` has no fields (null); ``;`` alone an empty map."""
        self.assertIsNone(subject_fields("trades.eu"))
        self.assertIsNone(subject_fields(""))
        self.assertEqual(subject_fields(";"), {})
        self.assertEqual(subject_fields("flag;"), {"flag": None})

    def test_repeatedName(self) -> None:
        """A later value wins; a bare repeat keeps the value."""
        self.assertEqual(subject_fields("a=1;a=2"), {"a": "2"})
        self.assertEqual(subject_fields("a=1;a"), {"a": "1"})
        self.assertEqual(subject_fields("a;a=1"), {"a": "1"})

    @settings(max_examples=300)
    @given(SUBJECTS)
    def test_agreesWithMatching(self, subject: str) -> None:
        """
        The map says what the ``fields:`` patterns match: its names are the
        subject's field names and every entry is a criterion the subject
        satisfies (all of them when no name repeats).
        """
        fields = subject_fields(subject)
        if fields is None:
            self.assertNotIn("=", subject)
            self.assertNotIn(";", subject)
            return
        criteria = subject_criteria(subject)
        self.assertEqual(set(fields), {name for name, value in criteria if value is None})
        entries = {(name, value) for name, value in fields.items() if value is not None}
        self.assertLessEqual(entries, criteria)
        names = [piece.partition("=")[0].strip() for piece in subject.split(";")]
        names = [name for name in names if name]
        if len(names) == len(set(names)):
            self.assertEqual(entries | {(name, None) for name in fields}, criteria)


class PositionTests(SynchronousTestCase):
    """L{parse_position}: the forms of start and end."""

    def test_named(self) -> None:
        """earliest and latest, in any case."""
        self.assertEqual(parse_position("Earliest", "start"), EARLIEST)
        self.assertEqual(parse_position(" latest ", "start"), LATEST)

    def test_sequence(self) -> None:
        """A whole number is a sequence number."""
        self.assertEqual(parse_position("42", "start"), Position(mlm.SEQUENCE, 42))

    def test_epochMilliseconds(self) -> None:
        """time:EPOCH_MS is a time in milliseconds."""
        self.assertEqual(
            parse_position("time:1700000000123", "end"), Position(mlm.TIME, 1700000000123)
        )
        self.assertRaises(OptionError, parse_position, "time:soon", "end")

    def test_iso8601(self) -> None:
        """An ISO 8601 time with a zone, in milliseconds since the epoch, rounded up."""
        self.assertEqual(
            parse_position("2023-11-14T22:13:20Z", "start"), Position(mlm.TIME, 1_700_000_000_000)
        )
        self.assertEqual(
            parse_position("2023-11-15T00:13:20.0005+02:00", "start"),
            Position(mlm.TIME, 1_700_000_000_001),
        )

    def test_needsZone(self) -> None:
        """A time without a zone, or anything else, is refused with the forms it takes."""
        error = self.assertRaises(OptionError, parse_position, "2023-11-14T22:13:20", "start")
        self.assertIn("zone", str(error))
        error = self.assertRaises(OptionError, parse_position, "yesterday", "end")
        self.assertIn("option end", str(error))
        self.assertIn("time:EPOCH_MS", str(error))

    def test_str(self) -> None:
        """A position reads as the option text that makes it."""
        for text in ("earliest", "latest", "17", "time:5"):
            self.assertEqual(str(parse_position(text, "start")), text)


class ReadOptionsTests(SynchronousTestCase):
    """L{parse_read_options}."""

    def test_defaults(self) -> None:
        """
        A batch read of one stream: the default endpoint, earliest to
        latest, 100,000 numbers a partition, failing on data loss.
        """
        options = parse_read_options({"stream": "trades"}, streaming=False)
        self.assertEqual(options.target, Target())
        self.assertEqual(options.target.endpoint, "ipc://@/malamute")
        self.assertEqual(options.streams, ("trades",))
        self.assertEqual((options.start, options.end), (EARLIEST, LATEST))
        self.assertEqual(options.rows_per_partition, DEFAULT_ROWS_PER_PARTITION)
        self.assertIsNone(options.partitions)
        self.assertTrue(options.fail_on_data_loss)

    def test_streamingStartsLatest(self) -> None:
        """A streaming read starts at latest unless told otherwise."""
        options = parse_read_options({"stream": "s"}, streaming=True)
        self.assertEqual(options.start, LATEST)

    def test_everyOption(self) -> None:
        """Every read option, names in any case (Spark lower-cases them)."""
        options = parse_read_options(
            {
                "endpoint": "tcp://h:1",
                "STREAM": "a, b,a",
                "pattern": "fields:x=1",
                "start": "5",
                "maxrowsperbatch": "10",
                "partitions": "3",
                "failondataloss": "False",
                "user": "u",
                "password": "p",
                "timeout": "2.5",
            },
            streaming=True,
        )
        self.assertEqual(options.target, Target("tcp://h:1", None, "u", "p", 2.5))
        self.assertEqual(options.streams, ("a", "b"))
        self.assertEqual(options.pattern, "fields:x=1")
        self.assertEqual(options.start, Position(mlm.SEQUENCE, 5))
        self.assertEqual((options.max_rows_per_batch, options.partitions), (10, 3))
        self.assertIsNone(options.rows_per_partition)
        self.assertFalse(options.fail_on_data_loss)

    def test_passwordHidden(self) -> None:
        """The password is not in a target's repr (Spark logs plans)."""
        self.assertNotIn("secret", repr(Target(user="u", password="secret")))

    def test_journal(self) -> None:
        """A journal file needs no stream (all of them) and no endpoint."""
        options = parse_read_options({"journal": "/x/journal.sqlite"}, streaming=False)
        self.assertEqual(options.target.journal, "/x/journal.sqlite")
        self.assertEqual(options.streams, ())

    def assertRefused(self, options: dict[str, str], *words: str, streaming: bool = False) -> None:
        error = self.assertRaises(OptionError, parse_read_options, options, streaming=streaming)
        for word in words:
            self.assertIn(word, str(error))

    def test_refused(self) -> None:
        """Each mistake is refused with a message that names the option."""
        self.assertRefused({}, "stream is required")
        self.assertRefused({"stream": "a,,b"}, "empty stream name")
        self.assertRefused({"stream": "a", "colour": "red"}, "unknown option 'colour'", "known:")
        self.assertRefused({"stream": "a", "maxRowsPerBatch": "5"}, "maxRowsPerBatch", "batch")
        self.assertRefused({"stream": "a", "end": "5"}, "end", "streaming", streaming=True)
        self.assertRefused({"stream": "a", "valueColumn": "v"}, "valueColumn does not apply")
        self.assertRefused({"journal": "j", "endpoint": "tcp://h:1"}, "not both")
        self.assertRefused({"stream": "a", "partitions": "2", "rowsPerPartition": "9"}, "not both")
        self.assertRefused({"stream": "a", "partitions": "0"}, "partitions", "at least 1")
        self.assertRefused({"stream": "a", "rowsPerPartition": "many"}, "rowsPerPartition")
        self.assertRefused({"stream": "a", "failOnDataLoss": "no"}, "true or false")
        self.assertRefused({"stream": "a", "user": "u"}, "user and password")
        self.assertRefused({"stream": "a", "timeout": "0"}, "timeout")
        self.assertRefused({"stream": "a", "timeout": "nan"}, "timeout")
        self.assertRefused({"stream": "a", "pattern": "fields:a;;b"}, "pattern", "empty criterion")
        self.assertRefused({"stream": "a", "start": "soon"}, "option start")
        self.assertRefused({"stream": "a", "lastValues": "yes"}, "true or false")
        self.assertRefused(
            {"stream": "a", "lastValues": "true", "start": "5"}, "start", "lastValues"
        )
        self.assertRefused(
            {"stream": "a", "lastValues": "true", "partitions": "2"}, "partitions", "lastValues"
        )
        self.assertRefused({"stream": "a", "lastValues": "true"}, "lastValues", streaming=True)

    def test_sparkOwnOptions(self) -> None:
        """Options Spark adds itself (a sink's checkpointLocation) are let through."""
        options = parse_write_options({"stream": "s", "checkpointLocation": "/tmp/c"})
        self.assertEqual(options.stream, "s")


class WriteOptionsTests(SynchronousTestCase):
    """L{parse_write_options} and L{choose_columns}."""

    def test_options(self) -> None:
        """A write's stream, columns and writer id."""
        options = parse_write_options(
            {"stream": "out", "subjectColumn": "topic", "valueColumn": "v", "writerId": "job-7"}
        )
        self.assertEqual(
            (options.stream, options.subject_column, options.value_column, options.writer_id),
            ("out", "topic", "v", "job-7"),
        )

    def test_refused(self) -> None:
        """One stream, not a journal, not both frames and value, a short writer id."""
        for options, words in [
            ({"stream": "a,b"}, "exactly one stream"),
            ({}, "exactly one stream"),
            ({"stream": "a", "journal": "j"}, "journal does not apply"),
            ({"stream": "a", "framesColumn": "f", "valueColumn": "v"}, "not both"),
            ({"stream": "a", "writerId": "x" * 161}, "writerId"),
            ({"stream": "a", "start": "earliest"}, "start does not apply"),
        ]:
            error = self.assertRaises(OptionError, parse_write_options, options)
            self.assertIn(words, str(error))

    def schema(self, **columns: object) -> StructType:
        return StructType([StructField(name, kind) for name, kind in columns.items()])  # type: ignore[arg-type]

    def test_defaultColumns(self) -> None:
        """
        subject and frames by default; value if there is no frames column;
        no subject column means empty subjects.
        """
        options = parse_write_options({"stream": "s"})
        frames = ArrayType(BinaryType())
        self.assertEqual(
            choose_columns(
                options, self.schema(subject=StringType(), frames=frames, value=BinaryType())
            ),
            Columns("subject", "frames", None),
        )
        self.assertEqual(
            choose_columns(options, self.schema(value=StringType())), Columns(None, None, "value")
        )

    def test_namedColumns(self) -> None:
        """Columns named by options, checked for their types."""
        options = parse_write_options({"stream": "s", "subjectColumn": "t", "framesColumn": "f"})
        schema = self.schema(t=StringType(), f=ArrayType(BinaryType(), containsNull=False))
        self.assertEqual(choose_columns(options, schema), Columns("t", "f", None))
        wrong = self.schema(t=IntegerType(), f=ArrayType(BinaryType()))
        error = self.assertRaises(OptionError, choose_columns, options, wrong)
        self.assertIn("column 't' is int, not string", str(error))
        missing = self.schema(t=StringType())
        error = self.assertRaises(OptionError, choose_columns, options, missing)
        self.assertIn("no column 'f'", str(error))

    def test_noFrames(self) -> None:
        """A DataFrame with neither a frames nor a value column is refused, saying what it has."""
        options = parse_write_options({"stream": "s"})
        error = self.assertRaises(OptionError, choose_columns, options, self.schema(x=StringType()))
        self.assertIn("x string", str(error))


class PlanningTests(SynchronousTestCase):
    """L{split_spans}, L{admit} and L{end_offset}."""

    def test_rowsPerPartition(self) -> None:
        """Pieces of at most that many numbers, stream by stream; empty spans dropped."""
        pieces = split_spans(
            [Span("a", 1, 10), Span("b", 5, 4), Span("c", 3, 3)], rows_per_partition=4
        )
        self.assertEqual(
            pieces,
            [Span("a", 1, 4), Span("a", 5, 8), Span("a", 9, 10), Span("c", 3, 3)],
        )

    def test_partitions(self) -> None:
        """A number of partitions sets the piece size over all streams."""
        pieces = split_spans([Span("a", 1, 100), Span("b", 1, 100)], partitions=4)
        self.assertEqual([len(piece) for piece in pieces], [50, 50, 50, 50])
        self.assertEqual(
            split_spans([Span("a", 1, 3)], partitions=10),
            [Span("a", 1, 1), Span("a", 2, 2), Span("a", 3, 3)],
        )

    @given(
        st.lists(st.tuples(st.integers(1, 50), st.integers(-1, 60)), max_size=4),
        st.integers(1, 20),
    )
    def test_everyNumberOnce(self, ranges: list[tuple[int, int]], size: int) -> None:
        """Every number of every span is in exactly one piece, in order."""
        spans = [Span(f"s{i}", first, first + extra) for i, (first, extra) in enumerate(ranges)]
        pieces = split_spans(spans, rows_per_partition=size)
        covered = [(p.stream, n) for p in pieces for n in range(p.first, p.last + 1)]
        wanted = [(s.stream, n) for s in spans for n in range(s.first, s.last + 1)]
        self.assertEqual(covered, wanted)
        self.assertTrue(all(0 < len(piece) <= size for piece in pieces))

    def test_admitFair(self) -> None:
        """The budget is shared; what one stream cannot use goes to the others."""
        self.assertEqual(admit({"a": 0, "b": 0}, {"a": 100, "b": 100}, 10), {"a": 5, "b": 5})
        self.assertEqual(admit({"a": 0, "b": 0}, {"a": 2, "b": 100}, 10), {"a": 2, "b": 8})
        self.assertEqual(admit({"a": 0, "b": 0}, {"a": 100, "b": 100}, 3), {"a": 2, "b": 1})
        self.assertEqual(admit({"b": 7, "a": 0}, {"b": 5, "a": 1}, 10), {"a": 1, "b": 7})

    @given(
        st.dictionaries(st.sampled_from("abcd"), st.tuples(st.integers(0, 30), st.integers(0, 30))),
        st.integers(1, 40),
    )
    def test_admitBounds(self, streams: dict[str, tuple[int, int]], budget: int) -> None:
        """Never more than the budget, never past latest, never backward; all of it if it fits."""
        start = {name: first for name, (first, _) in streams.items()}
        latest = {name: latest for name, (_, latest) in streams.items()}
        end = admit(start, latest, budget)
        self.assertEqual(list(end), sorted(streams))
        taken = sum(end[name] - start[name] for name in streams)
        waiting = sum(max(0, latest[name] - start[name]) for name in streams)
        self.assertEqual(taken, min(budget, waiting))
        for name in streams:
            self.assertLessEqual(start[name], end[name])
            self.assertLessEqual(end[name], max(start[name], latest[name]))

    def test_endOffset(self) -> None:
        """ReadAllAvailable takes everything, ReadMaxRows admits; keys sorted either way."""
        start, latest = {"b": 0, "a": 3}, {"b": 10, "a": 2}
        self.assertEqual(end_offset(start, latest, ReadAllAvailable()), {"a": 3, "b": 10})
        self.assertEqual(list(end_offset(start, latest, ReadAllAvailable())), ["a", "b"])
        self.assertEqual(end_offset(start, latest, ReadMaxRows(4)), {"a": 3, "b": 4})


def _chunk() -> RangeChunk:
    return RangeChunk(
        "s",
        [3, 4, 9],
        [1_700_000_000_000_001, 1_700_000_000_500_000, 0],
        ["ann", "bob", ""],
        ["a=1;b", "plain", "a=1;b"],
        [encode_frames([b"\x00\xff", b""]), encode_frames([]), encode_frames([b"x" * 70_000])],
    )


class ArrowTests(SynchronousTestCase):
    """L{chunk_batch}: a chunk as a record batch of exactly the source's schema."""

    def test_schema(self) -> None:
        """
        The Arrow schema is Spark's exactly: string (not large_string),
        microseconds in UTC, a map of strings, a list of binaries; the DDL
        names the same columns in the same order.
        """
        batch = chunk_batch(_chunk())
        self.assertEqual(batch.schema, ARROW_SCHEMA)
        self.assertEqual(ARROW_SCHEMA.field("stream").type, pa.string())
        self.assertEqual(ARROW_SCHEMA.field("timestamp").type, pa.timestamp("us", tz="UTC"))
        self.assertEqual(SPARK_SCHEMA.fieldNames(), ARROW_SCHEMA.names)
        self.assertEqual(
            [part.split()[0] for part in SCHEMA_DDL.split(", ")], SPARK_SCHEMA.fieldNames()
        )

    def test_values(self) -> None:
        """Every column of every row, frames byte for byte, fields parsed."""
        rows = chunk_batch(_chunk()).to_pylist()
        utc = datetime.UTC
        self.assertEqual(
            rows[0],
            {
                "stream": "s",
                "seq": 3,
                "timestamp": datetime.datetime(2023, 11, 14, 22, 13, 20, 1, tzinfo=utc),
                "sender": "ann",
                "subject": "a=1;b",
                "fields": [("a", "1"), ("b", None)],
                "frames": [b"\x00\xff", b""],
            },
        )
        self.assertEqual((rows[1]["fields"], rows[1]["frames"]), (None, []))
        self.assertEqual(rows[2]["frames"], [b"x" * 70_000])
        self.assertEqual(rows[2]["timestamp"], datetime.datetime(1970, 1, 1, tzinfo=utc))

    def test_empty(self) -> None:
        """An empty chunk is an empty batch of the same schema."""
        batch = chunk_batch(RangeChunk("s", [], [], [], [], []))
        self.assertEqual((batch.num_rows, batch.schema), (0, ARROW_SCHEMA))


def make_journal(path: Path, rows: list[tuple[str, int, float, str, str, list[bytes]]]) -> None:
    """A journal file at C{path} holding C{rows} (stream, seq, ts, sender, subject, frames)."""
    conn = sqlite3.connect(path)
    migrate(conn)
    with conn:
        conn.executemany(
            "INSERT INTO stream_messages "
            "(stream, seq, ts, sender, subject, content, bytes, origin, origin_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [stream_row(*row) for row in rows],
        )
        conn.execute(
            "INSERT INTO streams (stream, last_seq, message_count, total_bytes) "
            "SELECT stream, MAX(seq), COUNT(*), SUM(bytes) FROM stream_messages GROUP BY stream"
        )
    conn.close()


class JournalFileTests(SynchronousTestCase):
    """L{JournalFile}: status and range reads from a journal file."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            ("t", seq, 1000.0 + seq, "w", f"k={seq % 2}", [bytes([seq])]) for seq in range(5, 21)
        ]
        rows.append(("u", 1, 5.25, "v", "only", []))
        make_journal(self.path, rows)
        self.journal = JournalFile(self.path, chunk_records=4)
        self.addCleanup(self.journal.close)

    def test_status(self) -> None:
        """First retained, last written, and where each kind of position falls."""
        status = self.journal.status("t")
        self.assertEqual((status.first, status.last, status.position), (5, 20, 21))
        self.assertEqual(self.journal.status("t", mlm.EARLIEST).position, 5)
        self.assertEqual(self.journal.status("t", mlm.SEQUENCE, 9).position, 9)
        self.assertEqual(self.journal.status("t", mlm.TIME, 1_010_000).position, 10)
        self.assertEqual(self.journal.status("t", mlm.TIME, 1_010_001).position, 11)
        self.assertEqual(self.journal.status("t", mlm.TIME, 9_999_999).position, 21)
        missing = self.journal.status("nothing")
        self.assertEqual((missing.first, missing.last, missing.position), (1, 0, 1))
        self.assertEqual(self.journal.streams(), ["t", "u"])

    def test_readRange(self) -> None:
        """Records in order, in chunks, columns as the bulk client gives them; clamped at last."""
        items = list(self.journal.read_range("t", 6, 100))
        self.assertTrue(all(isinstance(item, RangeChunk) for item in items))
        chunks_ = [item for item in items if isinstance(item, RangeChunk)]
        self.assertEqual([len(c.seq) for c in chunks_], [4, 4, 4, 3])
        self.assertEqual([seq for c in chunks_ for seq in c.seq], list(range(6, 21)))
        first = chunks_[0]
        self.assertEqual(first.timestamp_us[0], 1_006_000_000)
        self.assertEqual((first.sender[0], first.subject[0]), ("w", "k=0"))
        self.assertEqual(first.content[0], encode_frames([b"\x06"]))
        only = list(self.journal.read_range("u", 1, 1))
        self.assertEqual(only, [RangeChunk("u", [1], [5_250_000], ["v"], ["only"], [b""])])

    def test_pattern(self) -> None:
        """A pattern of any kind keeps the matching records only."""
        items = list(self.journal.read_range("t", 1, 100, "fields:k=1"))
        seqs = [seq for item in items if isinstance(item, RangeChunk) for seq in item.seq]
        self.assertEqual(seqs, [5, 7, 9, 11, 13, 15, 17, 19])

    def test_gap(self) -> None:
        """Numbers below the first retained are a gap, reported first, then the records."""
        items = list(self.journal.read_range("t", 2, 6))
        self.assertEqual(items[0], RangeGap("t", 2, 5))
        self.assertEqual([item.seq for item in items[1:] if isinstance(item, RangeChunk)], [[5, 6]])
        self.assertEqual(list(self.journal.read_range("t", 1, 3)), [RangeGap("t", 1, 4)])

    def test_notAJournal(self) -> None:
        """A missing file, or a SQLite file that is no journal, is a clear error."""
        error = self.assertRaises(JournalFileError, JournalFile, self.path.with_name("none"))
        self.assertIn("does not exist", str(error))
        other = self.path.with_name("other.sqlite")
        sqlite3.connect(other).execute("CREATE TABLE x (y)").connection.close()
        error = self.assertRaises(JournalFileError, JournalFile, other)
        self.assertIn("not a malamute journal", str(error))
        text = self.path.with_name("text")
        text.write_text("hello, this is no database at all" * 10)
        self.assertRaises(JournalFileError, JournalFile, text)

    def test_readOnly(self) -> None:
        """The file is opened read-only: nothing can be written through it."""
        self.assertRaises(
            sqlite3.OperationalError,
            self.journal._conn.execute,
            "DELETE FROM stream_messages",
        )

    def test_readPartition(self) -> None:
        """A partition on a journal file reads to record batches, fields and frames included."""
        target = Target(journal=str(self.path))
        batches = list(read_partition(RangePartition(target, "t", 7, 9)))
        table = pa.Table.from_batches(batches)
        self.assertEqual(table.column("seq").to_pylist(), [7, 8, 9])
        self.assertEqual(table.column("fields").to_pylist()[0], [("k", "1")])
        self.assertEqual(table.column("frames").to_pylist(), [[b"\x07"], [b"\x08"], [b"\x09"]])

    def test_partitionGap(self) -> None:
        """
        A partition that meets a gap fails naming the stream and the
        numbers, or with failOnDataLoss false warns and reads on.
        """
        target = Target(journal=str(self.path))
        error = self.assertRaises(
            RecordsLostError, list, read_partition(RangePartition(target, "t", 1, 6))
        )
        self.assertIn("stream 't': records 1 to 4 were removed by retention", str(error))
        self.assertIn("failOnDataLoss=false", str(error))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            batches = list(read_partition(RangePartition(target, "t", 1, 6, "", False)))
        self.assertEqual([batch.num_rows for batch in batches], [2])
        self.assertEqual([w.category for w in caught], [RecordsLostWarning])
        self.assertIn("records 1 to 4", str(caught[0].message))


class PlanningOnJournalTests(SynchronousTestCase):
    """The batch and streaming readers' planning, against a journal file."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rows: list[tuple[str, int, float, str, str, list[bytes]]]
        rows = [("a", seq, float(seq), "w", "s", []) for seq in range(1, 31)]
        rows += [("b", seq, float(seq), "w", "s", []) for seq in range(11, 16)]
        make_journal(self.path, rows)

    def test_batchPartitions(self) -> None:
        """
        A batch read plans each stream from start to end (exclusive, never
        past the last record) in partitions of sequence ranges; nothing to
        read is one empty partition.
        """
        options = parse_read_options(
            {"journal": str(self.path), "start": "5", "end": "1000", "rowsPerPartition": "10"},
            streaming=False,
        )
        parts = MalamuteReader(options).partitions()
        self.assertEqual(
            [(p.stream, p.first, p.last) for p in parts if isinstance(p, RangePartition)],
            # b's 5-10 are gone: its first partition reads them as a gap.
            [("a", 5, 14), ("a", 15, 24), ("a", 25, 30), ("b", 5, 14), ("b", 15, 15)],
        )
        options = parse_read_options(
            {"journal": str(self.path), "start": "latest"}, streaming=False
        )
        [empty] = MalamuteReader(options).partitions()
        assert isinstance(empty, RangePartition)
        self.assertEqual(list(read_partition(empty)), [])

    def test_streamOffsets(self) -> None:
        """
        Offsets are the last number included per stream, keys sorted: the
        initial one from start, the next within ReadMaxRows or all
        available, partitions covering what lies between.
        """
        options = parse_read_options(
            {"journal": str(self.path), "stream": "b,a", "start": "earliest"}, streaming=True
        )
        reader = MalamuteStreamReader(options)
        start = reader.initialOffset()
        self.assertEqual(list(start.items()), [("a", 0), ("b", 10)])
        self.assertEqual(reader.latestOffset(start, ReadAllAvailable()), {"a": 30, "b": 15})
        end = reader.latestOffset(start, ReadMaxRows(8))
        self.assertEqual(end, {"a": 4, "b": 14})
        parts = reader.partitions(start, end)
        self.assertEqual(
            [(p.stream, p.first, p.last) for p in parts if isinstance(p, RangePartition)],
            [("a", 1, 4), ("b", 11, 14)],
        )
        self.assertEqual(reader.partitions(end, end), [])
        self.assertEqual(reader.getDefaultReadLimit(), ReadAllAvailable())

    def test_streamStartsLatest(self) -> None:
        """By default a streaming read starts after what is there."""
        options = parse_read_options({"journal": str(self.path), "stream": "a"}, streaming=True)
        reader = MalamuteStreamReader(options)
        start = reader.initialOffset()
        self.assertEqual(start, {"a": 30})
        self.assertEqual(reader.latestOffset(start, ReadAllAvailable()), start)
        limited = parse_read_options(
            {"journal": str(self.path), "stream": "a", "maxRowsPerBatch": "7"}, streaming=True
        )
        self.assertEqual(MalamuteStreamReader(limited).getDefaultReadLimit(), ReadMaxRows(7))

    def test_availableNow(self) -> None:
        """After prepareForTriggerAvailableNow, no offset goes past what was there then."""
        options = parse_read_options(
            {"journal": str(self.path), "stream": "a", "start": "earliest"}, streaming=True
        )
        reader = MalamuteStreamReader(options)
        reader.prepareForTriggerAvailableNow()
        conn = sqlite3.connect(self.path)
        with conn:
            conn.execute(
                "INSERT INTO stream_messages "
                "(stream, seq, ts, sender, subject, content, bytes, origin, origin_seq) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                stream_row("a", 31, 31.0, "w", "late", []),
            )
        conn.close()
        self.assertEqual(reader.latestOffset({"a": 0}, ReadAllAvailable()), {"a": 30})
        self.assertEqual(reader.latestOffset({"a": 30}, ReadAllAvailable()), {"a": 30})
        self.assertEqual(
            MalamuteStreamReader(options).latestOffset({"a": 30}, ReadAllAvailable()), {"a": 31}
        )

    def test_newStream(self) -> None:
        """
        A stream missing from the checkpoint's offset joins it at start,
        with nothing read of it in that micro-batch; a stream no longer
        named is left out.
        """
        options = parse_read_options(
            {"journal": str(self.path), "stream": "a,b", "start": "earliest"}, streaming=True
        )
        reader = MalamuteStreamReader(options)
        end = reader.latestOffset({"a": 3, "gone": 5}, ReadAllAvailable())
        self.assertEqual(end, {"a": 30, "b": 10})
        parts = reader.partitions({"a": 3, "gone": 5}, end)
        self.assertEqual(
            [(p.stream, p.first, p.last) for p in parts if isinstance(p, RangePartition)],
            [("a", 4, 30)],
        )


class GapTests(SynchronousTestCase):
    """L{report_gap}."""

    def test_oneRecord(self) -> None:
        """A gap of one number names it."""
        error = self.assertRaises(RecordsLostError, report_gap, RangeGap("s", 7, 8), True)
        self.assertIn("records 7 to 7", str(error))
        self.assertEqual((error.stream, error.missed, error.available), ("s", 7, 8))


class AppendTests(SynchronousTestCase):
    """How a write turns rows into records and records into appends."""

    def test_recordSize(self) -> None:
        """A record's size is what it takes in the protocol's append encoding."""
        for record in [("", []), ("subject", [b"", b"abc"]), ("é", [b"x" * 300])]:
            self.assertEqual(record_size(record), len(chunks.encode_append([record])))
        self.assertRaises(ValueError, record_size, ("s" * 256, []))

    @given(st.lists(st.integers(0, 60), max_size=30), st.integers(80, 200))
    def test_groups(self, sizes: list[int], limit: int) -> None:
        """Groups keep order, hold every record once and stay within the limit."""
        records = [(f"r{i}", [b"x" * size]) for i, size in enumerate(sizes)]
        groups = list(group_appends(records, limit))
        self.assertEqual([r for group in groups for r in group], records)
        for group in groups:
            self.assertLessEqual(len(chunks.encode_append(group)), limit)
            self.assertTrue(group)

    def test_tooBig(self) -> None:
        """A record bigger than one append is an error that says so."""
        error = self.assertRaises(ValueError, list, group_appends([("s", [b"x" * 100])], 50))
        self.assertIn("bigger than the broker takes in one append", str(error))

    def test_batchRecords(self) -> None:
        """
        Rows to records: frames from a list column (null list: none, null
        frame: empty), or one value (string as UTF-8, null: none); a null
        or absent subject is empty.
        """
        batch = pa.record_batch(
            {
                "subject": pa.array(["a", None, "c"]),
                "frames": pa.array([[b"1", None], None, []], pa.list_(pa.binary())),
                "value": pa.array(["é", None, "z"]),
            }
        )
        self.assertEqual(
            list(batch_records(batch, Columns("subject", "frames", None))),
            [("a", [b"1", b""]), ("", []), ("c", [])],
        )
        self.assertEqual(
            list(batch_records(batch, Columns(None, None, "value"))),
            [("", ["é".encode()]), ("", []), ("", [b"z"])],
        )


_LOOKUP = """
from importlib import import_module
from pkgutil import iter_modules
found = {}
for info in iter_modules():
    if info.name.startswith("pyspark_"):
        module = import_module(info.name)
        found[module.DefaultSource.name()] = module.DefaultSource
source = found["malamute"]
print(source.__module__, source.__qualname__)
"""


class DiscoveryTests(SynchronousTestCase):
    """The ``pyspark_<name>`` module PySpark looks data sources up by."""

    def test_found(self) -> None:
        """
        The lookup PySpark's workers run (pyspark/sql/worker/lookup_data_sources.py),
        in this environment's Python from another directory with no
        PYTHONPATH, finds ``malamute`` and the source class.
        """
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run(
            [sys.executable, "-c", _LOOKUP],
            cwd="/",
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual(done.stdout.split(), ["malamute_pack.spark.source", "MalamuteDataSource"])


class LastValuesTests(SynchronousTestCase):
    """C{lastValues}: the latest record of each subject, planned and read."""

    def setUp(self) -> None:
        self.path = Path(self.mktemp())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        subjects = "abcabdab"  # latest: c 3, d 6, a 7, b 8
        rows = [
            ("t", seq, float(seq), "w", subject, [bytes([seq])])
            for seq, subject in enumerate(subjects, 1)
        ]
        make_journal(self.path, rows)

    def test_latestPerSubject(self) -> None:
        """The highest sequence number of each subject, across batches, in sequence order."""
        batches = [
            chunk_batch(
                RangeChunk(
                    "t",
                    [seq for seq, _ in part],
                    [0] * len(part),
                    ["w"] * len(part),
                    [subject for _, subject in part],
                    [b""] * len(part),
                )
            )
            for part in ([(1, "a"), (2, "b")], [], [(3, "a"), (4, "c")], [(5, "b")])
        ]
        table = latest_per_subject(batches)
        self.assertEqual(table.column("seq").to_pylist(), [3, 4, 5])
        self.assertEqual(table.column("subject").to_pylist(), ["a", "c", "b"])
        self.assertEqual(latest_per_subject([]).num_rows, 0)

    def test_oneStreamOnePartition(self) -> None:
        """
        A lastValues read is one partition a stream, up to end, that reads
        the latest record of each subject its pattern matches.
        """
        options = parse_read_options(
            {"journal": str(self.path), "stream": "t", "lastValues": "true", "end": "8"},
            streaming=False,
        )
        [part] = MalamuteReader(options).partitions()
        assert isinstance(part, LastValuesPartition)
        self.assertEqual((part.stream, part.first, part.last), ("t", 1, 7))
        table = pa.Table.from_batches(list(MalamuteReader(options).read(part)))
        self.assertEqual(
            list(
                zip(
                    table.column("subject").to_pylist(),
                    table.column("seq").to_pylist(),
                    strict=True,
                )
            ),
            [("c", 3), ("b", 5), ("d", 6), ("a", 7)],
        )
        self.assertEqual(table.column("frames").to_pylist()[-1], [b"\x07"])
        target = Target(journal=str(self.path))
        only = pa.Table.from_batches(
            list(read_last_values(LastValuesPartition(target, "t", 1, 8, "^[ab]$")))
        )
        self.assertEqual(only.column("seq").to_pylist(), [7, 8])
