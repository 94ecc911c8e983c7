"""
Read the ``weather`` stream and print the readings whose subject matches
(Twisted client).

Start a broker (``twistd -n malamute``) and ``weather_producer.py``, then,
from the repository root::

    PYTHONPATH=. python examples/weather_consumer.py [--endpoint ipc://@/malamute]
        [--pattern REGEX]... [--count N] [--from-start]

The patterns are regular expressions searched in the subject; the default
is ``^temp\\.`` (temperatures only). ``--count 0`` reads forever.
``--from-start`` reads the readings the broker's journal still holds first
(protocol version 2, STREAM_READ_FROM earliest), then the live ones; each
reading is printed with its sequence number in the stream.
"""

from __future__ import annotations

import argparse
from typing import Any

from twisted.internet import defer, task

from malamute_pack.client import MalamuteClient
from malamute_pack.protocol.mlm import EARLIEST, LATEST


async def consume(reactor: Any, args: argparse.Namespace) -> None:
    client = await MalamuteClient.connect(reactor, args.endpoint)
    whence = EARLIEST if args.from_start else LATEST
    for pattern in args.pattern or [r"^temp\."]:
        # Each pattern from the start: the client hands every reading over once.
        await client.set_consumer("weather", pattern, whence)
    received = 0
    while args.count == 0 or received < args.count:
        delivery = await client.recv()
        value = b" ".join(delivery.content).decode(errors="replace")
        print(
            f"#{delivery.sequence} {delivery.subject} {value} "
            f"(from {delivery.sender or 'anonymous'})",
            flush=True,
        )
        received += 1
    await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Read the weather stream.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--pattern", action="append", help="subject regex (repeatable)")
    parser.add_argument("--count", type=int, default=0, help="readings to print (0: forever)")
    parser.add_argument(
        "--from-start", action="store_true", help="first the readings the journal still holds"
    )
    args = parser.parse_args(argv)
    task.react(lambda reactor: defer.ensureDeferred(consume(reactor, args)))


if __name__ == "__main__":
    main()
