"""
``python -m malamute_pack.bench multicast``, the command line of the
multicast benchmark: its options and defaults (L{parse}), what it needs of
this machine (L{unavailable}: root, C{ip}, C{iptables}, a libzmq with PGM)
and L{main}, which builds the hosts (a L{Lan} of three namespaces), plays
the rounds (L{malamute_pack.bench.multicast.throughput}) and prints:

- C{multicast_run round=R scenario=no_loss|loss_1pct receiver=B|C ...}:
  one receiver's figures in one run, as the run ends;
- a table: per scenario and receiver, the medians over the rounds (counts
  of missing, duplicated and late records and of notices summed);
- C{multicast_goal ...: met} or C{NOT met (...)};

and on stderr what could not be measured and the warnings and errors the
brokers logged.

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import zmq

from malamute_pack.bench import scenarios
from malamute_pack.bench.multicast.brokers import GROUP, HOSTS, PREFIX, SUBNET
from malamute_pack.bench.multicast.counters import CounterError
from malamute_pack.bench.multicast.throughput import LOSSY, MulticastResult, RunSettings, measure
from malamute_pack.testing.brokerprocess import BrokerError
from malamute_pack.testing.netns import Lan, NetnsError, netns_available

DEFAULT_MESSAGES = 100_000
DEFAULT_ROUNDS = 1
DEFAULT_RATE_KBPS = 1_000_000
DEFAULT_LOSS_PERCENT = 1.0
DEFAULT_IDLE = 10.0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench multicast",
        description="Measure a multicast bridge: a producer writes to broker A over TCP, A "
        f"publishes the stream on {GROUP} (PGM), brokers B and C receive it, a reader at each "
        f"counts what arrives; runs without loss and with C's host dropping UDP at random. "
        "Needs root (network namespaces, iptables).",
    )
    parser.add_argument(
        "--messages",
        type=int,
        default=DEFAULT_MESSAGES,
        metavar="N",
        help=f"100-byte records the producer writes per run (default {DEFAULT_MESSAGES})",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="K",
        help=f"rounds of a run without loss then one with (default {DEFAULT_ROUNDS}; medians)",
    )
    parser.add_argument(
        "--bridge-rate",
        type=int,
        default=DEFAULT_RATE_KBPS,
        metavar="KBPS",
        help=f"A's multicast rate limit, kbit/s (default {DEFAULT_RATE_KBPS})",
    )
    parser.add_argument(
        "--loss",
        type=float,
        default=DEFAULT_LOSS_PERCENT,
        metavar="PCT",
        help=f"UDP packets dropped at random on {LOSSY}'s host in the lossy run, in percent "
        f"(default {DEFAULT_LOSS_PERCENT:g})",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=DEFAULT_IDLE,
        metavar="S",
        help=f"a reader gives up after S seconds without a record (default {DEFAULT_IDLE:g})",
    )
    parser.add_argument(
        "--directory",
        type=Path,
        metavar="DIR",
        help="keep the brokers' directories and logs here (default: a temporary one, removed)",
    )
    args = parser.parse_args(argv)
    for name in ("messages", "rounds", "bridge_rate"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 < args.loss < 100:
        parser.error("--loss must be more than 0 and less than 100 (percent)")
    if args.idle <= 0:
        parser.error("--idle must be positive")
    return args


def unavailable() -> str | None:
    """Why this machine cannot run the benchmark, or None if it can."""
    reason = netns_available()
    if reason is not None:
        return f"{reason} (run it as root)"
    if shutil.which("iptables") is None:
        return "the lossy run needs the iptables command (scripts/bootstrap installs it)"
    if not zmq.has("pgm"):
        return (
            f"this libzmq ({zmq.zmq_version()}) has no PGM: build pyzmq against Debian's "
            "libzmq3-dev (scripts/bootstrap does; see docs/multicast.md)"
        )
    return None


def header(options: argparse.Namespace) -> str:
    return (
        f"# multicast bench: {options.messages} records of 100 bytes a run, "
        f"{options.rounds} round(s) of no_loss then loss at {options.loss:g}% on {LOSSY}'s host; "
        f"--bridge-rate {options.bridge_rate}; table: medians over the rounds, "
        "missing/dups/late/notices summed"
    )


def report_lines(result: MulticastResult) -> list[str]:
    """What L{main} prints after the run lines: the table and the goal line."""
    return [*result.table(), result.goal()]


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    reason = unavailable()
    if reason is not None:
        print(f"bench multicast: cannot run: {reason}", file=sys.stderr)
        return 2

    def say(line: str) -> None:
        print(line, flush=True)

    settings = RunSettings(options.messages, options.bridge_rate, options.loss, options.idle)
    say(header(options))
    with tempfile.TemporaryDirectory(prefix="malamute-bench-multicast-") as scratch:
        directory = (options.directory or Path(scratch)).resolve()
        try:
            with Lan(PREFIX, SUBNET, HOSTS) as lan:
                result = measure(lan, directory, options.rounds, settings, say)
        except (scenarios.BenchError, BrokerError, CounterError, NetnsError) as e:
            print(f"bench multicast: {e}", file=sys.stderr)
            return 1
    for line in report_lines(result):
        say(line)
    for note in result.notes:
        print(f"bench multicast: {note}", file=sys.stderr)
    return 0
