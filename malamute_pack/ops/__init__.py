"""
Operations: what the broker shows and lets an operator do while it runs:
its statistics (L{malamute_pack.ops.stats}), the management API and
dashboard over HTTP, Prometheus metrics and the C{$broker} management
service that the C{malamute} command line asks.

Tests: ``tests/unit/test_ops_stats.py``.
"""
