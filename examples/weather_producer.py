"""
Publish made-up weather readings on the ``weather`` stream (blocking client).

Start a broker (``scripts/broker``), then, from the repository root::

    .venv/bin/python examples/weather_producer.py [-e ipc://@/malamute]
        [--user USER] [--count 20] [--interval 0.5]

Subjects look like ``temp.paris`` or ``wind.oslo`` and the content is one
frame with the value; ``examples/weather_consumer.py`` reads them.
With ``--user``, the client authenticates with PLAIN, the password taken
from the environment variable ``MALAMUTE_PASSWORD``.
"""

from __future__ import annotations

import argparse
import random
import sys

from malamute_pack.client import BlockingClient, ClientError, plain_credentials

KINDS = ("temp", "wind", "rain")
CITIES = ("paris", "oslo", "rome", "lima")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Publish weather readings.")
    parser.add_argument("-e", "--endpoint", default="ipc://@/malamute", help="the broker")
    parser.add_argument(
        "--user", help="PLAIN user (the password from the environment: MALAMUTE_PASSWORD)"
    )
    parser.add_argument("--count", type=int, default=20, help="readings to publish")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between readings")
    args = parser.parse_args(argv)
    try:
        plain = plain_credentials(args.user)
    except ValueError as e:
        parser.error(str(e))
    try:
        with BlockingClient(args.endpoint, "weather-producer", plain=plain) as client:
            client.set_producer("weather")
            for _ in range(args.count):
                subject = f"{random.choice(KINDS)}.{random.choice(CITIES)}"
                value = f"{random.uniform(-10, 35):.1f}"
                client.send(subject, [value.encode()])
                print(f"{subject} {value}", flush=True)
                client.pause(args.interval)  # a sleep that keeps heartbeats going
    except ClientError as e:
        print(f"weather_producer: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
