"""
``python -m malamute_pack.bench ops``: what the broker's statistics and its
management API cost on the stream 1:1 scenario.

It starts two journal-on brokers in turn on fresh data directories: one
plain, one with ``--http tcp:0:interface=127.0.0.1`` (the management API
listening, its statistics sampled every second), and plays the same
scenario on each, alternating, C{--rounds} times (this machine is shared
and noisy: a ratio measured in one sitting, medians). With C{--poll} a
dashboard-like poller asks the API for every section every 2 s while the
second broker is measured (the API in use rather than idle). It prints one
line per run and then::

    ops_cost scenario=stream_1to1 api=idle off_msgs_per_s=M on_msgs_per_s=M ratio=R

Tests: ``tests/system/test_bench_ops.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.context import BaseContext
from pathlib import Path

from malamute_pack.bench.load import Job
from malamute_pack.bench.scenarios import SCENARIOS, BenchError, run
from malamute_pack.testing.brokerprocess import BrokerError, BrokerProcess

HTTP = "tcp:0:interface=127.0.0.1"
# What a dashboard asks for every POLL_INTERVAL seconds.
SECTIONS = ("overview", "history", "clients", "streams", "mailboxes", "services")
POLL_INTERVAL = 2.0
# As the main benchmark's brokers: no load process is expired for silence.
BROKER_TIMEOUT_MS = 600_000


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench ops",
        description="Measure the cost of the statistics and the management API.",
    )
    parser.add_argument(
        "--scenario", default="stream_1to1", choices=list(SCENARIOS), help="(default stream_1to1)"
    )
    parser.add_argument("--messages", type=int, metavar="N", help="messages per sender")
    parser.add_argument(
        "--rounds", type=int, default=3, help="runs on each broker, alternating (default 3)"
    )
    parser.add_argument(
        "--poll", action="store_true", help="poll the API as a dashboard does while measured"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be at least 1")
    return args


@contextmanager
def polling(url: str | None) -> Iterator[list[int]]:
    """
    While inside, ask C{url}'s API for each of L{SECTIONS} every
    L{POLL_INTERVAL} seconds from a thread; yields the count of answers.
    """
    answers = [0]
    if url is None:
        yield answers
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for section in SECTIONS:
                with urllib.request.urlopen(f"{url}api/{section}", timeout=10) as reply:
                    reply.read()
                answers[0] += 1
            stop.wait(POLL_INTERVAL)

    thread = threading.Thread(target=poll, name="ops-bench-poll", daemon=True)
    thread.start()
    try:
        yield answers
    finally:
        stop.set()
        thread.join(15)


def measure(
    args: argparse.Namespace, with_api: bool, context: BaseContext, directory: Path
) -> float:
    """One run of the scenario on a fresh broker: its msgs_per_s."""
    scenario = SCENARIOS[args.scenario]
    broker = BrokerProcess(
        directory,
        timeout_ms=BROKER_TIMEOUT_MS,
        args=("--http", HTTP) if with_api else (),
    )
    with broker:
        url = broker.http_url if with_api and args.poll else None
        with polling(url) as answers:
            result = run(
                scenario, broker.endpoint, Job(args.messages or scenario.default_n), context
            )
        figures = result.figures()
        api = ("on+polled" if args.poll else "on") if with_api else "off"
        extra = f" api_answers={answers[0]}" if url is not None else ""
        print(f"{result.line()} api={api}{extra}", flush=True)
        return float(figures["msgs_per_s"])


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["malamute_pack.bench.load"])
    off: list[float] = []
    on: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="malamute-bench-ops-") as tmp:
            for round_ in range(args.rounds):
                # Alternate which goes first, so drift favours neither.
                order = (False, True) if round_ % 2 == 0 else (True, False)
                for with_api in order:
                    directory = Path(tmp) / f"r{round_}-{'api' if with_api else 'plain'}"
                    (on if with_api else off).append(measure(args, with_api, context, directory))
    except (BenchError, BrokerError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    off_median, on_median = statistics.median(off), statistics.median(on)
    print(
        f"ops_cost scenario={args.scenario} api={'polled' if args.poll else 'idle'}"
        f" off_msgs_per_s={off_median:.0f} on_msgs_per_s={on_median:.0f}"
        f" ratio={on_median / off_median:.3f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
