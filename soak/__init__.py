"""
The soak (issue 37): real brokers in network namespaces, clients that
append, send letters and requests and consume, a seeded nemesis that
kills, pauses, cuts, fills disks, damages journals and restarts, and a
checker that reads everything back afterwards. Run by C{scripts/soak}; not
part of the shipped package (C{malamute_pack} never imports it: an
import-linter contract).

Modules: C{__main__} (the command), C{run} (one soak, its phases),
C{topology} (the brokers in namespaces), C{slots} (names no other soak
uses), C{workload} (the clients of each topology), C{client} (the client
program), C{records} (what bodies carry), C{history} (the events),
C{nemesis} (the faults), C{memory} (processes' memory), C{checker} (the
rules, pure) and C{report} (the run directory and its summary).

Tests: ``tests/unit/test_soak_checker.py``, ``tests/unit/test_soak_nemesis.py``,
``tests/system/test_soak.py``.
"""
