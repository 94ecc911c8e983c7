"""
Tests for the Spark ticker plant example (``examples/spark_ticker_plant.py``)
and its trade generator (``examples/spark_trades.py``): the plant's VWAP per
symbol and 10-second window equals a plain Python computation over the same
trades, on rows made in memory and end to end through a real broker (trades
published to its ``trades`` stream, the plant run with trigger availableNow,
its ``vwap`` stream read back).

The Spark tests share one local session (L{tests.spark_support}) and are
slow (skipped with MALAMUTE_SKIP_SLOW).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.listener import StreamingQueryProgress
from twisted.trial.unittest import SynchronousTestCase

from examples.spark_ticker_plant import VWAP_COLUMNS, start_plant, vwap, vwap_messages
from examples.spark_trades import DEFAULT_SYMBOLS, Trade, generate_trades, publish, trade_list
from malamute_pack.client import BlockingClient
from malamute_pack.client.bulk import BulkClient, RangeChunk
from malamute_pack.protocol.chunks import decode_frames
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess
from tests.spark_support import spark_for
from tests.support import skip_slow

WINDOW_US = 10_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# The malamute source's columns.
SOURCE_SCHEMA = (
    "stream string, seq bigint, timestamp timestamp, sender string, subject string, "
    "fields map<string,string>, frames array<binary>"
)


@dataclass(frozen=True, slots=True)
class Window:
    """What the plant says about one symbol's window (the key is symbol, start)."""

    vwap: float
    volume: int
    trades: int
    last_trade_us: int


def expected_windows(trades: Iterable[tuple[int, Trade]]) -> dict[tuple[str, int], Window]:
    """
    The VWAP of (timestamp in microseconds since the epoch, trade) pairs per
    symbol and 10-second window, keyed by (symbol, window start in
    microseconds): the plain computation the plant must agree with.
    """
    sums: dict[tuple[str, int], list[float]] = {}
    for timestamp_us, trade in trades:
        key = (trade.symbol, timestamp_us - timestamp_us % WINDOW_US)
        notional, volume, count, last = sums.get(key, [0.0, 0, 0, 0])
        sums[key] = [
            notional + trade.price * trade.size,
            volume + trade.size,
            count + 1,
            max(last, timestamp_us),
        ]
    return {
        key: Window(notional / volume, int(volume), int(count), int(last))
        for key, (notional, volume, count, last) in sums.items()
    }


def epoch_us(moment: datetime) -> int:
    """Microseconds since the epoch of an aware datetime, exactly."""
    return (moment - EPOCH) // timedelta(microseconds=1)


def parse_iso(text: str) -> int:
    """An ISO 8601 time with a zone, as microseconds since the epoch."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return epoch_us(moment)


class PlantAssertions(SynchronousTestCase):
    def assertWindowsEqual(
        self, got: dict[tuple[str, int], Window], expected: dict[tuple[str, int], Window]
    ) -> None:
        """The same windows with the same figures; VWAPs within floating error."""
        self.assertEqual(sorted(got), sorted(expected))
        for key, want in expected.items():
            have = got[key]
            self.assertEqual(
                (have.volume, have.trades, have.last_trade_us),
                (want.volume, want.trades, want.last_trade_us),
                key,
            )
            self.assertTrue(
                abs(have.vwap - want.vwap) <= 1e-9 * want.vwap, f"{key}: {have} != {want}"
            )


class GeneratorTests(SynchronousTestCase):
    """The trade generator, without a broker."""

    def test_seeded(self) -> None:
        """The same seed gives the same trades; another seed others."""
        self.assertEqual(trade_list(200, seed=7), trade_list(200, seed=7))
        self.assertNotEqual(trade_list(200, seed=7), trade_list(200, seed=8))

    def test_trades(self) -> None:
        """
        Trades are over the symbols given, each in the right subject, with
        positive prices in cents, sizes in lots of 10, and a body of JSON
        with just the price and the size.
        """
        trades = trade_list(500, ("X", "Y"), seed=1)
        self.assertEqual({t.symbol for t in trades}, {"X", "Y"})
        for trade in trades:
            self.assertEqual(trade.subject, f"trade.{trade.symbol}")
            self.assertGreater(trade.price, 0)
            self.assertEqual(round(trade.price, 2), trade.price)
            self.assertIn(trade.size, range(10, 1001, 10))
            self.assertEqual(json.loads(trade.body()), {"price": trade.price, "size": trade.size})

    def test_randomWalk(self) -> None:
        """Each symbol's price moves by small steps from one trade to its next."""
        last: dict[str, float] = {}
        for trade in generate_trades(2000, DEFAULT_SYMBOLS, seed=3):
            if trade.symbol in last:
                self.assertLess(abs(trade.price / last[trade.symbol] - 1), 0.01)
            last[trade.symbol] = trade.price

    def test_endless(self) -> None:
        """Without a count the generator goes on; a negative count is refused."""
        trades = generate_trades(None, ("X",), seed=0)
        self.assertEqual(len([next(trades) for _ in range(10_000)]), 10_000)
        self.assertRaises(ValueError, lambda: list(generate_trades(-1)))
        self.assertRaises(ValueError, lambda: list(generate_trades(1, ())))


class VwapTests(PlantAssertions):
    """L{vwap} and L{vwap_messages} on rows made in memory."""

    skip = skip_slow

    def rows(self, stamped: Sequence[tuple[int, Trade]]) -> list[tuple[Any, ...]]:
        """Source rows of C{stamped} trades, as the malamute source gives them."""
        return [
            (
                "trades",
                seq,
                EPOCH + timedelta(microseconds=ts_us),
                "",
                trade.subject,
                None,
                [trade.body()],
            )
            for seq, (ts_us, trade) in enumerate(stamped, 1)
        ]

    def test_vwapMatchesPython(self) -> None:
        """
        Over trades spread across several windows, every symbol's window
        has the VWAP, volume, trade count and latest trade time that a
        plain computation gives.
        """
        start = 1_700_000_003_250_000
        stamped = [(start + i * 73_000, t) for i, t in enumerate(trade_list(600, seed=11))]
        frame = spark_for(self).createDataFrame(self.rows(stamped), SOURCE_SCHEMA)
        got = {
            (r.symbol, epoch_us(r.window_start.astimezone(UTC))): Window(
                r.vwap, r.volume, r.trades, r.last_trade_us
            )
            for r in vwap(frame).collect()
        }
        expected = expected_windows(stamped)
        self.assertGreater(len({start for _, start in expected}), 3)
        self.assertWindowsEqual(got, expected)

    def test_badTradesLeftOut(self) -> None:
        """
        Rows whose subject is not a trade's, whose first frame is not JSON
        of a trade or is missing, or whose size is not positive count for
        nothing.
        """
        ts = EPOCH + timedelta(seconds=1_700_000_001)
        good = Trade("A", 10.0, 100)
        bad_rows: list[tuple[str, list[bytes]]] = [
            ("trade.A", [b"not json"]),
            ("trade.A", []),
            ("trade.A", [b'{"price": 99.0, "size": 0}']),
            ("trade.A", [b'{"price": 99.0, "size": -5}']),
            ("trade.A", [b'{"size": 5}']),
            ("trade.", [good.body()]),
            ("quote.A", [good.body()]),
        ]
        rows = [("trades", 1, ts, "", good.subject, None, [good.body()])] + [
            ("trades", seq, ts, "", subject, None, frames)
            for seq, (subject, frames) in enumerate(bad_rows, 2)
        ]
        result = vwap(spark_for(self).createDataFrame(rows, SOURCE_SCHEMA)).collect()
        self.assertEqual(
            [(r.symbol, r.vwap, r.volume, r.trades) for r in result], [("A", 10.0, 100, 1)]
        )

    def test_messages(self) -> None:
        """
        Each window becomes one message: subject vwap.SYMBOL, and a JSON
        object with exactly the plant's fields, the window's bounds in ISO
        8601 UTC whatever the session's time zone.
        """
        ts_us = 1_700_000_012_345_678
        session = spark_for(self)
        frame = session.createDataFrame(
            self.rows([(ts_us, Trade("ACME", 12.5, 40))]), SOURCE_SCHEMA
        )
        zone = session.conf.get("spark.sql.session.timeZone")
        session.conf.set("spark.sql.session.timeZone", "America/New_York")
        try:
            [message] = vwap_messages(vwap(frame)).collect()
        finally:
            session.conf.set("spark.sql.session.timeZone", zone or "UTC")
        self.assertEqual(message.subject, "vwap.ACME")
        body = json.loads(message.value)
        self.assertEqual(list(body), list(VWAP_COLUMNS))
        self.assertEqual(
            body,
            {
                "symbol": "ACME",
                "window_start": "2023-11-14T22:13:30Z",
                "window_end": "2023-11-14T22:13:40Z",
                "vwap": 12.5,
                "volume": 40,
                "trades": 1,
                "last_trade_us": ts_us,
            },
        )
        self.assertEqual(parse_iso(body["window_start"]), ts_us - ts_us % WINDOW_US)


def read_stream(client: BulkClient, stream: str) -> list[tuple[int, str, tuple[bytes, ...]]]:
    """Every record of C{stream}: (timestamp in us, subject, frames), in order."""
    last = client.status(stream).last
    records: list[tuple[int, str, tuple[bytes, ...]]] = []
    for chunk in client.read_range(stream, 1, last):
        if not isinstance(chunk, RangeChunk):
            raise AssertionError(f"records of {stream} lost to retention: {chunk}")
        records.extend(
            (ts, subject, decode_frames(content))
            for ts, subject, content in zip(
                chunk.timestamp_us, chunk.subject, chunk.content, strict=True
            )
        )
    return records


def wait_durable(client: BulkClient, stream: str, count: int, timeout: float = 30.0) -> None:
    """Wait until C{stream} has C{count} durable records."""
    deadline = time.monotonic() + timeout
    while (last := client.status(stream).last) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{stream} has {last} durable records, not {count}")
        time.sleep(0.05)


def forget_batches(checkpoint: Path, batch: int) -> None:
    """
    Make a streaming query's C{checkpoint} as if the query had died while
    running micro-batch C{batch}: its offsets logged, its commit and every
    later batch gone.
    """
    for log, first_gone in (("offsets", batch + 1), ("commits", batch)):
        for path in (checkpoint / log).iterdir():
            number = path.name.lstrip(".").split(".")[0]  # "7", or ".7.crc"
            if number.isdigit() and int(number) >= first_gone:
                path.unlink()


class PlantTests(PlantAssertions):
    """The plant end to end against a real broker."""

    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()), bind=ANY_TCP_PORT)
        self.broker.start()
        self.addCleanup(self.broker.stop)

    def publish(self, trades: Sequence[Trade]) -> None:
        """
        Publish C{trades} in two halves, the second one just after a
        10-second boundary of the clock, so that they fall into two windows
        at least; wait until all are durable.
        """
        half = len(trades) // 2
        with BlockingClient(self.broker.endpoint) as client:
            client.set_producer("trades")
            publish(client, trades[:half], rate=2000)
            client.pause(WINDOW_US / 1e6 - time.time() % (WINDOW_US / 1e6) + 0.2)
            publish(client, trades[half:], rate=2000)
        with BulkClient(self.broker.endpoint) as bulk:
            wait_durable(bulk, "trades", len(trades))

    def test_plantMatchesPython(self) -> None:
        """
        Trades published to the broker, run through the plant (trigger
        availableNow, several micro-batches, output mode update): the last
        message in C{vwap} for each symbol's window has the VWAP, volume,
        count and latest trade time that a plain computation over the
        trades as the broker stored them gives; every message is well
        formed. Restarted from its checkpoint after its last micro-batch
        with trades lost its commit, the plant runs that batch again and
        publishes nothing twice.
        """
        trades = trade_list(1200, seed=5)
        self.publish(trades)
        checkpoint = Path(self.mktemp())
        progress = self.runPlant(checkpoint)
        self.assertGreaterEqual(len([p for p in progress if p.numInputRows > 0]), 4)

        with BulkClient(self.broker.endpoint) as bulk:
            stored = read_stream(bulk, "trades")
            messages = read_stream(bulk, "vwap")
        self.assertEqual(
            [(subject, frames) for _, subject, frames in stored],
            [(t.subject, (t.body(),)) for t in trades],
        )
        expected = expected_windows(
            (ts, trade) for (ts, _, _), trade in zip(stored, trades, strict=True)
        )
        self.assertGreaterEqual(len({start for _, start in expected}), 2)

        got: dict[tuple[str, int], Window] = {}
        for _, subject, frames in messages:
            [frame] = frames
            body = json.loads(frame)
            self.assertEqual(list(body), list(VWAP_COLUMNS))
            self.assertEqual(subject, f"vwap.{body['symbol']}")
            start = parse_iso(body["window_start"])
            self.assertEqual(parse_iso(body["window_end"]), start + WINDOW_US)
            # Update mode: a later message for the window replaces an earlier one.
            got[body["symbol"], start] = Window(
                body["vwap"], body["volume"], body["trades"], body["last_trade_us"]
            )
        self.assertGreater(len(messages), len(got), "no window was updated in a later batch")
        self.assertWindowsEqual(got, expected)

        # As if the plant had died before committing its last batch with trades:
        # restarted, it runs that batch again, and publishes none of it twice.
        last = max(p.batchId for p in progress if p.numInputRows > 0)
        forget_batches(checkpoint, last)
        again = self.runPlant(checkpoint)
        self.assertIn(last, [p.batchId for p in again if p.numInputRows > 0])
        with BulkClient(self.broker.endpoint) as bulk:
            self.assertEqual(read_stream(bulk, "vwap"), messages)

    def runPlant(self, checkpoint: Path) -> list[StreamingQueryProgress]:
        """
        Run the plant with trigger availableNow from the earliest trade, 250
        trades a micro-batch at most, until it stops; its progress reports.
        """
        query = start_plant(
            spark_for(self),
            self.broker.endpoint,
            str(checkpoint),
            available_now=True,
            start="earliest",
            max_rows_per_batch=250,
        )
        query.awaitTermination(120)
        self.assertFalse(query.isActive, "the plant did not finish in time")
        self.assertIsNone(query.exception())
        return query.recentProgress
