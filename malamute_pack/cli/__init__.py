"""
The C{malamute} command line (L{malamute_pack.cli.main}): publish, tail,
send, receive, request, serve, export and import from a shell, and the
broker's status as tables.

Its modules:

- C{main}: the options (argparse) and the one place failures become a line
  and an exit status.
- C{__main__}: C{python -m malamute_pack.cli}.
- C{commands}: publish, tail, send, recv, request and the status sections.
- C{serve}: C{malamute serve}: a worker that runs a command per request.
- C{transfer}: C{malamute export} and C{import}, through the bulk client.
- C{files}: the files export writes and import reads (JSON lines, Parquet).
- C{records}: records, letters and requests as text and JSON.
- C{positions}: where a read starts or ends (C{--from}, C{--to}).
- C{connection}: how the command reaches a broker, and its clients.
- C{views}: each section of the C{$broker} service shown as text.
- C{tables}: plain text tables and key/value lists for a terminal.
- C{errors}: L{CommandError}, the one error the command reports itself.

Tests: ``tests/system/test_cli.py``.
"""
