"""
The C{malamute} command line (L{malamute_pack.cli.main}): publish, tail,
send, receive, request, serve, export and import from a shell, and the
broker's status as tables.

Tests: ``tests/system/test_cli.py``.
"""
