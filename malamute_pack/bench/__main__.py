"""
``python -m malamute_pack.bench``: run the benchmark scenarios and print one
line of figures each (``scenario=NAME n=N secs=S msgs_per_s=R lost=L`` and
the scenario's extras).

Without ``--endpoint`` it starts its own broker process (with a long
heartbeat timeout) and stops it afterwards; with ``--endpoint`` it measures
a broker already running there, such as the C broker, and the load
processes ping it once a second so they are not expired for silence.
``--profile FILE`` runs the broker under cProfile (the stream scenarios,
unless ``--scenario`` says otherwise) and prints its 25 most expensive
functions by own time.

Tests: ``tests/test_bench.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pstats
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from malamute_pack.bench.brokerprocess import BrokerError, BrokerProcess
from malamute_pack.bench.scenarios import SCENARIOS, STREAM_SCENARIOS, BenchError, run


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
        "about a minute in all)",
    )
    parser.add_argument("--endpoint", metavar="EP", help="use the broker already bound here")
    parser.add_argument(
        "--profile", type=Path, metavar="FILE", help="run the broker under cProfile into FILE"
    )
    args = parser.parse_args(argv)
    if args.profile is not None and args.endpoint is not None:
        parser.error("--profile needs a broker this command starts: drop --endpoint")
    if args.profile is not None and not args.profile.resolve().parent.is_dir():
        parser.error(f"--profile: no directory {args.profile.resolve().parent}")
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be at least 1")
    return args


def print_profile(path: Path, top: int = 25) -> None:
    print(f"# broker profile {path}: top {top} functions by tottime", flush=True)
    pstats.Stats(str(path), stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    names = args.scenario or (list(STREAM_SCENARIOS) if args.profile else list(SCENARIOS))
    profile = args.profile.resolve() if args.profile else None
    # Load processes start from a clean, preloaded server: fast, and no
    # state of this process (sockets, the broker's Popen) leaks into them.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["malamute_pack.bench.load"])
    try:
        with tempfile.TemporaryDirectory(prefix="malamute-bench-") as tmp:
            broker = None
            endpoint = args.endpoint
            if endpoint is None:
                broker = BrokerProcess(Path(tmp), profile)
                broker.start()
                endpoint = broker.endpoint
            try:
                for name in names:
                    scenario = SCENARIOS[name]
                    result = run(scenario, endpoint, args.messages or scenario.default_n, context)
                    print(result.line(), flush=True)
            finally:
                if broker is not None:
                    broker.stop()
    except (BenchError, BrokerError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    if profile is not None:
        print_profile(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
