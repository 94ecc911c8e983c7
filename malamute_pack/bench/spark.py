"""
``python -m malamute_pack.bench spark``: how fast Spark reads a broker's
stream through the ``malamute`` data source, and how far behind the trades
the ticker plant's VWAPs come (``examples/spark_ticker_plant.py``). Prints
one ``name value`` line per figure, as it is measured.

It starts its own broker (L{BrokerProcess}: tcp on loopback, journal on, in
a temporary data directory, retention raised above what it publishes) and
a local Spark session on every core, then:

- read: publishes C{--messages} small messages (default 1,000,000; 100
  bytes each) to the stream ``bench`` from a raw DEALER socket
  (L{malamute_pack.bench.load.Link}, frames encoded once) and waits until
  all are durable (``publish_s``); then times a Spark batch read of the
  whole stream over TCP with C{.count()} (``spark_count_s``,
  ``spark_count_rows_per_s``) and with every column materialised, written
  to the C{noop} format (``spark_noop_s``, ``spark_noop_rows_per_s``; the
  goal is 300,000 rows/s and more on 2 cores). Where the time goes: the
  same range read by L{BulkClient.read_range} in this one process, no
  Spark (``direct_read_s``, ``direct_read_rows_per_s``), the same again
  with each chunk made the source's Arrow batch as a Spark task makes it
  (:mod:`malamute_pack.spark.chunk_arrow`; ``direct_arrow_s``,
  ``direct_arrow_rows_per_s``: what one Spark task does before Spark takes
  over), and the broker process's own CPU seconds while it served the
  direct read and the Spark one (``direct_read_broker_cpu_s``,
  ``spark_noop_broker_cpu_s``). A read of the first 200,000 first warms
  the JVM and the Python workers up.
- plant: starts the ticker plant (1 s trigger, reading from the latest),
  then the trade generator (``examples/spark_trades.py``) at C{--rate}
  trades a second (default 1,000), and reads the ``vwap`` stream: for each
  message received after C{--warmup} seconds (default 10) and for
  C{--seconds} more (default 30), its latency is now minus
  ``last_trade_us``, the time the broker stored the latest trade it
  includes. Prints ``plant_latency_p50_s``, ``_p99_s``, ``_max_s`` (the
  goal: p50 and p99 under 2 s) and how many messages they are over
  (``plant_messages``); where the time goes: the micro-batches with trades
  in that time (``plant_batches``), their median and longest duration
  (``plant_batch_p50_s``, ``plant_batch_max_s``), and the median of their
  part that reads, aggregates and publishes (``plant_add_batch_p50_s``;
  the rest is Spark writing its checkpoint).

``--only read`` or ``--only plant`` runs one part. The plant part needs
the checkout (it runs the examples). It needs PySpark (the ``spark``
extra), which the other benchmarks do not: L{malamute_pack.bench.__main__}
imports this module only for ``spark``.

Tests: ``tests/system/test_bench_spark.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from pyspark.sql import DataFrameReader, SparkSession

from malamute_pack.bench import percentiles
from malamute_pack.bench.load import Link
from malamute_pack.bench.multicast.counters import cpu_seconds
from malamute_pack.client import BlockingClient
from malamute_pack.client.bulk import BulkClient, RangeChunk, RangeGap
from malamute_pack.protocol import mlm
from malamute_pack.spark import register
from malamute_pack.spark.chunk_arrow import chunk_record_batch
from malamute_pack.testing.brokerprocess import (
    ANY_TCP_PORT,
    PROJECT_ROOT,
    BrokerProcess,
    checkout_environment,
)

READ_STREAM = "bench"
PAYLOAD = b"x" * 100
# Messages read before the clock starts, so that the timed reads find the JVM warm.
WARMUP_READ = 200_000

_T = TypeVar("_T")


def emit(name: str, value: float) -> None:
    """Print one figure as a C{name value} line."""
    text = str(value) if isinstance(value, int) else f"{value:.3f}"
    print(f"{name} {text}", flush=True)


def percentile(values: Sequence[float], p: float) -> float:
    """The C{p}th percentile of C{values} by nearest rank (C{p} in 0-100]."""
    if not values:
        raise ValueError("no values")
    return percentiles.percentile(sorted(values), p / 100)


def timed(work: Callable[[], _T]) -> tuple[float, _T]:
    """C{work}'s result and the seconds it took."""
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def local_session() -> SparkSession:
    """A Spark session on every local core, with the C{malamute} source registered."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[*]")
        .appName("malamute-spark-bench")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def start_broker(directory: Path, retained: int) -> BrokerProcess:
    """A broker on tcp loopback with its journal in C{directory}, keeping C{retained} records."""
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / "malamute.cfg"
    config.write_text(
        "malamute\n    journal\n        retention\n"
        f"            max-count = {retained}\n            max-bytes = {retained * 1024}\n"
    )
    broker = BrokerProcess(
        directory, bind=ANY_TCP_PORT, timeout_ms=60_000, args=["--config", str(config)]
    )
    broker.start()
    return broker


def wait_durable(endpoint: str, stream: str, count: int, timeout: float) -> None:
    """Wait until C{stream} has C{count} durable records."""
    deadline = time.monotonic() + timeout
    with BulkClient(endpoint) as client:
        while (last := client.status(stream).last) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{stream} has {last} of {count} records durable after {timeout}s"
                )
            time.sleep(0.1)


def publish_messages(endpoint: str, stream: str, count: int) -> None:
    """Send C{count} messages to C{stream} as fast as the socket takes them; wait until durable."""
    link = Link(endpoint, ping_interval=1.0)
    try:
        link.command(mlm.ConnectionOpen())
        link.command(mlm.StreamWrite(stream))
        frames = mlm.encode(mlm.StreamSend("bench.tick", [PAYLOAD]))
        send = link.socket.send_multipart
        for _ in range(count):
            send(frames)
        # The broker takes some 20,000 a second at the least.
        wait_durable(endpoint, stream, count, timeout=60 + count / 20_000)
    finally:
        link.close()


def direct_read(endpoint: str, stream: str, last: int, arrow: bool = False) -> int:
    """
    Read C{stream} up to C{last} with one L{BulkClient}: as column chunks,
    or if C{arrow} as the source's Arrow batches (as a Spark task reads);
    the records read.
    """
    rows = 0
    with BulkClient(endpoint) as client:
        if arrow:
            for item in client.read_chunks(stream, 1, last, chunk_record_batch):
                if not isinstance(item, RangeGap):
                    rows += item.num_rows
        else:
            for chunk in client.read_range(stream, 1, last):
                if isinstance(chunk, RangeChunk):
                    rows += len(chunk.seq)
    return rows


def bench_read(spark: SparkSession, broker: BrokerProcess, messages: int) -> None:
    """The read part (see the module)."""
    endpoint = broker.endpoint
    seconds, _ = timed(lambda: publish_messages(endpoint, READ_STREAM, messages))
    emit("messages", messages)
    emit("publish_s", seconds)

    def source(end: int | None = None) -> DataFrameReader:
        reader = (
            spark.read.format("malamute")
            .option("endpoint", endpoint)
            .option("stream", READ_STREAM)
            .option("start", "earliest")
        )
        return reader if end is None else reader.option("end", str(end))

    # Two partitions: each core's Python worker is started and warm before the clock starts.
    warmup = source(min(WARMUP_READ, messages) + 1).option("partitions", 2)
    warmup.load().write.format("noop").mode("overwrite").save()

    seconds, counted = timed(lambda: source().load().count())
    if counted != messages:
        raise RuntimeError(f"Spark counted {counted} rows, not {messages}")
    emit("spark_count_s", seconds)
    emit("spark_count_rows_per_s", round(messages / seconds))

    cpu = cpu_seconds(broker.pid)
    seconds, _ = timed(lambda: source().load().write.format("noop").mode("overwrite").save())
    emit("spark_noop_s", seconds)
    emit("spark_noop_rows_per_s", round(messages / seconds))
    emit("spark_noop_broker_cpu_s", cpu_seconds(broker.pid) - cpu)

    cpu = cpu_seconds(broker.pid)
    seconds, rows = timed(lambda: direct_read(endpoint, READ_STREAM, messages))
    if rows != messages:
        raise RuntimeError(f"the direct read got {rows} rows, not {messages}")
    emit("direct_read_s", seconds)
    emit("direct_read_rows_per_s", round(messages / seconds))
    emit("direct_read_broker_cpu_s", cpu_seconds(broker.pid) - cpu)

    seconds, rows = timed(lambda: direct_read(endpoint, READ_STREAM, messages, arrow=True))
    if rows != messages:
        raise RuntimeError(f"the direct read to Arrow got {rows} rows, not {messages}")
    emit("direct_arrow_s", seconds)
    emit("direct_arrow_rows_per_s", round(messages / seconds))


def bench_plant(
    spark: SparkSession,
    broker: BrokerProcess,
    directory: Path,
    *,
    rate: float,
    warmup: float,
    seconds: float,
) -> None:
    """The plant part (see the module)."""
    from examples.spark_ticker_plant import start_plant

    endpoint = broker.endpoint
    query = start_plant(spark, endpoint, str(directory / "plant-checkpoint"), trigger="1 second")
    generator: subprocess.Popen[bytes] | None = None
    try:
        # Trades from the first batch's offsets on: wait for it before starting them.
        deadline = time.monotonic() + 60
        while not query.recentProgress:
            if not query.isActive or time.monotonic() > deadline:
                raise RuntimeError(f"the plant did not start: {query.exception()}")
            time.sleep(0.1)
        with BlockingClient(endpoint) as client:
            client.set_consumer("vwap", "")
            generator = subprocess.Popen(
                [
                    sys.executable,
                    str(PROJECT_ROOT / "examples" / "spark_trades.py"),
                    "--endpoint",
                    endpoint,
                    "--rate",
                    str(rate),
                    "--count",
                    str(math.ceil(rate * (warmup + seconds + 10))),
                ],
                env=checkout_environment(),
                stdout=subprocess.DEVNULL,
            )
            measure_from = time.time() + warmup
            until = measure_from + seconds
            latencies: list[float] = []
            while (now := time.time()) < until:
                delivery = client.recv(timeout=until - now)
                if delivery is None:
                    break
                received = time.time()
                if received < measure_from:
                    continue
                body = json.loads(delivery.content[0])
                latencies.append(received - body["last_trade_us"] / 1e6)
            if not query.isActive:
                raise RuntimeError(f"the plant stopped: {query.exception()}")
        generator.kill()
        generator.wait()
        # Stopped between batches: stopping one in the middle makes Spark log errors.
        query.processAllAvailable()
        batches = [
            p
            for p in query.recentProgress
            if p.numInputRows > 0 and _epoch(p.timestamp) >= measure_from
        ]
    finally:
        if generator is not None and generator.poll() is None:
            generator.kill()
            generator.wait()
        query.stop()
    if not latencies:
        raise RuntimeError("the plant published nothing while it was measured")
    emit("plant_rate", rate)
    emit("plant_messages", len(latencies))
    emit("plant_latency_p50_s", percentile(latencies, 50))
    emit("plant_latency_p99_s", percentile(latencies, 99))
    emit("plant_latency_max_s", max(latencies))
    if batches:
        durations = [p.durationMs["triggerExecution"] / 1000 for p in batches]
        emit("plant_batches", len(batches))
        emit("plant_batch_p50_s", percentile(durations, 50))
        emit("plant_batch_max_s", max(durations))
        adding = [p.durationMs["addBatch"] / 1000 for p in batches]
        emit("plant_add_batch_p50_s", percentile(adding, 50))


def _epoch(iso: str) -> float:
    """Seconds since the epoch of an ISO 8601 time with its zone (Spark's progress times)."""
    return datetime.fromisoformat(iso).timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench spark",
        description="Spark data source throughput and ticker plant latency against a broker.",
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages Spark reads")
    parser.add_argument("--only", choices=("read", "plant"), help="run one part only")
    parser.add_argument("--seconds", type=float, default=30.0, help="plant latency measured")
    parser.add_argument("--warmup", type=float, default=10.0, help="plant run before measuring")
    parser.add_argument("--rate", type=float, default=1000.0, help="trades a second")
    args = parser.parse_args(argv)
    if args.messages < 1 or args.seconds <= 0 or args.warmup < 0 or args.rate <= 0:
        parser.error("--messages, --seconds and --rate must be positive, --warmup not negative")
    with tempfile.TemporaryDirectory(prefix="malamute-spark-bench-") as temporary:
        directory = Path(temporary)
        broker = start_broker(directory / "broker", max(1_000_000, 2 * args.messages))
        try:
            spark = local_session()
            try:
                if args.only in (None, "read"):
                    bench_read(spark, broker, args.messages)
                if args.only in (None, "plant"):
                    bench_plant(
                        spark,
                        broker,
                        directory,
                        rate=args.rate,
                        warmup=args.warmup,
                        seconds=args.seconds,
                    )
            finally:
                spark.stop()
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
