"""
``python -m malamute_pack.bench pair``, the command line of the pair
benchmark: its options and defaults (L{parse}) and L{main}, which runs the
throughput rounds (L{malamute_pack.bench.pair.throughput}) and the
fail-over cycles (L{malamute_pack.bench.pair.failover}) and prints their
lines of C{name=value} figures:

- C{pair_run round=R mode=single|sync|async scenario=S ...}: one run;
- C{pair_throughput measure=S single_per_s=... sync_per_s=...
  async_per_s=... sync_ratio=... async_ratio=... lost=...}: per measure,
  the medians over the rounds and their ratios to the single broker;
- with C{--curve}, instead: C{pair_run round=R mode=sync|curve ...} (a
  sync pair with an open link, and one with a CURVE link) and C{pair_curve
  measure=S open_per_s=... curve_per_s=... curve_ratio=... lost=...};
- C{pair_failover kill=K killed=primary|backup failover_s=...
  kill_to_ack_s=... rejoin_s=...}: one kill;
- C{pair_failover_summary kills=... median_s=... max_s=... acked=...
  lost=... duplicates=... unacked_delivered=...}.

Tests: ``tests/system/test_bench_pair.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from malamute_pack.bench import load, scenarios
from malamute_pack.bench.pair.brokers import ASYNC, SYNC
from malamute_pack.bench.pair.failover import FailoverError, measure_failover
from malamute_pack.bench.pair.throughput import MEASURES, Counts, measure_throughput
from malamute_pack.testing.brokerprocess import BrokerError

THROUGHPUT, FAILOVER = "throughput", "failover"
DEFAULT_ROUNDS = 3
DEFAULT_LETTERS = 100_000
DEFAULT_MESSAGES = 200_000
DEFAULT_APPENDED = 200_000
DEFAULT_KILLS = 10
DEFAULT_CLIENT_TIMEOUT = 1.0
DEFAULT_DWELL = 1.0
DEFAULT_STEP_TIMEOUT = 60.0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench pair",
        description="Measure a primary/backup pair of brokers: throughput against a single "
        "broker, and fail-over time under load.",
    )
    parser.add_argument(
        "--only", choices=(THROUGHPUT, FAILOVER), help="run one part (default both)"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="R",
        help=f"throughput rounds of single, sync, async, or of the open and CURVE links with"
        f" --curve (default {DEFAULT_ROUNDS}; medians)",
    )
    parser.add_argument(
        "--curve",
        action="store_true",
        help="throughput: a sync pair with a CURVE link (--pair-key) against one with an open "
        "link, alternating, instead of single, sync and async",
    )
    parser.add_argument(
        "--measure",
        action="append",
        choices=MEASURES,
        help="a throughput measure to play (repeatable; default all)",
    )
    parser.add_argument(
        "--letters",
        type=int,
        default=DEFAULT_LETTERS,
        metavar="N",
        help=f"mailbox_durable letters per run (default {DEFAULT_LETTERS})",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        metavar="N",
        help=f"stream_1to1 messages per run (default {DEFAULT_MESSAGES})",
    )
    parser.add_argument(
        "--appended",
        type=int,
        default=DEFAULT_APPENDED,
        metavar="N",
        help=f"stream_append records per run (default {DEFAULT_APPENDED})",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=load.DEFAULT_WINDOW,
        metavar="W",
        help=f"letters mailbox_durable's sender has waiting for STORED, at most "
        f"(default {load.DEFAULT_WINDOW})",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=DEFAULT_KILLS,
        metavar="N",
        help=f"times the active is killed in the fail-over part (default {DEFAULT_KILLS})",
    )
    parser.add_argument(
        "--replication",
        choices=(SYNC, ASYNC),
        default=SYNC,
        help=f"the fail-over pair's replication (default {SYNC})",
    )
    parser.add_argument(
        "--pair-heartbeat",
        type=int,
        metavar="MS",
        help="the pairs' heartbeat interval (default: the broker's, 500 ms)",
    )
    parser.add_argument(
        "--client-timeout",
        type=float,
        default=DEFAULT_CLIENT_TIMEOUT,
        metavar="S",
        help=f"the fail-over client's silence timeout (default {DEFAULT_CLIENT_TIMEOUT})",
    )
    parser.add_argument(
        "--dwell",
        type=float,
        default=DEFAULT_DWELL,
        metavar="S",
        help=f"seconds of load before each kill (default {DEFAULT_DWELL})",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=DEFAULT_STEP_TIMEOUT,
        metavar="S",
        help=f"give up when a fail-over step takes longer (default {DEFAULT_STEP_TIMEOUT})",
    )
    parser.add_argument(
        "--directory",
        type=Path,
        metavar="DIR",
        help="keep the brokers' directories and logs here (default: a temporary one, removed)",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "letters", "messages", "appended", "window", "kills"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.pair_heartbeat is not None and args.pair_heartbeat < 10:
        parser.error("--pair-heartbeat must be at least 10 ms")
    for name in ("client_timeout", "dwell", "step_timeout"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    args.measure = args.measure or list(MEASURES)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["malamute_pack.bench.load", "malamute_pack.bench.pair"])

    def say(line: str) -> None:
        print(line, flush=True)

    with tempfile.TemporaryDirectory(prefix="malamute-bench-pair-") as scratch:
        directory = (options.directory or Path(scratch)).resolve()
        try:
            if options.only != FAILOVER:
                counts = Counts(options.letters, options.messages, options.appended, options.window)
                throughput = measure_throughput(
                    directory / THROUGHPUT,
                    options.rounds,
                    options.measure,
                    counts,
                    context,
                    options.pair_heartbeat,
                    say,
                    curve=options.curve,
                )
                for line in throughput.lines():
                    say(line)
            if options.only != THROUGHPUT:
                failover = measure_failover(
                    directory,
                    options.kills,
                    context,
                    replication=options.replication,
                    heartbeat_ms=options.pair_heartbeat,
                    client_timeout=options.client_timeout,
                    dwell=options.dwell,
                    timeout=options.step_timeout,
                    report=say,
                )
                say(failover.lines()[-1])
        except (scenarios.BenchError, BrokerError, FailoverError) as e:
            print(f"bench pair: {e}", file=sys.stderr)
            return 1
    return 0
