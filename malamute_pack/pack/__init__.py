"""
The pack: brokers on different hosts that find one another with Zyre (ZRE
beacons on a LAN, zgossip in a cloud) and forward streams, mailboxes and
services over peer links.

Its modules:

- C{service}: L{malamute_pack.pack.service.PackService}: this broker's
  L{Pack} on a Zyre node.
- C{federation}: L{Pack}: the node's events turned into peer brokers, and
  the local interests announced to them.
- C{peer_broker}: L{PeerBroker}: one peer as connections of the model, and
  what it sends applied.
- C{sessions}: the model's sessions for a peer (L{PeerSession},
  L{RemoteHolder}).
- C{groups}: L{PackGroups}: consumer groups whose members are on several
  brokers (one home per group; members elsewhere through their broker).
- C{outbox}: L{PeerOutbox}: what is sent to one peer, in order and bounded.
- C{zyre}: L{Zyre}: a Zyre node's sockets in the reactor.
- C{node}: L{ZreNode}: the ZRE node's logic, no socket.
- C{beacon}: ZRE beacons over UDP.
- C{gossip}: zgossip in the reactor, for discovery without broadcast.
- C{probe}: a Zyre probe for operators and interop tests.
- C{config}: the pack's settings (C{--pack}, C{--beacon}, ...).
- C{feature}: the pack as a feature of the broker (its C{FEATURE}).

Tests: ``tests/unit/test_pack_node.py``.
"""
