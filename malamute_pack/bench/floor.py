"""
``python -m malamute_pack.bench floor``: the physical floor of a round trip
on this machine, with no broker logic at all, to set the service_rr
figures against.

- ``echo``: a DEALER in one process sends 100 bytes to a ROUTER in another,
  which sends them straight back; strictly sequential round trips. This
  is one hop there and back: what ZeroMQ and the scheduler cost.
- ``relay``: the shape of a service round trip through a broker, with a
  ROUTER process that only forwards: requester -> relay -> worker ->
  relay -> requester, the worker answering at once. Two hops there and
  back, in plain pyzmq: the floor for any broker written in Python.

Each prints ``floor=NAME n=N rt_per_s=R p50_us= p99_us= p999_us= max_us=``.
On an idle virtual machine most of a round trip is the wake-up of the
processes and of ZeroMQ's I/O threads, not work: compare ratios measured
in one sitting.

Tests: ``tests/system/test_bench_floor.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection
from time import monotonic

import zmq

from malamute_pack.bench.percentiles import latency_figures
from malamute_pack.testing.brokerprocess import fresh_ipc_endpoint

PAYLOAD = b"x" * 100
STOP = b""
FLOORS = ("echo", "relay")


def _socket(context: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    sock = context.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    return sock


def echo_server(endpoint: str, ready: Connection) -> None:
    """A ROUTER at C{endpoint} that sends every message back until an empty one."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    router = _socket(context, zmq.ROUTER)
    router.bind(endpoint)
    ready.send(True)
    while True:
        frames = router.recv_multipart()
        if frames[-1] == STOP:
            break
        router.send_multipart(frames)
    router.close()
    context.term()


def relay(endpoint: str, worker_endpoint: str, ready: Connection) -> None:
    """
    A ROUTER at C{endpoint} for requesters and one at C{worker_endpoint}
    for the worker: requests go to the worker with the requester's
    routing id, answers go back by it. An empty frame stops it.
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    front = _socket(context, zmq.ROUTER)
    front.bind(endpoint)
    back = _socket(context, zmq.ROUTER)
    back.bind(worker_endpoint)
    ready.send(True)
    poller = zmq.Poller()
    poller.register(front, zmq.POLLIN)
    poller.register(back, zmq.POLLIN)
    worker = back.recv_multipart()[0]  # the worker says hello first
    while True:
        for sock, _ in poller.poll():
            if sock is front:
                requester, body = front.recv_multipart()
                back.send_multipart([worker, requester, body])
                if body == STOP:
                    front.close()
                    back.close()
                    context.term()
                    return
            else:
                _, requester, body = back.recv_multipart()
                front.send_multipart([requester, body])


def worker(worker_endpoint: str) -> None:
    """Answer every request the relay brings at once, until an empty one."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = _socket(context, zmq.DEALER)
    dealer.connect(worker_endpoint)
    dealer.send(b"hello")
    while True:
        requester, body = dealer.recv_multipart()
        if body == STOP:
            break
        dealer.send_multipart([requester, body])
    dealer.close()
    context.term()


def round_trips(endpoint: str, n: int) -> list[float]:
    """C{n} sequential round trips of L{PAYLOAD} from a DEALER; each one's seconds."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = _socket(context, zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send(PAYLOAD)  # the first, with its connection set up, is not counted
    dealer.recv()
    times = [0.0] * n
    for i in range(n):
        started = monotonic()
        dealer.send(PAYLOAD)
        dealer.recv()
        times[i] = monotonic() - started
    dealer.send(STOP)
    dealer.close()
    context.term()
    return times


def measure(floor: str, n: int) -> str:
    """Run the floor C{floor} for C{n} round trips; its line."""
    context = multiprocessing.get_context("spawn")
    endpoint = fresh_ipc_endpoint("floor")
    ours, theirs = context.Pipe()
    if floor == "echo":
        helpers = [context.Process(target=echo_server, args=(endpoint, theirs), daemon=True)]
    else:
        worker_endpoint = fresh_ipc_endpoint("floor-worker")
        helpers = [
            context.Process(target=relay, args=(endpoint, worker_endpoint, theirs), daemon=True),
            context.Process(target=worker, args=(worker_endpoint,), daemon=True),
        ]
    try:
        for process in helpers:
            process.start()
        if not ours.poll(30):
            raise RuntimeError(f"the {floor} server did not start")
        ours.recv()
        started = monotonic()
        times = round_trips(endpoint, n)
        secs = monotonic() - started
        for process in helpers:
            process.join(10)
    finally:
        for process in helpers:
            if process.is_alive():
                process.terminate()
                process.join(5)
        ours.close()
        theirs.close()
    figures = " ".join(f"{k}={v}" for k, v in latency_figures(times).items())
    return f"floor={floor} n={n} rt_per_s={n / secs:.0f} {figures}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench floor",
        description="The round-trip floor of this machine: bare pyzmq, no broker logic.",
    )
    parser.add_argument(
        "--floor", action="append", choices=FLOORS, help="run this one (default: both)"
    )
    parser.add_argument(
        "--messages", type=int, default=10_000, metavar="N", help="round trips (default 10000)"
    )
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error("--messages must be at least 1")
    for floor in args.floor or FLOORS:
        print(measure(floor, args.messages), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
