"""
malamute_pack: a Malamute message broker on Twisted.

The layers, top to bottom (``docs/architecture.md``; the import-linter
contract in ``pyproject.toml`` checks them): each imports only those below.

Entry points:

- C{tap}: ``twistd malamute``: its options and the services they make.
- C{cli}: the C{malamute} command line (package).
- C{bench}: the benchmarks, ``python -m malamute_pack.bench`` (package).
- C{testing}: the broker as a real process and network namespaces, for tests
  and benchmarks (package).

Composition and features:

- C{settings}: the settings: the broker's own and each feature's section.
- C{pack}: brokers on several hosts found with Zyre, forwarding to each other.
- C{pair}: a primary/backup pair: Binary Star failover, journal replication.
- C{multicast}: multicast bridges: streams on PGM/NORM groups, repairs over TCP.
- C{ops}: statistics, the management API and dashboard, metrics, C{$broker}.
- C{spark}: the PySpark data source C{malamute} (a client, not a broker feature).
- C{broker_parts}: the core parts the tap hands each feature; L{Activity}.
- C{startup}: a start that fails says why in one line and exits 1.

Clients, transports, the model and storage:

- C{client}: Twisted, blocking and bulk clients on one sans-I/O core.
- C{transport}: ZeroMQ in the reactor, ROUTERs, MLM sessions and dialects, ZAP.
- C{broker}: the model: connections, streams, mailboxes, services, credit.
- C{journal}: the SQLite journal, which implements the model's store.
- C{store}: the L{malamute_pack.store.Store} interface and its records.

Leaves:

- C{protocol}: the codecs (MLM, pack link, ZRE, zgossip, pair, multicast).
- C{matching}: the pattern engine (six kinds, inverted bitmaps).
- C{text}: counts with their nouns, for people.
- C{zpl}: the ZPL reader (the C broker's ``malamute.cfg`` format).
- C{feature}: what a feature says about itself (L{malamute_pack.feature.Feature}).
- C{config_keys}: unknown config keys refused, with the nearest known one.
- C{datadir}: one broker per data directory, and its identity.
- C{gcservice}: how the garbage collector runs while the broker runs.
- C{process_setting}: a process-wide setting a service holds while it runs.
- C{blocked_imports}: importing a library without its heavy optional extras.

Each package's C{__init__} says what its modules hold.

Tests: ``tests/system/test_tap.py`` (the whole service), and a test module per
module, named in its docstring.
"""
