"""
A ticker plant on Spark Structured Streaming: reads the ``trades`` stream
(subject ``trade.SYMBOL``, one frame of JSON ``{"price": float, "size":
int}``, as ``examples/spark_trades.py`` publishes) through the ``malamute``
data source and publishes each symbol's volume-weighted average price over
10-second windows to the ``vwap`` stream.

Start a broker (``scripts/broker``) and the trade generator, then, from
the repository root::

    .venv/bin/python examples/spark_ticker_plant.py [-e ipc://@/malamute]
        [--user USER] [--checkpoint DIR] [--trigger "1 second"] [--available-now]
        [--start latest]

With ``--user``, the source and the sink authenticate with PLAIN, the
password taken from the environment variable ``MALAMUTE_PASSWORD``.

Windows are by event time, the time the broker stored the trade (the
record's ``timestamp``), with a 5-second watermark: a trade more than 5 s
older than the latest one seen is too late and left out, and a window's
state is dropped once the watermark passes its end. The output mode is
update: every trigger publishes the current VWAP of each window that
changed, so a window is published several times while trades come in, and
the last message for a window is its final value. Each message has the
subject ``vwap.SYMBOL`` and one frame of JSON: ``symbol``,
``window_start`` and ``window_end`` (ISO 8601, UTC), ``vwap``, ``volume``
(shares), ``trades`` (how many), ``last_trade_us`` (the timestamp of the
window's latest trade, microseconds since the epoch: now minus it is the
plant's latency).

The checkpoint directory holds the query's progress: restarted with the
same one, the plant goes on where it stopped and publishes nothing twice.
``--available-now`` processes what the stream holds and stops.

The transformation is L{vwap} (a DataFrame of the source's rows in, one row
per symbol and window out) and L{vwap_messages} (those rows as the sink's
subject and value); L{start_plant} wires them between the source and the
sink, L{PublishBatch}. They use only Spark SQL functions, no Python UDF:
the work runs in the JVM.

Tests: ``tests/system/test_spark_ticker_plant.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.streaming.query import StreamingQuery

from malamute_pack.client import plain_credentials
from malamute_pack.spark import register

TRADES = "trades"
VWAP = "vwap"
WINDOW = "10 seconds"
WATERMARK = "5 seconds"
# The JSON body of a trade.
TRADE_BODY = "price double, size bigint"
# ISO 8601 in UTC, as each message's window_start and window_end.
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ssXXX", "timeZone": "UTC"}
# The columns of L{vwap}'s rows, and of each message's JSON.
VWAP_COLUMNS = (
    "symbol",
    "window_start",
    "window_end",
    "vwap",
    "volume",
    "trades",
    "last_trade_us",
)


def vwap(trades: DataFrame) -> DataFrame:
    """
    The VWAP of each symbol over 10-second event-time windows.

    @param trades: rows with the C{malamute} source's columns (C{subject},
        C{timestamp} and C{frames} are used), batch or streaming. A row
        whose subject is not C{trade.SYMBOL} or whose first frame is not a
        trade's JSON with a positive size is left out.
    @return: C{symbol string, window_start timestamp, window_end timestamp,
        vwap double, volume bigint, trades bigint, last_trade_us bigint};
        with a 5-second watermark on C{timestamp} (which a batch query
        ignores).
    """
    body = sf.from_json(sf.get(sf.col("frames"), 0).cast("string"), TRADE_BODY)
    parsed = trades.select(
        sf.regexp_extract("subject", r"^trade\.(.+)$", 1).alias("symbol"),
        sf.col("timestamp"),
        body.getField("price").alias("price"),
        body.getField("size").alias("size"),
    ).where((sf.col("symbol") != "") & sf.col("price").isNotNull() & (sf.col("size") > 0))
    windows = (
        parsed.withWatermark("timestamp", WATERMARK)
        .groupBy(sf.col("symbol"), sf.window("timestamp", WINDOW))
        .agg(
            sf.sum(sf.col("price") * sf.col("size")).alias("notional"),
            sf.sum("size").alias("volume"),
            sf.count(sf.lit(1)).alias("trades"),
            sf.max("timestamp").alias("last_trade"),
        )
    )
    return windows.select(
        sf.col("symbol"),
        sf.col("window.start").alias("window_start"),
        sf.col("window.end").alias("window_end"),
        (sf.col("notional") / sf.col("volume")).alias("vwap"),
        sf.col("volume"),
        sf.col("trades"),
        sf.unix_micros("last_trade").alias("last_trade_us"),
    )


def vwap_messages(windows: DataFrame) -> DataFrame:
    """
    L{vwap}'s rows as messages for the C{malamute} sink: C{subject}
    (C{vwap.SYMBOL}) and C{value}, the row as one JSON object with the
    window's bounds in ISO 8601 UTC.
    """
    columns: list[Column] = [sf.col(name) for name in VWAP_COLUMNS]
    return windows.select(
        sf.concat(sf.lit("vwap."), sf.col("symbol")).alias("subject"),
        sf.to_json(sf.struct(*columns), _JSON_OPTIONS).alias("value"),
    )


class PublishBatch:
    """
    The plant's sink, a C{foreachBatch} function: publishes each
    micro-batch's messages to C{vwap} with a batch write of the C{malamute}
    source.

    Why not C{writeStream.format("malamute")}: Spark takes a Python data
    source as a streaming sink in output mode append only, and a ticker
    plant needs update. The batch write's C{writerId} is the query id (kept
    in the checkpoint) and the batch id, so its idempotency keys are those
    a streaming sink would use: a micro-batch run again after a restart
    publishes nothing twice.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        """@param options: the sink's options (endpoint, credentials...)."""
        self.options = dict(options)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # Spark sets these on the thread that runs the micro-batch and calls us.
        query_id = batch.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not query_id:
            raise RuntimeError("no streaming query id: PublishBatch runs as foreachBatch only")
        (
            batch.write.format("malamute")
            .options(**self.options)
            .option("stream", VWAP)
            .option("valueColumn", "value")
            .option("writerId", f"{query_id}:{batch_id}")
            .mode("append")
            .save()
        )


def start_plant(
    spark: SparkSession,
    endpoint: str,
    checkpoint: str,
    *,
    trigger: str = "1 second",
    available_now: bool = False,
    start: str = "latest",
    max_rows_per_batch: int | None = None,
    options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """
    Start the plant: C{trades} from the broker at C{endpoint} through
    L{vwap} and L{vwap_messages} to C{vwap} (L{PublishBatch}), in update
    mode.

    @param checkpoint: the query's checkpoint directory.
    @param trigger: the processing-time trigger's interval.
    @param available_now: process what C{trades} holds, then stop
        (C{trigger} is ignored).
    @param start: where a query without a checkpoint starts reading
        C{trades}: C{latest}, C{earliest}, a sequence number or a time (the
        source's C{start} option).
    @param max_rows_per_batch: at most this many trades (sequence numbers)
        a micro-batch, if given (the source's C{maxRowsPerBatch}).
    @param options: more source and sink options (C{user}, C{password},
        C{timeout}...), given to both.
    """
    register(spark)
    shared = dict(options or {}, endpoint=endpoint)
    reader = (
        spark.readStream.format("malamute")
        .options(**shared)
        .option("stream", TRADES)
        .option("pattern", r"^trade\.")
        .option("start", start)
    )
    if max_rows_per_batch is not None:
        reader = reader.option("maxRowsPerBatch", max_rows_per_batch)
    trades = reader.load()
    writer = (
        vwap_messages(vwap(trades))
        .writeStream.foreachBatch(PublishBatch(shared))
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .queryName("ticker_plant")
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger)
    )
    return writer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Publish each symbol's 10-second VWAP.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument(
        "--checkpoint", default="ticker-plant-checkpoint", help="the query's checkpoint directory"
    )
    parser.add_argument("--trigger", default="1 second", help="the interval between micro-batches")
    parser.add_argument(
        "--available-now", action="store_true", help="process what trades holds, then stop"
    )
    parser.add_argument(
        "--start",
        default="latest",
        help="where a new query starts reading trades: latest, earliest, a sequence number "
        "or a time",
    )
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    # Python workers run this interpreter, which has malamute_pack installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.appName("ticker-plant")
        # Frozen into the checkpoint: a few symbols need no more.
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    query = start_plant(
        spark,
        args.endpoint,
        args.checkpoint,
        trigger=args.trigger,
        available_now=args.available_now,
        start=args.start,
        options=None if plain is None else {"user": plain[0], "password": plain[1]},
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
