"""
The primary/backup pair: Binary Star failover and journal replication.

Its modules:

- C{service}: L{malamute_pack.pair.service.PairService}: the pair as a
  Twisted service: the machine, the link, replication.
- C{machine}: the Binary Star state machine as a table (L{PairMachine}).
- C{replication}: journal replication, no sockets (L{ReplicationSource},
  L{Replica}).
- C{link}: the pair link's sockets (L{PairLink}).
- C{gate}: L{ClientGate}: clients' messages before the broker is active.
- C{check}: is this host's broker the active one (for health checks)?
- C{config}: the pair's settings (C{--pair}, C{--pair-bind}, ...).
- C{feature}: the pair as a feature of the broker (its C{FEATURE}).

Tests: ``tests/unit/test_pair_machine.py``.
"""
