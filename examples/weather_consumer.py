"""
Read the ``weather`` stream and print the readings whose subject matches
(Twisted client).

Start a broker (``twistd -n malamute``) and ``weather_producer.py``, then,
from the repository root::

    PYTHONPATH=. python examples/weather_consumer.py [--endpoint ipc://@/malamute]
        [--pattern REGEX]... [--count N]

The patterns are regular expressions searched in the subject; the default
is ``^temp\\.`` (temperatures only). ``--count 0`` reads forever.
"""

from __future__ import annotations

import argparse
from typing import Any

from twisted.internet import defer, task

from malamute_pack.client import MalamuteClient


async def consume(reactor: Any, args: argparse.Namespace) -> None:
    client = await MalamuteClient.connect(reactor, args.endpoint)
    for pattern in args.pattern or [r"^temp\."]:
        await client.set_consumer("weather", pattern)
    received = 0
    while args.count == 0 or received < args.count:
        delivery = await client.recv()
        value = b" ".join(delivery.content).decode(errors="replace")
        print(f"{delivery.subject} {value} (from {delivery.sender or 'anonymous'})", flush=True)
        received += 1
    await client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Read the weather stream.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--pattern", action="append", help="subject regex (repeatable)")
    parser.add_argument("--count", type=int, default=0, help="readings to print (0: forever)")
    args = parser.parse_args(argv)
    task.react(lambda reactor: defer.ensureDeferred(consume(reactor, args)))


if __name__ == "__main__":
    main()
