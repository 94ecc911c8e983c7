"""
The primary/backup pair: Binary Star failover and journal replication.

Tests: ``tests/unit/test_pair_machine.py``.
"""
