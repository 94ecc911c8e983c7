"""
``python -m malamute_pack.bench multicast``: the figures of a multicast
bridge (``docs/multicast.md``), measured on three hosts made as network
namespaces on one bridge (L{malamute_pack.testing.netns}, prefix C{mpb},
C{10.77.62.0/24}; root only), each broker a real ``twistd malamute``
process with its journal:

- host 1: broker A, bound on C{tcp://10.77.62.1:9000}, publishes the
  stream C{bench} on C{epgm://eth0;239.192.62.1:5555}; a producer process
  writes N numbered 100-byte records to it over TCP as fast as it takes them;
- hosts 2 and 3: brokers B and C receive the group into their own stream
  C{bench}; a reader process at each counts the records as they arrive and
  checks their order and duplicates.

Each round plays a run without loss, then one where host 3 drops 1% of
the UDP it receives at random (iptables). Per receiver: messages per
second from the producer's first send to the last record delivered there,
records missing after repair, duplicated or late, the loss before repair
(packets dropped over packets seen), and the repair traffic (records the
bridge wrote from TCP repairs over all it wrote, from the counters it logs
as it stops); and each broker's CPU time.

The parts (this package gives their public names):

- C{brokers}: the brokers and their bridge options.
- C{roles}: the producer and the readers.
- C{counters}: iptables, the kernel's counters, CPU time.
- C{throughput}: the runs and their figures.
- C{command}: the options, what the machine needs, L{main}.

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

from malamute_pack.bench.multicast.brokers import (
    GROUP,
    PREFIX,
    RECEIVERS,
    SENDER,
    SUBNET,
    MulticastBrokers,
    bridge_status,
    group_url,
    inbound_arguments,
    inbound_counters,
    outbound_arguments,
)
from malamute_pack.bench.multicast.command import main, parse, unavailable
from malamute_pack.bench.multicast.counters import (
    UdpFilter,
    parse_dev_tx,
    parse_snmp,
    rule_packets,
)
from malamute_pack.bench.multicast.roles import OrderReport, index_of, payload
from malamute_pack.bench.multicast.throughput import (
    GOAL_RATE,
    NO_LOSS,
    Delivery,
    MulticastResult,
    RunSettings,
    loss_scenario,
    measure,
)

__all__ = [
    "GOAL_RATE",
    "GROUP",
    "NO_LOSS",
    "PREFIX",
    "RECEIVERS",
    "SENDER",
    "SUBNET",
    "Delivery",
    "MulticastBrokers",
    "MulticastResult",
    "OrderReport",
    "RunSettings",
    "UdpFilter",
    "bridge_status",
    "group_url",
    "inbound_arguments",
    "inbound_counters",
    "index_of",
    "loss_scenario",
    "main",
    "measure",
    "outbound_arguments",
    "parse",
    "parse_dev_tx",
    "parse_snmp",
    "payload",
    "rule_packets",
    "unavailable",
]
