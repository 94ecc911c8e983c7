"""
System tests of the ``malamute`` Spark data source: a real local Spark
(one session for the test process, L{tests.spark_support}) against real
broker processes (L{BrokerProcess}, bound to C{tcp://127.0.0.1:*}) with
their journals.

Batch reads equal what was published (every column, binary frames
intact), from the broker and from its journal file; partitioned reads
cover every sequence number once; streaming reads pick up every append
once, within maxRowsPerBatch, with trigger availableNow too; a streaming
query that fails in the middle of a micro-batch, its output half written
to a broker stream, and is restarted from its checkpoint leaves every row
in the output stream exactly once; retention that overtakes a slow query
is reported (or skipped with failOnDataLoss false); a broker that is down
is a clear error; batch writes publish rows and do not duplicate them when
run again under the same writerId. The tests' session keeps its scratch
space and its log in the test process's own directory.

Slow (a JVM, brokers): skipped with MALAMUTE_SKIP_SLOW.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row
from pyspark.sql.functions import udf
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StringType
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.bulk import BulkClient, RangeChunk
from malamute_pack.client.options import ClientOptions
from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.spark import SCHEMA_DDL, SPARK_SCHEMA
from malamute_pack.spark.fields import subject_fields
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess
from tests.spark_support import spark_for
from tests.support import skip_slow

Record = tuple[str, list[bytes]]
# A read's rows with the timestamp as microseconds since the epoch (exact,
# whatever the session's time zone).
COLUMNS = ("stream", "seq", "unix_micros(timestamp) AS ts", "sender", "subject", "fields", "frames")


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll C{condition} until it holds; fail saying C{what} was awaited."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def row_tuple(row: Row) -> tuple[Any, ...]:
    """A row of L{COLUMNS} as plain values (frames as bytes)."""
    fields = None if row.fields is None else dict(row.fields)
    return (
        row.stream,
        row.seq,
        row.ts,
        row.sender,
        row.subject,
        fields,
        [bytes(frame) for frame in row.frames],
    )


class SparkSourceTests(SynchronousTestCase):
    """The data source in a real Spark against real brokers."""

    skip = skip_slow

    def setUp(self) -> None:
        self.spark = spark_for(self)

    def broker(self, config: str | None = None) -> BrokerProcess:
        """A broker on loopback with a journal, stopped (killed if need be) after the test."""
        directory = Path(self.mktemp()).resolve()
        args: list[str] = []
        if config is not None:
            directory.mkdir(parents=True)
            (directory / "malamute.cfg").write_text(config)
            args = ["--config", str(directory / "malamute.cfg")]
        broker = BrokerProcess(directory, bind=ANY_TCP_PORT, args=args)
        broker.start()
        self.addCleanup(broker.kill)
        return broker

    def publish(
        self, broker: BrokerProcess, stream: str, records: Sequence[Record], *, per_append: int = 50
    ) -> list[int]:
        """Append C{records} as the client C{producer}; the sequence numbers they got."""
        seqs: list[int] = []
        options = ClientOptions(address="producer")
        with BulkClient(broker.endpoint, options=options, timeout=10) as client:
            for start in range(0, len(records), per_append):
                group = records[start : start + per_append]
                done = client.append(stream, uuid.uuid4().hex, group)
                seqs.extend(range(done.first, done.last + 1))
        return seqs

    def stored(self, broker: BrokerProcess, stream: str) -> list[tuple[int, int, str, list[bytes]]]:
        """(seq, timestamp_us, subject, frames) of every record of C{stream}, from the broker."""
        found = []
        with BulkClient(broker.endpoint, timeout=10) as client:
            for item in client.read_range(stream, 1, 2**62):
                assert isinstance(item, RangeChunk), item
                for seq, micros, subject, blob in zip(
                    item.seq, item.timestamp_us, item.subject, item.content, strict=True
                ):
                    found.append((seq, micros, subject, list(decode_frames(blob))))
        return found

    def last(self, broker: BrokerProcess, stream: str) -> int:
        with BulkClient(broker.endpoint, timeout=10) as client:
            return client.status(stream).last

    def read(self, broker: BrokerProcess | None = None, **options: str) -> DataFrame:
        reader = self.spark.read.format("malamute")
        if broker is not None:
            reader = reader.option("endpoint", broker.endpoint)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    def read_stream(self, broker: BrokerProcess, **options: str) -> DataFrame:
        reader = self.spark.readStream.format("malamute").option("endpoint", broker.endpoint)
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    def collecting(
        self, frame: DataFrame, checkpoint: str, batches: list[list[Row]], **trigger: Any
    ) -> StreamingQuery:
        """Start C{frame} into C{batches} (one list of rows per micro-batch)."""

        def keep(batch: DataFrame, batch_id: int) -> None:
            batches.append(batch.collect())

        query = (
            frame.writeStream.foreachBatch(keep)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )
        self.addCleanup(query.stop)
        return query

    def test_sessionKeepsToItsDirectory(self) -> None:
        """
        The tests' session holds nothing another test process (C{trial -j})
        could collide on: no UI port; its scratch space and its log under
        this process's working directory (trial's temporary directory).
        """
        conf = self.spark.sparkContext.getConf()
        here = Path.cwd().resolve()
        self.assertEqual(conf.get("spark.ui.enabled"), "false")
        for key in ("spark.local.dir", "spark.sql.warehouse.dir", "spark.jars.ivy"):
            # Spark qualifies the warehouse as a URL.
            path = Path(str(conf.get(key)).removeprefix("file:"))
            self.assertTrue(path.is_relative_to(here), f"{key}: {path}")
        self.assertIn(f"-Djava.io.tmpdir={here}", str(conf.get("spark.driver.extraJavaOptions")))
        self.assertTrue((here / "spark" / "spark.log").is_file())

    # Batch reads

    def test_batchReadEqualsPublished(self) -> None:
        """
        A batch read has the source's schema and every published record in
        order, every column as the broker stored it: field maps parsed,
        binary frames byte for byte (empty frames, no frames, NUL and 0xFF
        bytes, a large frame); the broker's journal file reads the same.
        """
        broker = self.broker()
        records: list[Record] = [
            ("currency=USD;market=forex;urgent", [b"\x00\xff\x00", b""]),
            ("plain.subject", []),
            ("expr=a=b; spaced = yes ;", [b"x" * 300_000]),
            ("", [bytes(range(256)), b"tail"]),
        ]
        records += [(f"n={i}", [i.to_bytes(4, "big")]) for i in range(200)]
        seqs = self.publish(broker, "orders", records)
        self.assertEqual(seqs, list(range(1, len(records) + 1)))
        stored = self.stored(broker, "orders")
        expected = [
            ("orders", seq, micros, "producer", subject, subject_fields(subject), frames)
            for (seq, micros, subject, frames) in stored
        ]
        self.assertEqual([(e[4], e[6]) for e in expected], [(s, f) for s, f in records])

        frame = self.read(broker, stream="orders")
        self.assertEqual(frame.schema, SPARK_SCHEMA)
        self.assertEqual(self.spark.createDataFrame([], SCHEMA_DDL).schema, SPARK_SCHEMA)
        rows = [row_tuple(row) for row in frame.selectExpr(*COLUMNS).collect()]
        self.assertEqual(rows, expected)

        journal = str(broker.data_dir / "journal.sqlite")
        from_file = self.read(journal=journal).where("stream = 'orders'").selectExpr(*COLUMNS)
        self.assertEqual([row_tuple(row) for row in from_file.collect()], expected)

    def test_lastValues(self) -> None:
        """
        lastValues reads a last-value stream's latest record of each
        subject, in sequence order, from the broker and from its journal
        file alike.
        """
        broker = self.broker(
            "malamute\n    streams\n        ticks\n            compact = subject\n"
        )
        records: list[Record] = [(f"sym.{i % 7}", [b"%d" % i]) for i in range(50)]
        self.publish(broker, "ticks", records)
        expected = [(seq, f"sym.{(seq - 1) % 7}", [b"%d" % (seq - 1)]) for seq in range(44, 51)]

        def got(frame: DataFrame) -> list[tuple[int, str, list[bytes]]]:
            rows = frame.select("seq", "subject", "frames").collect()
            return [(row.seq, row.subject, [bytes(f) for f in row.frames]) for row in rows]

        self.assertEqual(got(self.read(broker, stream="ticks", lastValues="true")), expected)
        journal = str(broker.data_dir / "journal.sqlite")
        self.assertEqual(
            got(self.read(journal=journal, stream="ticks", lastValues="true")), expected
        )

    def test_partitionsCoverEverySequenceOnce(self) -> None:
        """
        However a read of several streams is split (numbers per partition or
        a number of partitions), each sequence number is read exactly once;
        start, end (exclusive) and a pattern narrow it.
        """
        broker = self.broker()
        self.publish(broker, "a", [(f"k={i % 3}", [b"a"]) for i in range(500)], per_append=100)
        self.publish(broker, "b", [(f"k={i % 3}", [b"b"]) for i in range(301)], per_append=100)
        wanted = [("a", n) for n in range(1, 501)] + [("b", n) for n in range(1, 302)]

        def keys(frame: DataFrame) -> list[tuple[str, int]]:
            return [(row.stream, row.seq) for row in frame.select("stream", "seq").collect()]

        by_rows = self.read(broker, stream="a,b", rowsPerPartition="97")
        self.assertEqual(by_rows.rdd.getNumPartitions(), 6 + 4)
        self.assertEqual(sorted(keys(by_rows)), wanted)
        by_count = self.read(broker, stream="b, a", partitions="4")
        self.assertEqual(by_count.rdd.getNumPartitions(), 5)
        self.assertEqual(sorted(keys(by_count)), wanted)

        narrowed = self.read(broker, stream="a", start="10", end="20", pattern="fields:k=0")
        self.assertEqual(keys(narrowed), [("a", n) for n in range(10, 20) if (n - 1) % 3 == 0])
        nothing = self.read(broker, stream="a", start="latest")
        self.assertEqual(keys(nothing), [])

    def test_startAndEndTimes(self) -> None:
        """start and end as times (ISO 8601 and time:EPOCH_MS) select by the broker's timestamps."""
        broker = self.broker()
        self.publish(broker, "t", [("early", [])])
        time.sleep(0.05)
        middle_ms = int(time.time() * 1000)
        time.sleep(0.05)
        self.publish(broker, "t", [("late", [])])
        iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(middle_ms // 1000))
        iso += f".{middle_ms % 1000:03d}+00:00"
        late = self.read(broker, stream="t", start=iso).select("subject").collect()
        self.assertEqual([row.subject for row in late], ["late"])
        early = self.read(broker, stream="t", end=f"time:{middle_ms}").select("subject").collect()
        self.assertEqual([row.subject for row in early], ["early"])

    def test_badOption(self) -> None:
        """An unknown option fails the read with a message that names it."""
        frame = self.read(None, stream="a", colour="red")
        error = self.assertRaises(PySparkException, frame.collect)
        self.assertIn("unknown option 'colour'", str(error))

    def test_brokerDown(self) -> None:
        """A read or a write against a broker that is not there fails, saying so."""
        broker = self.broker()
        broker.stop()
        error = self.assertRaises(
            PySparkException, self.read(broker, stream="s", timeout="1").collect
        )
        self.assertIn(f"no Malamute broker answered at {broker.endpoint}", str(error))
        rows = self.spark.createDataFrame([("s", b"v")], "subject string, value binary")
        writer = rows.write.format("malamute").option("endpoint", broker.endpoint)
        writer = writer.option("stream", "out").option("timeout", "1").mode("append")
        error = self.assertRaises(PySparkException, writer.save)
        self.assertIn(f"at {broker.endpoint}", str(error))

    # Writes

    def test_batchWrite(self) -> None:
        """
        Rows written with frames or with a string value become records in
        order; the same job again under the same writerId writes nothing
        twice; overwrite is refused.
        """
        broker = self.broker()
        rows = [(f"id={i}", [bytes([i]), b"\x00\xff"]) for i in range(50)]
        frame = self.spark.createDataFrame(rows, "subject string, frames array<binary>")
        for _ in range(2):
            (
                frame.coalesce(2)
                .write.format("malamute")
                .option("endpoint", broker.endpoint)
                .option("stream", "written")
                .option("writerId", "job-1")
                .mode("append")
                .save()
            )
        stored = self.stored(broker, "written")
        self.assertEqual(sorted((s, f) for (_, _, s, f) in stored), sorted(rows))
        self.assertEqual(len(stored), 50)

        values = self.spark.createDataFrame([("é",), (None,)], "value string")
        values.write.format("malamute").option("endpoint", broker.endpoint).option(
            "stream", "values"
        ).mode("append").save()
        self.assertEqual(
            sorted((s, f) for (_, _, s, f) in self.stored(broker, "values")),
            [("", []), ("", ["é".encode()])],
        )
        overwrite = values.write.format("malamute").option("stream", "values").mode("overwrite")
        error = self.assertRaises(PySparkException, overwrite.save)
        self.assertIn("append-only", str(error))

    # Streaming

    def test_streamingPicksUpEveryAppend(self) -> None:
        """
        A running streaming query over two streams picks up records
        appended while it runs, each exactly once, never more than
        maxRowsPerBatch sequence numbers in a micro-batch.
        """
        broker = self.broker()
        self.publish(broker, "a", [("before", [b"0"])] * 10)
        batches: list[list[Row]] = []
        frame = self.read_stream(broker, stream="a,b", start="earliest", maxRowsPerBatch="15")
        query = self.collecting(frame, self.mktemp(), batches, processingTime="200 milliseconds")
        sent = {"a": 10, "b": 0}

        def caught_up() -> bool:
            return sum(len(batch) for batch in batches) >= sum(sent.values())

        # Each round is appended once the query has read the last: while it runs.
        for round_ in range(4):
            for stream in ("a", "b"):
                self.publish(broker, stream, [(f"r{round_}", [b"x"])] * (round_ + 5))
                sent[stream] += round_ + 5
            wait_for(caught_up, f"{sum(sent.values())} rows")
        query.stop()
        seen = sorted((row.stream, row.seq) for batch in batches for row in batch)
        wanted = [(name, seq) for name in ("a", "b") for seq in range(1, sent[name] + 1)]
        self.assertEqual(seen, wanted)
        self.assertLessEqual(max(len(batch) for batch in batches), 15)

    def test_availableNow(self) -> None:
        """
        trigger(availableNow=True) reads what was there when it started in
        micro-batches within maxRowsPerBatch, then stops; run again from its
        checkpoint it reads only what came since.
        """
        broker = self.broker()
        self.publish(broker, "s", [(f"n={i}", [b""]) for i in range(120)])
        checkpoint = self.mktemp()
        batches: list[list[Row]] = []
        frame = self.read_stream(broker, stream="s", start="earliest", maxRowsPerBatch="25")
        self.collecting(frame, checkpoint, batches, availableNow=True).awaitTermination(120)
        self.assertEqual([len(batch) for batch in batches], [25, 25, 25, 25, 20])
        self.assertEqual([row.seq for batch in batches for row in batch], list(range(1, 121)))
        self.publish(broker, "s", [("more", [b""])] * 10)
        later: list[list[Row]] = []
        self.collecting(frame, checkpoint, later, availableNow=True).awaitTermination(120)
        self.assertEqual([row.seq for batch in later for row in batch], list(range(121, 131)))

    def test_restartMidBatchNoLossNoDuplicate(self) -> None:
        """
        A query from one stream to another fails in its second micro-batch
        after one of that batch's two partitions was written (in two
        appends, its rows being larger than one append); restarted from its
        checkpoint, it runs that batch again and the output stream holds
        every input row exactly once (the query id and the keys are the
        same on the second run, so the broker recognises what was written).
        """
        broker = self.broker()
        big = b"y" * 100_000
        records = [(f"id={i}", [big if 100 <= i < 150 else b"s"]) for i in range(200)]
        self.publish(broker, "in", records, per_append=25)
        marker = Path(self.mktemp())
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        endpoint, flag = broker.endpoint, str(marker)

        def guard(subject: str, seq: int) -> str:
            # Partition 151-200 of batch 1 waits until partition 101-150
            # is in the output, then fails (while the marker exists).
            if seq == 151 and os.path.exists(flag):
                with BulkClient(endpoint, timeout=10) as client:
                    deadline = time.monotonic() + 60
                    while client.status("out").last < 150 and time.monotonic() < deadline:
                        time.sleep(0.1)
                raise RuntimeError("injected failure in the middle of micro-batch 1")
            return subject

        # A plain Python UDF, said outright: PySpark's guess from the type
        # hints comes to the same but warns that it cannot tell.
        checked = udf(guard, StringType(), useArrow=False)
        source = self.read_stream(
            broker, stream="in", start="earliest", maxRowsPerBatch="100", rowsPerPartition="50"
        )
        output = source.select(checked("subject", "seq").alias("subject"), "frames")
        checkpoint = self.mktemp()

        def run() -> StreamingQuery:
            query = (
                output.writeStream.format("malamute")
                .option("endpoint", endpoint)
                .option("stream", "out")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            self.addCleanup(query.stop)
            return query

        failed = run()
        error = self.assertRaises(PySparkException, failed.awaitTermination, 120)
        self.assertIn("injected failure", str(error))
        half = self.stored(broker, "out")
        self.assertEqual(len(half), 150)

        marker.unlink()
        run().awaitTermination(120)
        out = [(subject, frames) for (_, _, subject, frames) in self.stored(broker, "out")]
        self.assertEqual(sorted(out), sorted((s, f) for s, f in records))
        self.assertEqual(len(out), 200)

    def test_retentionOvertakesSlowQuery(self) -> None:
        """
        Records that retention removed before a query read them fail it,
        naming the stream and the numbers lost; with failOnDataLoss false
        the query goes on with what is left.
        """
        config = (
            "malamute\n    journal\n        prune-interval = 1\n"
            "        retention\n            max-count = 50\n"
        )
        broker = self.broker(config)
        self.publish(broker, "r", [(f"n={i}", [b""]) for i in range(20)])
        checkpoint = self.mktemp()
        batches: list[list[Row]] = []
        frame = self.read_stream(broker, stream="r", start="earliest")
        self.collecting(frame, checkpoint, batches, availableNow=True).awaitTermination(120)
        self.publish(broker, "r", [(f"n={i}", [b""]) for i in range(20, 220)])

        def pruned() -> bool:
            with BulkClient(broker.endpoint, timeout=10) as client:
                return client.status("r").first == 171

        wait_for(pruned, "retention to keep the last 50 records")
        failing = self.collecting(frame, checkpoint, batches, availableNow=True)
        error = self.assertRaises(PySparkException, failing.awaitTermination, 120)
        self.assertIn("stream 'r': records 21 to 170 were removed by retention", str(error))
        self.assertIn("failOnDataLoss=false", str(error))

        lenient = self.read_stream(broker, stream="r", start="earliest", failOnDataLoss="false")
        self.collecting(lenient, checkpoint, batches, availableNow=True).awaitTermination(120)
        seen = [row.seq for batch in batches for row in batch]
        self.assertEqual(seen, list(range(1, 21)) + list(range(171, 221)))
