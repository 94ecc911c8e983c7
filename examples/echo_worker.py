"""
A worker for the ``echo`` service: it sends every request's content back to
the requester's mailbox, with the same subject (Twisted client).

Start a broker (``twistd -n malamute``), then, from the repository root::

    PYTHONPATH=. python examples/echo_worker.py [--endpoint ipc://@/malamute]
        [--count N]

and send it requests with ``examples/echo_requester.py``. ``--count 0``
serves forever.
"""

from __future__ import annotations

import argparse
from typing import Any

from twisted.internet import defer, task

from malamute_pack.client import MalamuteClient


async def serve(reactor: Any, args: argparse.Namespace) -> None:
    client = await MalamuteClient.connect(reactor, args.endpoint, "echo-worker")
    await client.set_worker("echo", "")
    print("serving echo", flush=True)
    served = 0
    while args.count == 0 or served < args.count:
        request = await client.recv()
        if request.command != "SERVICE_DELIVER":
            continue
        # The reply goes to the requester's mailbox (its address is the sender);
        # with protocol version 2 we wait until the broker has stored it.
        stored = client.sendto(
            request.sender, request.subject, request.content, tracker=request.tracker
        )
        if stored is not None:
            await stored
        if request.tracker:
            client.confirm(request.tracker)  # a tracked request is done once answered
        served += 1
        print(f"echoed {request.subject!r} to {request.sender!r}", flush=True)
    await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the echo service.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--count", type=int, default=0, help="requests to serve (0: forever)")
    args = parser.parse_args(argv)
    task.react(lambda reactor: defer.ensureDeferred(serve(reactor, args)))


if __name__ == "__main__":
    main()
