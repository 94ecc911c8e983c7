"""
malamute_pack: a Malamute message broker on Twisted.

The packages, top to bottom; each imports only packages below it: C{tap}
(``twistd malamute``: options and services), C{bench} (the benchmark),
C{client} (Twisted and blocking clients), C{transport} (ZeroMQ in the
reactor, MLM sessions and dialects, ZAP), C{journal} (SQLite; it implements
the broker's L{malamute_pack.broker.store.Store}), C{broker} (the model),
C{matching} (the pattern engine), C{protocol} (codecs). Each package's
C{__init__} says what its modules hold.

Tests: ``tests/system/test_tap.py`` (the whole service), and a test module per
module, named in its docstring.
"""
