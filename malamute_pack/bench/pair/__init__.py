"""
``python -m malamute_pack.bench pair``: the figures of a primary/backup
pair (Binary Star, ``docs/pair.md``) of real ``twistd malamute`` brokers
on this host, their clients on C{tcp://127.0.0.1:*}, their pair link on
fresh abstract ipc names.

1. Throughput (L{malamute_pack.bench.pair.throughput}): acknowledged
   durable letters, stream messages and idempotently appended stream
   records per second, against a single broker with its journal, a pair
   replicating sync and one replicating async, in rounds; the medians and
   their ratios to the single broker. With C{--curve}: a sync pair with
   a CURVE pair link (C{--pair-key}) against one with an open link,
   alternating, their medians and the ratio (goal 0.9 or more).
2. Fail-over (L{malamute_pack.bench.pair.failover}): a client that knows
   both endpoints sends acknowledged letters while the active is killed
   again and again (each time restarted to rejoin as passive): each
   fail-over's time from the last acknowledgement by the old active to
   the first by the new one, their median and maximum, and the letters
   acknowledged but lost (goal 0).

The parts (this package gives their public names):

- C{brokers}: the setups (a single broker, sync and async pairs).
- C{throughput}: part 1.
- C{failover}: part 2.
- C{command}: the options, L{main}, the lines it prints.

Tests: ``tests/system/test_bench_pair.py``.
"""

from __future__ import annotations

from malamute_pack.bench.pair.brokers import (
    ASYNC,
    BACKUP,
    CURVE,
    CURVE_MODES,
    MODES,
    PRIMARY,
    SINGLE,
    SYNC,
    SetupBrokers,
    link_endpoints,
    pair_arguments,
)
from malamute_pack.bench.pair.command import main, parse
from malamute_pack.bench.pair.failover import (
    FailoverError,
    FailoverResult,
    LoadReport,
    Switch,
    check_letters,
    letter_load,
    measure_failover,
)
from malamute_pack.bench.pair.throughput import (
    MEASURES,
    Counts,
    ThroughputResult,
    measure_throughput,
)

__all__ = [
    "ASYNC",
    "BACKUP",
    "CURVE",
    "CURVE_MODES",
    "MEASURES",
    "MODES",
    "PRIMARY",
    "SINGLE",
    "SYNC",
    "Counts",
    "FailoverError",
    "FailoverResult",
    "LoadReport",
    "SetupBrokers",
    "Switch",
    "ThroughputResult",
    "check_letters",
    "letter_load",
    "link_endpoints",
    "main",
    "measure_failover",
    "measure_throughput",
    "pair_arguments",
    "parse",
]
