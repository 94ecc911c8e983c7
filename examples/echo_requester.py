"""
Send one request to the ``echo`` service and print the reply (blocking client).

Start a broker (``twistd -n malamute``) and ``echo_worker.py``, then, from
the repository root::

    PYTHONPATH=. python examples/echo_requester.py [--endpoint ipc://@/malamute]
        [--timeout 5] [TEXT]

The requester needs an address (the worker replies to its mailbox); it uses
``echo-requester-<pid>``. It prints the id the broker stored the request
under (protocol version 2: the send returns once the request is on disk),
then the reply. Exits 1 if no reply comes within the timeout.
"""

from __future__ import annotations

import argparse
import os
import sys

from malamute_pack.client import BlockingClient


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Ask the echo service.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for a reply")
    parser.add_argument("text", nargs="?", default="hello")
    args = parser.parse_args(argv)
    with BlockingClient(args.endpoint, f"echo-requester-{os.getpid()}") as client:
        request_id = client.sendfor(
            "echo", "echo", [args.text.encode()], timeout_ms=int(args.timeout * 1000)
        )
        print(f"request stored as {request_id}", flush=True)
        reply = client.recv(timeout=args.timeout)
    if reply is None:
        print(f"no reply within {args.timeout}s", file=sys.stderr)
        return 1
    print(f"reply from {reply.sender}: {b''.join(reply.content).decode(errors='replace')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
