"""
Publish made-up trades on the ``trades`` stream, the input of the Spark
ticker plant (``examples/spark_ticker_plant.py``), with the blocking client.

Start a broker (``scripts/broker``), then, from the repository root::

    .venv/bin/python examples/spark_trades.py [-e ipc://@/malamute] [--user USER]
        [--rate 100] [--count 0] [--symbols ACME,GLOBEX,INITECH,UMBRELLA] [--seed N]

Each trade has the subject ``trade.SYMBOL`` and one frame of JSON,
``{"price": 101.25, "size": 300}``. Prices are a random walk per symbol;
with ``--seed`` the trades are the same on every run. ``--count 0`` (the
default) publishes until interrupted; ``--rate 0`` as fast as possible.
With ``--user``, the client authenticates with PLAIN, the password taken
from the environment variable ``MALAMUTE_PASSWORD``.

L{generate_trades} and L{trade_list} make the same trades for a program
(the ticker plant's test compares the plant's VWAP with a computation over
them), and L{publish} sends them at a rate.

Tests: ``tests/system/test_spark_ticker_plant.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from malamute_pack.client import BlockingClient, ClientError, plain_credentials

STREAM = "trades"
SUBJECT_PREFIX = "trade."
DEFAULT_SYMBOLS = ("ACME", "GLOBEX", "INITECH", "UMBRELLA")


@dataclass(frozen=True, slots=True)
class Trade:
    """One trade: C{size} shares of C{symbol} at C{price}."""

    symbol: str
    price: float
    size: int

    @property
    def subject(self) -> str:
        return SUBJECT_PREFIX + self.symbol

    def body(self) -> bytes:
        """The message's one frame: JSON C{{"price": float, "size": int}}."""
        return json.dumps({"price": self.price, "size": self.size}).encode()


def generate_trades(
    count: int | None = None, symbols: Sequence[str] = DEFAULT_SYMBOLS, seed: int | None = None
) -> Iterator[Trade]:
    """
    C{count} trades (endlessly if None) over C{symbols}: each symbol's price
    walks from its own start price by relative steps of about 0.1%, in
    cents; sizes are lots of 10 up to 1000. The same C{seed} gives the same
    trades.

    @raise ValueError: for no symbols or a negative count.
    """
    if not symbols:
        raise ValueError("at least one symbol is needed")
    if count is not None and count < 0:
        raise ValueError(f"count must be 0 or more, not {count}")
    rng = random.Random(seed)
    prices = {symbol: round(rng.uniform(20.0, 200.0), 2) for symbol in symbols}
    numbers = itertools.count() if count is None else range(count)
    for _ in numbers:
        symbol = rng.choice(symbols)
        price = max(0.01, round(prices[symbol] * math.exp(rng.gauss(0.0, 0.001)), 2))
        prices[symbol] = price
        yield Trade(symbol, price, rng.randint(1, 100) * 10)


def trade_list(
    count: int, symbols: Sequence[str] = DEFAULT_SYMBOLS, seed: int | None = 0
) -> list[Trade]:
    """The first C{count} trades of L{generate_trades} with C{seed}, as a list."""
    return list(generate_trades(count, symbols, seed))


def publish(
    client: BlockingClient,
    trades: Iterable[Trade],
    rate: float = 0.0,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """
    Send C{trades} on C{client}'s producer stream (the caller has called
    C{set_producer}), C{rate} a second (0: as fast as the client sends).
    Trade i leaves at start + i / rate, so a slow send does not slow the
    average; between sends the client keeps its heartbeats going.

    @return: how many trades were sent.
    """
    sent = 0
    start = clock()
    for trade in trades:
        if rate > 0:
            wait = start + sent / rate - clock()
            if wait > 0:
                client.pause(wait)
        client.send(trade.subject, [trade.body()])
        sent += 1
    return sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Publish made-up trades to the trades stream.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--rate", type=float, default=100.0, help="trades a second (0: no limit)")
    parser.add_argument("--count", type=int, default=0, help="trades to publish (0: forever)")
    parser.add_argument(
        "--symbols", default=",".join(DEFAULT_SYMBOLS), help="comma-separated symbols"
    )
    parser.add_argument("--seed", type=int, default=None, help="the same trades on every run")
    args = parser.parse_args(argv)
    symbols = [s.strip() for s in args.symbols.split(",") if s.strip()]
    if not symbols:
        parser.error("--symbols names no symbol")
    if args.count < 0 or args.rate < 0:
        parser.error("--count and --rate must be 0 or more")
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    sent = 0

    def counted(trades: Iterable[Trade]) -> Iterator[Trade]:
        # Counts the trades sent, so that an interrupted run still says how many.
        nonlocal sent
        for trade in trades:
            yield trade
            sent += 1  # resumed for the next one: this one was sent

    started = time.monotonic()
    try:
        with BlockingClient(args.endpoint, plain=plain) as client:
            client.set_producer(STREAM)
            trades = counted(generate_trades(args.count or None, symbols, args.seed))
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends a run of --count 0
                publish(client, trades, args.rate)
    except ClientError as e:
        print(f"spark_trades: {e}", file=sys.stderr)
        return 1
    print(f"published {sent} trades in {time.monotonic() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
