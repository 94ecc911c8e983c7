"""
A worker for the ``echo`` service: it sends every request's content back to
the requester's mailbox, with the same subject (Twisted client).

Start a broker (``scripts/broker``), then, from the repository root::

    .venv/bin/python examples/echo_worker.py [-e ipc://@/malamute]
        [--user USER] [--count N]

and send it requests with ``examples/echo_requester.py``. ``--count 0``
serves forever. With ``--user``, the client authenticates with PLAIN, the
password taken from the environment variable ``MALAMUTE_PASSWORD``. Ctrl-C
or SIGTERM closes the connection (CONNECTION_CLOSE) before the program
exits, so the broker forgets the worker at once.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from twisted.internet import defer, task

from malamute_pack.client import ClientClosedError, ClientError, MalamuteClient, plain_credentials


async def serve(reactor: Any, args: argparse.Namespace, plain: tuple[str, str] | None) -> None:
    try:
        client = await MalamuteClient.connect(reactor, args.endpoint, "echo-worker", plain=plain)
    except ClientError as e:
        print(f"echo_worker: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    # Ctrl-C and SIGTERM stop the reactor: it closes the client first.
    trigger = reactor.addSystemEventTrigger("before", "shutdown", client.close)
    served = 0
    try:
        await client.set_worker("echo", "")
        print("serving echo", flush=True)
        while args.count == 0 or served < args.count:
            request = await client.recv()
            if request.command != "SERVICE_DELIVER":
                continue
            # The reply goes to the requester's mailbox (its address is the
            # sender); with protocol version 2 we wait until the broker has stored it.
            stored = client.sendto(
                request.sender, request.subject, request.content, tracker=request.tracker
            )
            if stored is not None:
                await stored
            if request.tracker:
                client.confirm(request.tracker)  # a tracked request is done once answered
            served += 1
            print(f"echoed {request.subject!r} to {request.sender!r}", flush=True)
    except ClientClosedError:
        return  # closed by Ctrl-C or SIGTERM
    reactor.removeSystemEventTrigger(trigger)
    await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the echo service.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--count", type=int, default=0, help="requests to serve (0: forever)")
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    task.react(lambda reactor: defer.ensureDeferred(serve(reactor, args, plain)))


if __name__ == "__main__":
    main()
