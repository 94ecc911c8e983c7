"""
``python -m malamute_pack.bench``: run the benchmark scenarios and print one
line of figures each (``scenario=NAME journal=on|off n=N secs=S
msgs_per_s=R lost=L`` and the scenario's extras).

Without ``--endpoint`` it starts its own brokers
(L{malamute_pack.testing.brokerprocess}), each on a fresh ipc endpoint with a
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

Two scenarios run only when named with ``--scenario``:

- ``latency`` (L{malamute_pack.bench.latency}): a writer paced at each of
  ``--rates`` (default 1000,10000,50000 msgs/s) for 5 s each (or
  ``--messages`` each), a reader taking each delivery's latency; a line
  per rate: ``scenario=latency rate=R n=N p50_us= p99_us= p999_us=
  max_us= lost= achieved_per_s= behind=0|1``.
- ``scale`` (L{malamute_pack.bench.scale}): ``--clients`` idle clients
  (default 10000) with ``--subscriptions`` in all (default 100000), the
  broker's memory per client and per subscription, and stream 1:1
  (``--messages``, default 300000) with them against without them. It
  needs the broker's pid: its own brokers' are known, an external one's is
  given with ``--broker-pid``. For it the bench starts its broker with a
  config file raising ``max-clients`` and ``max-subscriptions`` where the
  defaults are too low (L{malamute_pack.bench.scale.broker_config}), and
  raises its own open-files limit first, which the broker inherits.

``--compare EP`` (L{malamute_pack.bench.compare}) starts one broker of ours
(the journal on, or off with ``--journal off``) and plays each scenario
against it and against the broker at EP in alternation, ``--rounds``
rounds (default 3), printing every run's line with ``broker=ours`` or
``broker=other`` and then a ``compare`` line of medians and ratios per
scenario. Our broker keeps the long heartbeat timeout
(L{BROKER_TIMEOUT_MS}) there too: the load processes ping every broker
once a second anyway (the C broker expires silent clients), so the
timeout changes no traffic, and a long one means a stall of this shared
machine never expires a client in the middle of a run. For a like-for-like
scale comparison, its idle clients ping both brokers (the other needs it;
against its own brokers alone they stay silent). Scale's memory figures
are a broker's growth, so only a broker's first play measures them (a later
play on the same process reuses what the first freed): the comparison
takes them from the first round (L{malamute_pack.bench.compare}).

``--silent-idle`` keeps scale's idle clients silent against an external
broker too (``--endpoint``, ``--compare``), which must then not expire
them within a play (the C broker: a long ``server/timeout``). Pings touch
each connection's ZeroMQ queues, so pinged clients' memory grows with the
time they wait for the slowest to open: silent ones give the same figure
from one play to the next, the way to set two brokers' memory per idle
client side by side (a fresh broker process per play, alternating).

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

``python -m malamute_pack.bench floor ...`` measures the round-trip floor of
the machine with bare pyzmq (an echo, and a relay shaped like a service
round trip): see L{malamute_pack.bench.floor}.

``python -m malamute_pack.bench bruteforce ...`` brute-forces PLAIN
passwords against a broker of ours while the right user logs in from the
same address, and measures the broker's CPU: see
L{malamute_pack.bench.bruteforce}.

``python -m malamute_pack.bench lastvalues ...`` measures how long a
last-value stream's snapshot of 100,000 subjects takes to reach a client:
see L{malamute_pack.bench.lastvalues}.

``python -m malamute_pack.bench spark ...`` measures how fast Spark reads
a broker's stream through the ``malamute`` data source, and the ticker
plant's latency (PySpark needed: the ``spark`` extra): see
L{malamute_pack.bench.spark} and its C{--help}.

Tests: ``tests/system/test_bench.py``.
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

from malamute_pack.bench import bruteforce, floor, lastvalues, pack, scale
from malamute_pack.bench import multicast as multicast_bench
from malamute_pack.bench import ops as ops_bench
from malamute_pack.bench import pair as pair_bench
from malamute_pack.bench.compare import DEFAULT_ROUNDS, OTHER, OURS, run_comparison
from malamute_pack.bench.load import DEFAULT_WINDOW
from malamute_pack.bench.plays import Choices, Target, play
from malamute_pack.bench.scenarios import (
    DEFAULT_RATES,
    DEFAULT_SCENARIOS,
    JOURNAL_BOTH,
    JOURNAL_OFF,
    JOURNAL_ON,
    SCALE,
    SCENARIOS,
    STREAM_SCENARIOS,
    BenchError,
    JournalUse,
    Measured,
    Result,
    journal_cost_lines,
    plan,
)
from malamute_pack.testing.brokerprocess import BrokerError, BrokerProcess

# The heartbeat timeout of the brokers it starts: long enough that no load
# process is expired for silence during a run.
BROKER_TIMEOUT_MS = 600_000
# Open files the bench's broker may need beyond one per idle client of scale.
FD_MARGIN = 4096


def _rates(text: str) -> tuple[int, ...]:
    try:
        rates = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of whole numbers: {text!r}") from None
    if not rates or min(rates) < 1:
        raise argparse.ArgumentTypeError("every rate must be at least 1 msg/s")
    return rates


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench", description="Benchmark a Malamute broker."
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIOS),
        help="run this scenario (repeatable; default: all but latency and scale, or the "
        "stream ones with --profile)",
    )
    parser.add_argument(
        "--messages",
        type=int,
        metavar="N",
        help="messages per sender, round trips for service_rr, messages per rate for latency, "
        "per stream run for scale (default: per scenario, about two minutes in all)",
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
        "--compare",
        metavar="EP",
        help="play each scenario against a broker of ours and the one at EP in alternation",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        metavar="R",
        help=f"rounds of --compare (default {DEFAULT_ROUNDS})",
    )
    parser.add_argument(
        "--broker-pid",
        type=int,
        metavar="PID",
        help="the process of the broker at --endpoint or --compare's EP (for scale's memory)",
    )
    parser.add_argument(
        "--silent-idle",
        action="store_true",
        help="scale's idle clients never ping, against --endpoint's or --compare's broker too "
        "(which must then not expire silent clients during a play): memory figures that do "
        "not depend on how long the clients waited",
    )
    parser.add_argument(
        "--rates",
        type=_rates,
        default=DEFAULT_RATES,
        metavar="R,R,...",
        help="latency's rates in msgs/s (default " + ",".join(map(str, DEFAULT_RATES)) + ")",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=scale.DEFAULT_CLIENTS,
        metavar="N",
        help=f"scale's idle clients (default {scale.DEFAULT_CLIENTS})",
    )
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=scale.DEFAULT_SUBSCRIPTIONS,
        metavar="N",
        help=f"scale's subscriptions in all (default {scale.DEFAULT_SUBSCRIPTIONS})",
    )
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
    if args.compare is not None and args.endpoint is not None:
        parser.error("--compare starts a broker of ours to set against EP: drop --endpoint")
    if args.compare is not None and args.journal == JOURNAL_BOTH:
        parser.error("--compare starts one broker of ours: --journal on or off")
    if args.rounds is not None and args.compare is None:
        parser.error("--rounds needs --compare")
    if args.rounds is not None and args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.broker_pid is not None and args.endpoint is None and args.compare is None:
        parser.error("--broker-pid is an external broker's: give --endpoint or --compare")
    if args.silent_idle and args.endpoint is None and args.compare is None:
        parser.error("--silent-idle is for an external broker (the bench's own are never pinged)")
    if args.clients < 1:
        parser.error("--clients must be at least 1")
    if args.subscriptions < 0:
        parser.error("--subscriptions must not be negative")
    if args.endpoint is not None and args.broker_pid is None and SCALE in (args.scenario or ()):
        parser.error("scale measures the broker's memory: give its --broker-pid")
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


def emit(line: str) -> None:
    print(line, flush=True)


def play_all(
    names: Sequence[str], target: Target, choices: Choices, context: BaseContext
) -> list[Measured]:
    """Play the scenarios C{names} against C{target}, printing each line as it comes."""
    results = []
    for name in names:
        for result in play(SCENARIOS[name], target, choices, context):
            emit(result.line())
            results.append(result)
    return results


def broker_args(directory: Path, names: Sequence[str], args: argparse.Namespace) -> list[str]:
    """
    The extra arguments of the bench's own broker: for scale, a config file
    (written in C{directory}) with limits that let it hold the clients.
    """
    if SCALE not in names:
        return []
    config = directory / "bench-scale.cfg"
    config.write_text(scale.broker_config(args.clients, args.subscriptions))
    return ["-c", str(config)]


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
    if arguments[:1] == ["floor"]:
        return floor.main(arguments[1:])
    if arguments[:1] == ["bruteforce"]:
        return bruteforce.main(arguments[1:])
    if arguments[:1] == ["lastvalues"]:
        return lastvalues.main(arguments[1:])
    if arguments[:1] == ["spark"]:
        # Imported only here: PySpark is an optional extra (malamute_pack[spark]).
        from malamute_pack.bench import spark as spark_bench

        return spark_bench.main(arguments[1:])
    args = parse(arguments)
    names = args.scenario or list(STREAM_SCENARIOS if args.profile else DEFAULT_SCENARIOS)
    profile = args.profile.resolve() if args.profile else None
    choices = Choices(args.messages, args.window, args.rates, args.clients, args.subscriptions)
    if SCALE in names:
        # Before any broker starts: it inherits the limit.
        scale.raise_fd_limit(args.clients + FD_MARGIN)
    # Load processes start from a clean, preloaded server: fast, and no
    # state of this process (sockets, the brokers' Popen) leaks into them.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(
        ["malamute_pack.bench.load", "malamute_pack.bench.latency", "malamute_pack.bench.scale"]
    )
    results: list[Measured] = []
    try:
        if args.compare is not None:
            journal = args.journal != JOURNAL_OFF
            with (
                tempfile.TemporaryDirectory(prefix="malamute-bench-") as tmp,
                BrokerProcess(
                    Path(tmp),
                    journal=journal,
                    timeout_ms=BROKER_TIMEOUT_MS,
                    args=broker_args(Path(tmp), names, args),
                    profile=profile,
                ) as broker,
            ):
                ping = not args.silent_idle
                ours = Target(broker.endpoint, journal, OURS, broker.pid, ping_idle=ping)
                other = Target(
                    args.compare, None, OTHER, args.broker_pid, extensions=False, ping_idle=ping
                )
                rounds = args.rounds or DEFAULT_ROUNDS
                results += run_comparison(names, ours, other, choices, rounds, context, emit)
        elif args.endpoint is not None:
            target = Target(args.endpoint, pid=args.broker_pid, ping_idle=not args.silent_idle)
            results += play_all(names, target, choices, context)
        else:
            runs = plan(names, args.journal or JOURNAL_BOTH)
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
                        args=broker_args(Path(tmp), [s.name for s in broker_run.scenarios], args),
                        profile=profile if broker_run is profiled else None,
                    ) as broker,
                ):
                    target = Target(broker.endpoint, broker_run.journal, pid=broker.pid)
                    names_here = [s.name for s in broker_run.scenarios]
                    results += play_all(names_here, target, choices, context)
    except (BenchError, BrokerError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    for line in journal_cost_lines([r for r in results if isinstance(r, Result)]):
        emit(line)
    if profile is not None:
        print_profile(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
