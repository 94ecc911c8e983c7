"""
Multicast bridges (docs/multicast.md): a broker's streams published on a
PGM or NORM multicast group (L{malamute_pack.multicast.publisher}), another
broker's read over TCP and re-broadcast (L{malamute_pack.multicast.proxy}),
and a group's records received into a local stream with what the group
lost repaired from the origin's journal (L{malamute_pack.multicast.inbound}).

Tests: ``tests/system/test_multicast_system.py`` (brokers in network namespaces).
"""
