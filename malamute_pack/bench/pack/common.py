"""
What every part of the pack benchmark (L{malamute_pack.bench.pack}) shares:
the endpoint and heartbeat timeout of its brokers, the names of the
discovery modes, securities (an open pack, a CURVE one), placements and
scenarios, L{PackBenchError}, and L{progress} for what it says as it goes.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import sys

# Every broker binds this for its clients: an abstract ipc name, so each
# host's is its own and a client in a namespace reaches its host's broker.
CLIENT_ENDPOINT = "ipc://@/malamute-pack-bench"
# The brokers' heartbeat timeout (as the single-host bench's): no client
# of a run is expired for silence.
BROKER_TIMEOUT_MS = 600_000

BEACON, GOSSIP = "beacon", "gossip"
DISCOVERIES = (BEACON, GOSSIP)
# An open pack (no --pack-keys), a CURVE pack (--pack-keys, --pack-secret).
OPEN, CURVE = "open", "curve"
SECURITIES = (OPEN, CURVE)
CROSS_HOST, SINGLE_HOST = "cross_host", "single_host"
STREAM, SERVICE = "stream_1to1", "service_rr"
# A consumer group of one member (its home is either broker: the hash picks).
GROUP = "stream_group1"


class PackBenchError(Exception):
    """A part of the pack benchmark could not be measured."""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
