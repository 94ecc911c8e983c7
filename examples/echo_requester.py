"""
Send one request to the ``echo`` service and print the reply (blocking client).

Start a broker (``scripts/broker``) and ``echo_worker.py``, then, from
the repository root::

    .venv/bin/python examples/echo_requester.py [-e ipc://@/malamute]
        [--user USER] [--timeout 5] [TEXT]

The requester needs an address (the worker replies to its mailbox); it uses
``echo-requester-<pid>``. It prints the id the broker stored the request
under (protocol version 2: the send returns once the request is on disk),
then the reply. Exits 1 if no reply comes within the timeout (or the
broker cannot be used: the reason on one line).
With ``--user``, the client authenticates with PLAIN, the password taken
from the environment variable ``MALAMUTE_PASSWORD``.
"""

from __future__ import annotations

import argparse
import os
import sys

from malamute_pack.client import BlockingClient, ClientError, plain_credentials


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ask the echo service.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a reply")
    parser.add_argument("text", nargs="?", default="hello")
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    try:
        with BlockingClient(args.endpoint, f"echo-requester-{os.getpid()}", plain=plain) as client:
            request_id = client.sendfor(
                "echo", "echo", [args.text.encode()], timeout_ms=int(args.timeout * 1000)
            )
            print(f"request stored as {request_id}", flush=True)
            reply = client.recv(timeout=args.timeout)
    except ClientError as e:
        print(f"echo_requester: {e}", file=sys.stderr)
        return 1
    if reply is None:
        print(f"no reply within {args.timeout}s", file=sys.stderr)
        return 1
    print(f"reply from {reply.sender}: {b''.join(reply.content).decode(errors='replace')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
