"""
The broker's benchmark: ``python -m malamute_pack.bench`` starts a broker
process (or uses one already running) and measures it with load from
separate processes. L{malamute_pack.bench.load} is the load,
L{malamute_pack.bench.scenarios} the scenarios and their runner,
L{malamute_pack.bench.brokerprocess} the broker under test as a real
process (which the tests use too) and L{malamute_pack.bench.__main__} the
command line.

Tests: ``tests/system/test_bench.py``.
"""
