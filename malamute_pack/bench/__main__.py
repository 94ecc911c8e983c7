"""
``python -m malamute_pack.bench``: run the benchmark scenarios and print one
line of figures each (``scenario=NAME journal=on|off n=N secs=S
msgs_per_s=R lost=L`` and the scenario's extras).

Without ``--endpoint`` it starts its own brokers
(L{malamute_pack.bench.brokerprocess}), each on a fresh ipc endpoint with a
long heartbeat timeout and a fresh data directory, and stops them
afterwards, checking that each shut down cleanly:
by default (``--journal both``) one with ``--no-journal`` that plays the
scenarios whose journal cost is measured, then one with the journal that
plays every scenario; it then prints a ``journal_cost scenario=NAME
on_msgs_per_s=... off_msgs_per_s=... ratio=...`` line for each scenario
that ran on both. ``--journal on`` or ``off`` starts just one of them.

With ``--endpoint`` it measures a broker already running there, such as
the C broker, plays each scenario once and prints no ``journal`` key (it
cannot know); the load processes ping that broker once a second so they
are not expired for silence.

``--window W`` bounds the letters mailbox_durable's sender has sent and
not yet seen STORED for (default 1000).

``--profile FILE`` runs the journal-on broker (the journal-off one with
``--journal off``) under cProfile (the stream scenarios, unless
``--scenario`` says otherwise) and prints its 25 most expensive functions
by own time.

``python -m malamute_pack.bench pack ...`` measures a pack of brokers on
hosts made as network namespaces instead (root only): see
L{malamute_pack.bench.pack} and its C{--help}.

``python -m malamute_pack.bench pair ...`` measures a primary/backup pair:
its throughput (sync and async replication) against a single broker, and
its fail-over time under load: see L{malamute_pack.bench.pair} and its
C{--help}.

``python -m malamute_pack.bench multicast ...`` measures a multicast bridge
from one broker to two on hosts made as network namespaces (root only):
see L{malamute_pack.bench.multicast} and its C{--help}.

``python -m malamute_pack.bench ops ...`` measures what the statistics and
the management API cost on stream 1:1: see L{malamute_pack.bench.ops}.

Tests: ``tests/test_bench.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pstats
import sys
import tempfile
from collections.abc import Sequence
from multiprocessing.context import BaseContext
from pathlib import Path

from malamute_pack.bench import multicast as multicast_bench
from malamute_pack.bench import ops as ops_bench
from malamute_pack.bench import pack
from malamute_pack.bench import pair as pair_bench
from malamute_pack.bench.brokerprocess import BrokerError, BrokerProcess
from malamute_pack.bench.load import DEFAULT_WINDOW, Job
from malamute_pack.bench.scenarios import (
    JOURNAL_BOTH,
    JOURNAL_OFF,
    JOURNAL_ON,
    SCENARIOS,
    STREAM_SCENARIOS,
    BenchError,
    BrokerRun,
    JournalUse,
    Result,
    journal_cost_lines,
    plan,
    run,
)

# The heartbeat timeout of the brokers it starts: long enough that no load
# process is expired for silence during a run.
BROKER_TIMEOUT_MS = 600_000


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench", description="Benchmark a Malamute broker."
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        help="run this scenario (repeatable; default: all, or the stream ones with --profile)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        metavar="N",
        help="messages per sender, round trips for service_rr (default: per scenario, "
        "about two minutes in all)",
    )
    parser.add_argument(
        "--window",
        type=int,
        metavar="W",
        default=DEFAULT_WINDOW,
        help=f"letters mailbox_durable's sender has waiting for STORED, at most "
        f"(default {DEFAULT_WINDOW})",
    )
    parser.add_argument("--endpoint", metavar="EP", help="use the broker already bound here")
    parser.add_argument(
        "--journal",
        choices=(JOURNAL_ON, JOURNAL_OFF, JOURNAL_BOTH),
        help="start a broker with the journal, without it, or both and compare them (default both)",
    )
    parser.add_argument(
        "--profile", type=Path, metavar="FILE", help="run the broker under cProfile into FILE"
    )
    args = parser.parse_args(argv)
    if args.profile is not None and args.endpoint is not None:
        parser.error("--profile needs a broker this command starts: drop --endpoint")
    if args.journal is not None and args.endpoint is not None:
        parser.error("--journal needs a broker this command starts: drop --endpoint")
    if args.profile is not None and not args.profile.resolve().parent.is_dir():
        parser.error(f"--profile: no directory {args.profile.resolve().parent}")
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be at least 1")
    if args.window < 1:
        parser.error("--window must be at least 1")
    if args.journal == JOURNAL_OFF:
        needy = [n for n in args.scenario or () if SCENARIOS[n].journal is JournalUse.REQUIRED]
        if needy:
            parser.error(f"{', '.join(needy)} needs the journal: drop --journal off")
    return args


def print_profile(path: Path, top: int = 25) -> None:
    print(f"# broker profile {path}: top {top} functions by tottime", flush=True)
    pstats.Stats(str(path), stream=sys.stdout).sort_stats("tottime").print_stats(top)


def play(
    broker_run: BrokerRun, endpoint: str, args: argparse.Namespace, context: BaseContext
) -> list[Result]:
    """Play a run's scenarios against the broker at C{endpoint}, printing each line."""
    results = []
    for scenario in broker_run.scenarios:
        job = Job(args.messages or scenario.default_n, window=args.window)
        result = run(scenario, endpoint, job, context, broker_run.journal)
        print(result.line(), flush=True)
        results.append(result)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    if arguments[:1] == ["pack"]:
        return pack.main(arguments[1:])
    if arguments[:1] == ["pair"]:
        return pair_bench.main(arguments[1:])
    if arguments[:1] == ["multicast"]:
        return multicast_bench.main(arguments[1:])
    if arguments[:1] == ["ops"]:
        return ops_bench.main(arguments[1:])
    args = parse(arguments)
    names = args.scenario or (list(STREAM_SCENARIOS) if args.profile else list(SCENARIOS))
    profile = args.profile.resolve() if args.profile else None
    runs = plan(names, None if args.endpoint else args.journal or JOURNAL_BOTH)
    # Load processes start from a clean, preloaded server: fast, and no
    # state of this process (sockets, the brokers' Popen) leaks into them.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["malamute_pack.bench.load"])
    results: list[Result] = []
    try:
        if args.endpoint is not None:
            results += play(runs[0], args.endpoint, args, context)
        else:
            # The journal-on broker, the one whose costs matter, is profiled.
            profiled = next((r for r in runs if r.journal), runs[-1])
            for broker_run in runs:
                assert broker_run.journal is not None
                with (
                    tempfile.TemporaryDirectory(prefix="malamute-bench-") as tmp,
                    BrokerProcess(
                        Path(tmp),
                        journal=broker_run.journal,
                        timeout_ms=BROKER_TIMEOUT_MS,
                        profile=profile if broker_run is profiled else None,
                    ) as broker,
                ):
                    results += play(broker_run, broker.endpoint, args, context)
    except (BenchError, BrokerError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    for line in journal_cost_lines(results):
        print(line, flush=True)
    if profile is not None:
        print_profile(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
