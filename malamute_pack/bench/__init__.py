"""
The broker's benchmarks: ``python -m malamute_pack.bench`` starts a broker
process (L{malamute_pack.testing.brokerprocess}; or uses one already
running) and measures it with load from separate processes.

- C{__main__}: the command line: the scenarios and the other commands.
- C{load}: the load roles, each a process on a raw ZeroMQ DEALER.
- C{scenarios}: the scenarios as data, their one runner, their result lines.
- C{plays}: playing one scenario against one broker (latency rates, scale).
- C{latency}: the latency scenario's writer and reader roles.
- C{scale}: stream 1:1 with many idle clients connected, and their memory.
- C{compare}: the same scenarios against another broker (C{--compare EP}).
- C{percentiles}: latency percentiles by nearest rank.
- C{floor} (command C{floor}): the round trip of this machine with no broker logic.
- C{ops} (command C{ops}): what statistics and the management API cost.
- C{bruteforce} (command C{bruteforce}): a PLAIN password brute force and its cost.
- C{lastvalues} (command C{lastvalues}): the time to read a last-value stream's snapshot.
- C{spark} (command C{spark}): Spark reading a stream (needs the ``spark`` extra).
- C{pack} (command C{pack}): the pack's figures on network namespaces (package).
- C{pair} (command C{pair}): a primary/backup pair's figures (package).
- C{multicast} (command C{multicast}): a multicast bridge's figures on namespaces (package).

Tests: ``tests/system/test_bench.py`` and ``tests/system/test_bench_*.py``.
"""
