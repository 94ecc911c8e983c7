"""
Read the ``weather`` stream and print the readings whose subject matches
(Twisted client).

Start a broker (``scripts/broker``) and ``weather_producer.py``, then,
from the repository root::

    .venv/bin/python examples/weather_consumer.py [-e ipc://@/malamute]
        [--user USER] [--pattern REGEX]... [--count N] [--from-start]

The patterns are regular expressions searched in the subject; the default
is ``^temp\\.`` (temperatures only). ``--count 0`` reads forever.
``--from-start`` reads the readings the broker's journal still holds first
(protocol version 2, STREAM_READ_FROM earliest), then the live ones; each
reading is printed with its sequence number in the stream.

With ``--user``, the client authenticates with PLAIN, the password taken
from the environment variable ``MALAMUTE_PASSWORD``. Ctrl-C or SIGTERM
closes the connection (CONNECTION_CLOSE) before the program exits, so the
broker forgets it at once instead of waiting out its heartbeat timeout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from twisted.internet import defer, task

from malamute_pack.client import ClientClosedError, ClientError, MalamuteClient, plain_credentials
from malamute_pack.protocol.mlm import EARLIEST, LATEST


async def consume(reactor: Any, args: argparse.Namespace, plain: tuple[str, str] | None) -> None:
    try:
        client = await MalamuteClient.connect(reactor, args.endpoint, plain=plain)
    except ClientError as e:
        print(f"weather_consumer: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    # Ctrl-C and SIGTERM stop the reactor: it closes the client first.
    trigger = reactor.addSystemEventTrigger("before", "shutdown", client.close)
    whence = EARLIEST if args.from_start else LATEST
    received = 0
    try:
        for pattern in args.pattern or [r"^temp\."]:
            # Each pattern from the start: the client hands every reading over once.
            await client.set_consumer("weather", pattern, whence)
        while args.count == 0 or received < args.count:
            delivery = await client.recv()
            value = b" ".join(delivery.content).decode(errors="replace")
            print(
                f"#{delivery.sequence} {delivery.subject} {value} "
                f"(from {delivery.sender or 'anonymous'})",
                flush=True,
            )
            received += 1
    except ClientClosedError:
        return  # closed by Ctrl-C or SIGTERM
    reactor.removeSystemEventTrigger(trigger)
    await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Read the weather stream.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--pattern", action="append", help="subject regex (repeatable)")
    parser.add_argument("--count", type=int, default=0, help="readings to print (0: forever)")
    parser.add_argument(
        "--from-start", action="store_true", help="first the readings the journal still holds"
    )
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    task.react(lambda reactor: defer.ensureDeferred(consume(reactor, args, plain)))


if __name__ == "__main__":
    main()
