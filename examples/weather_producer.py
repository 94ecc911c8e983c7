"""
Publish made-up weather readings on the ``weather`` stream (blocking client).

Start a broker (``twistd -n malamute``), then, from the repository root::

    PYTHONPATH=. python examples/weather_producer.py [--endpoint ipc://@/malamute]
        [--count 20] [--interval 0.5]

Subjects look like ``temp.paris`` or ``wind.oslo`` and the content is one
frame with the value; ``examples/weather_consumer.py`` reads them.
"""

from __future__ import annotations

import argparse
import random

from malamute_pack.client import BlockingClient

KINDS = ("temp", "wind", "rain")
CITIES = ("paris", "oslo", "rome", "lima")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Publish weather readings.")
    parser.add_argument("--endpoint", default="ipc://@/malamute")
    parser.add_argument("--count", type=int, default=20, help="readings to publish")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between readings")
    args = parser.parse_args(argv)
    with BlockingClient(args.endpoint, "weather-producer") as client:
        client.set_producer("weather")
        for _ in range(args.count):
            subject = f"{random.choice(KINDS)}.{random.choice(CITIES)}"
            value = f"{random.uniform(-10, 35):.1f}"
            client.send(subject, [value.encode()])
            print(f"{subject} {value}", flush=True)
            client.pause(args.interval)  # a sleep that keeps heartbeats going
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
