"""
``python -m malamute_pack.bench pack``: the pack's figures, measured on
hosts made as network namespaces on one bridge (L{malamute_pack.testing.netns};
root only), each broker a real ``twistd malamute --pack`` process with its
journal (L{malamute_pack.testing.brokerprocess}).

1. Two brokers (beacons), A and B. The benchmark's own scenarios and load
   processes (L{malamute_pack.bench.scenarios}, L{malamute_pack.bench.load})
   play stream_1to1 (writer on A, reader on B), service_rr (requester on
   A, worker on B; the worker answers with MAILBOX_SEND to the requester's
   address) and stream_group1 (writer on A, a consumer group's one member
   on B, the group's home on A or B) through the pack, and the same with every role on A, in
   alternating rounds; it prints the medians and the ratio cross-host over
   single-host. Each load process runs in its host's namespace
   (L{NamespaceContext}: a L{python_command} subprocess given its end of the
   runner's pipe), and both brokers bind the same abstract ipc name, which
   is each host's own (abstract sockets belong to the network namespace),
   so each role just connects to "the broker of its host". Senders wait
   L{SETTLE} seconds after the go before their first message, so the
   readers' interest and the workers' offer have reached A (a record
   written before B's interest arrives is not forwarded to B).
2. Discovery: N brokers (per C{--brokers}) started at once on one LAN, with
   beacons (default interval) and with gossip (one server on host 1). The
   logs are followed (every L{POLL} s) and each line stamped with
   C{time.monotonic()} when read: the figure is from the last broker's
   "reachable by peers at" line to the moment every broker has logged
   "pack NAME: broker X joined" for all N - 1 others (process start-up is
   not counted; it shows as start_s).
3. Traffic: after the discovery run with the largest N, a client process in
   every namespace connects C{--entries} clients with addresses (the
   directory), then has each read a (stream, pattern) of its own (the
   interests); what each host sends is its C{eth0} tx counters (read from
   C{/proc/PID/net/dev} of its broker: that namespace's devices) over the
   phase, less the idle rate (beacons, pings) measured over as long just
   before.

Each part is measured in an open pack (no C{--pack-keys}) by default; with
C{--security curve} in a CURVE pack (C{--pack-keys}, C{--pack-secret}, and
C{ENDPOINT|KEY} for gossip; the keys made per run in the run's directory,
L{malamute_pack.bench.pack.keys}), and with C{--security open --security
curve} in both, the order alternating round by round: the two-broker rounds
in two packs side by side on the same two hosts (no broker restarted
between them), discovery pack after pack (C{--discovery-rounds} runs of
each). The report then ends with every figure's medians in either pack and
their ratio CURVE/open (L{malamute_pack.bench.pack.figures.Comparison}).

Warnings, errors and tracebacks in the brokers' logs are printed (to stderr;
a line that several brokers logged, once) and kept in the report. C{--json}
prints one JSON document instead of the tables: the pair's summary rows,
rounds and discovery runs each with their security, and the comparisons.

The figures of a default run on the project's machine are in L{EPILOG}
(shown by C{--help}).

The parts, a module each (this package gives their public names):

- C{command}: the options, the report, L{main}.
- C{pair}: part 1, two brokers.
- C{discovery}: part 2, discovery.
- C{traffic}: part 3, traffic.
- C{brokers}: the brokers in their namespaces.
- C{keys}: the CURVE packs' keys.
- C{roles}: the load roles in their namespaces.
- C{logs}: reading the brokers' logs.
- C{figures}: medians, ratios, tables.
- C{common}: what they share.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

from malamute_pack.bench.pack.brokers import (
    GOSSIP_PORT,
    POLL,
    follow,
    notable_lines,
    pack_arguments,
    running,
    stop_all,
)
from malamute_pack.bench.pack.command import (
    DEFAULT_BROKERS,
    DEFAULT_DISCOVERY_ROUNDS,
    DEFAULT_DISCOVERY_TIMEOUT,
    DEFAULT_ENTRIES,
    DEFAULT_MESSAGES,
    DEFAULT_PREFIX,
    DEFAULT_ROUND_TRIPS,
    DEFAULT_ROUNDS,
    DEFAULT_SUBNET,
    DEFAULT_TRAFFIC_SECS,
    DISCOVERY_MEDIAN_HEADERS,
    EPILOG,
    PackReport,
    main,
    measure_discovery,
    parse,
)
from malamute_pack.bench.pack.common import (
    BEACON,
    BROKER_TIMEOUT_MS,
    CLIENT_ENDPOINT,
    CROSS_HOST,
    CURVE,
    DISCOVERIES,
    GOSSIP,
    GROUP,
    OPEN,
    SECURITIES,
    SERVICE,
    SINGLE_HOST,
    STREAM,
    PackBenchError,
    progress,
)
from malamute_pack.bench.pack.discovery import (
    DISCOVERY_HEADERS,
    DiscoveryResult,
    discover,
    discovery_comparisons,
    rss_mb,
)
from malamute_pack.bench.pack.figures import (
    COMPARISON_HEADERS,
    Comparison,
    comparison_lines,
    median,
    ratio,
    show,
    table,
)
from malamute_pack.bench.pack.keys import PackKeys
from malamute_pack.bench.pack.logs import (
    DiscoveryWatch,
    LogEvent,
    LogFollower,
    notable,
    parse_line,
)
from malamute_pack.bench.pack.pair import (
    BEACON_PORTS,
    MEASURES,
    REMOTE_ROLES,
    PairResult,
    client_endpoint,
    measure_pair,
)
from malamute_pack.bench.pack.roles import (
    SETTLE,
    NamespaceContext,
    NamespaceProcess,
    role_main,
    settle_then_blast,
    settle_then_request,
    settled,
)
from malamute_pack.bench.pack.traffic import (
    ADDRESSES,
    READERS,
    TRAFFIC_TAIL,
    TrafficResult,
    TrafficRow,
    measure_traffic,
    parse_net_dev,
    state_main,
    tx_counters,
)

__all__ = [
    "ADDRESSES",
    "BEACON",
    "BEACON_PORTS",
    "BROKER_TIMEOUT_MS",
    "CLIENT_ENDPOINT",
    "COMPARISON_HEADERS",
    "CROSS_HOST",
    "CURVE",
    "DEFAULT_BROKERS",
    "DEFAULT_DISCOVERY_ROUNDS",
    "DEFAULT_DISCOVERY_TIMEOUT",
    "DEFAULT_ENTRIES",
    "DEFAULT_MESSAGES",
    "DEFAULT_PREFIX",
    "DEFAULT_ROUNDS",
    "DEFAULT_ROUND_TRIPS",
    "DEFAULT_SUBNET",
    "DEFAULT_TRAFFIC_SECS",
    "DISCOVERIES",
    "DISCOVERY_HEADERS",
    "DISCOVERY_MEDIAN_HEADERS",
    "EPILOG",
    "GOSSIP",
    "GOSSIP_PORT",
    "GROUP",
    "MEASURES",
    "OPEN",
    "POLL",
    "READERS",
    "REMOTE_ROLES",
    "SECURITIES",
    "SERVICE",
    "SETTLE",
    "SINGLE_HOST",
    "STREAM",
    "TRAFFIC_TAIL",
    "Comparison",
    "DiscoveryResult",
    "DiscoveryWatch",
    "LogEvent",
    "LogFollower",
    "NamespaceContext",
    "NamespaceProcess",
    "PackBenchError",
    "PackKeys",
    "PackReport",
    "PairResult",
    "TrafficResult",
    "TrafficRow",
    "client_endpoint",
    "comparison_lines",
    "discover",
    "discovery_comparisons",
    "follow",
    "main",
    "measure_discovery",
    "measure_pair",
    "measure_traffic",
    "median",
    "notable",
    "notable_lines",
    "pack_arguments",
    "parse",
    "parse_line",
    "parse_net_dev",
    "progress",
    "ratio",
    "role_main",
    "rss_mb",
    "running",
    "settle_then_blast",
    "settle_then_request",
    "settled",
    "show",
    "state_main",
    "stop_all",
    "table",
    "tx_counters",
]
