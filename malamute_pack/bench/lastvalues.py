"""
``python -m malamute_pack.bench lastvalues``: how long a last-value
stream's snapshot takes (docs/protocol.md, "Last-value streams").

It starts a broker (journal on) whose stream ``ticks`` is compacted by
subject, appends ``--subjects`` subjects (100,000 by default) with
``--updates`` records each, round after round (the idempotent appends of
the bulk client: what the broker journals is measured, not a client's
sends), and then, ``--rounds`` times, times two new readers (version 2)
from their STREAM_READ_FROM whence last values to the last of the
snapshot's records in their hands: the library's L{BlockingClient},
checking that it got one record per subject (``secs``), and a bare
ZeroMQ DEALER that only counts the records (``raw_secs``: the broker's
own share). It prints a line per round and then::

    last_values subjects=N updates=U secs=S raw_secs=S records_per_s=R

with the median rounds (the machine is shared and noisy).

Tests: ``tests/system/test_bench_lastvalues.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import zmq

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerError, BrokerProcess

STREAM: Final = "ticks"
CONFIG: Final = f"malamute\n    streams\n        {STREAM}\n            compact = subject\n"
# Records per append.
PER_APPEND: Final = 5000
# A round that gets nothing for this long failed.
SILENCE_S: Final = 60.0
_SILENCE_MS: Final = int(SILENCE_S * 1000)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench lastvalues",
        description="Measure the time to read a last-value stream's snapshot.",
    )
    parser.add_argument("--subjects", type=int, default=100_000, help="subjects (default 100000)")
    parser.add_argument(
        "--updates", type=int, default=2, help="records of each subject (default 2)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="snapshots read (default 3)")
    args = parser.parse_args(argv)
    for name in ("subjects", "updates", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def fill(endpoint: str, subjects: int, updates: int) -> None:
    """Every subject updated C{updates} times, round after round."""
    with BulkClient(endpoint, timeout=60) as bulk:
        for update in range(updates):
            body = [str(update).encode()]
            for start in range(0, subjects, PER_APPEND):
                records = [
                    (f"sym.{i:07d}", body) for i in range(start, min(start + PER_APPEND, subjects))
                ]
                bulk.append(STREAM, f"u{update}-{start}", records)


def snapshot_seconds(endpoint: str, subjects: int) -> float:
    """The time from the request to the snapshot's last record (checked: one a subject)."""
    with BlockingClient(endpoint, timeout=60) as client:
        seen: set[str] = set()
        started = time.perf_counter()
        client.set_consumer(STREAM, "", mlm.LAST_VALUES)
        while len(seen) < subjects:
            delivery = client.recv(SILENCE_S)
            if delivery is None:
                raise BrokerError(f"{len(seen)} of {subjects} last values, then silence")
            if delivery.command == "STREAM_DELIVER":
                if delivery.subject in seen:
                    raise BrokerError(f"subject {delivery.subject!r} twice in the snapshot")
                seen.add(delivery.subject)
        return time.perf_counter() - started


def raw_snapshot_seconds(endpoint: str, subjects: int) -> float:
    """As L{snapshot_seconds}, read by a bare DEALER that counts STREAM_RECORDs."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        dealer.send_multipart(mlm.encode(mlm.ConnectionOpen(version=2)))
        if not dealer.poll(_SILENCE_MS):
            raise BrokerError("no answer to CONNECTION_OPEN")
        opened = mlm.decode(dealer.recv_multipart())
        if not isinstance(opened, mlm.Ok):
            raise BrokerError(f"CONNECTION_OPEN answered {opened}")
        record = mlm.StreamRecord.ID
        count = 0
        started = time.perf_counter()
        dealer.send_multipart(mlm.encode(mlm.StreamReadFrom(STREAM, "", mlm.LAST_VALUES, 0)))
        while count < subjects:
            if not dealer.poll(_SILENCE_MS):
                raise BrokerError(f"{count} of {subjects} last values, then silence")
            frames = dealer.recv_multipart()
            # Frame 0: the signature (2 bytes), then the message id.
            if frames[0][2] == record:
                count += 1
        return time.perf_counter() - started
    finally:
        dealer.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    times: list[float] = []
    raw_times: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="malamute-bench-lastvalues-") as tmp:
            directory = Path(tmp)
            (directory / "malamute.cfg").write_text(CONFIG)
            broker = BrokerProcess(
                directory / "broker",
                bind=ANY_TCP_PORT,
                args=("--config", str(directory / "malamute.cfg")),
            )
            with broker:
                fill(broker.endpoint, args.subjects, args.updates)
                for round_ in range(args.rounds):
                    seconds = snapshot_seconds(broker.endpoint, args.subjects)
                    raw = raw_snapshot_seconds(broker.endpoint, args.subjects)
                    times.append(seconds)
                    raw_times.append(raw)
                    print(
                        f"last_values_round round={round_ + 1} subjects={args.subjects}"
                        f" secs={seconds:.3f} raw_secs={raw:.3f}",
                        flush=True,
                    )
    except BrokerError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 1
    median, raw_median = statistics.median(times), statistics.median(raw_times)
    print(
        f"last_values subjects={args.subjects} updates={args.updates} secs={median:.3f}"
        f" raw_secs={raw_median:.3f} records_per_s={args.subjects / median:.0f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
