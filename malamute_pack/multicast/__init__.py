"""
Multicast bridges (docs/multicast.md): a broker's streams published on a
PGM or NORM multicast group (L{malamute_pack.multicast.publisher}), another
broker's read over TCP and re-broadcast (L{malamute_pack.multicast.proxy}),
and a group's records received into a local stream with what the group
lost repaired from the origin's journal (L{malamute_pack.multicast.inbound}).

Its modules:

- C{service}: L{malamute_pack.multicast.service.BridgeService}: a broker's
  bridges as one service.
- C{publisher}: L{Publisher}: an outbound bridge's sending side.
- C{inbound}: L{InboundBridge}: an inbound bridge's logic (flows, holds,
  notices).
- C{repair}: L{TcpRepairs}: losses repaired from the origin's journal.
- C{proxy}: L{ProxySource}: another broker's streams read over TCP.
- C{sessions}: the model's sessions for bridges (L{OutboundSession},
  L{InboundSession}).
- C{sockets}: the bridges' PUB and SUB sockets, made for their URL.
- C{config}: the bridges' settings (C{--bridge-out}, C{--bridge-in}, ...).
- C{tap}: the bridges' options, and ``twistd malamute-bridge``.
- C{feature}: the bridges as a feature of the broker (its C{FEATURE}).

Tests: ``tests/system/test_multicast_system.py`` (brokers in network namespaces).
"""
