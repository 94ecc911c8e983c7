"""
Test infrastructure shipped with the package (as C{twisted.internet.testing}
is with Twisted), because the system tests and the benchmarks
(L{malamute_pack.bench}) both use it; nothing the broker itself runs
imports it.

Its modules:

- C{brokerprocess}: the broker as a real process (started on a fresh
  endpoint and data directory, killed, restarted, stopped cleanly,
  optionally in a network namespace), and the commands that run this
  Python with the checkout importable.
- C{netns}: hosts on one machine as network namespaces on a bridge
  (L{malamute_pack.testing.netns.Lan}), for multi-host tests and
  benchmarks (root only).

Tests: ``tests/system/test_testing_brokerprocess.py``,
``tests/system/test_testing_netns.py``.
"""
