"""
The C{malamute} commands that move single messages or show the broker's
state: publish, tail, send, recv, request, and the status sections read
from the broker's C{$broker} service. Each takes the parsed
L{ConnectionSettings} and its own arguments, writes to stdout (messages,
tables) and stderr (what it did), and returns the exit status; a failure
it can explain is a L{CommandError}.

Tests: ``tests/system/test_cli.py``, ``tests/system/test_cli_tail.py``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import time
from typing import Any, Final

from malamute_pack.cli.connection import (
    NAME_HINT,
    ConnectionSettings,
    open_bulk,
    open_client,
    stream_with_records,
)
from malamute_pack.cli.errors import CommandError
from malamute_pack.cli.positions import LATEST, Position
from malamute_pack.cli.records import Record, letter_json, letter_line, record_json, record_line
from malamute_pack.cli.views import render_section
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.events import Delivery
from malamute_pack.protocol import mlm
from malamute_pack.text import plural

# The broker's management service (malamute_pack/ops/management.py).
SERVICE: Final = "$broker"
# How long a status request may wait for the broker's answer.
STATUS_TIMEOUT: Final = 5.0


def read_body(body: str | None) -> bytes:
    """The body given: its UTF-8 bytes, or stdin's whole content for C{-} or none."""
    if body is None or body == "-":
        return sys.stdin.buffer.read()
    return body.encode("utf-8")


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _json_line(item: dict[str, Any]) -> str:
    return json.dumps(item, ensure_ascii=False)


def publish(settings: ConnectionSettings, stream: str, subject: str, body: str | None) -> int:
    """Publish one message (or, with BODY C{-} or none, stdin's content) to C{stream}."""
    content = read_body(body)
    with open_client(settings) as client:
        client.set_producer(stream)
        client.send(subject, [content])
    return 0


def publish_lines(settings: ConnectionSettings, stream: str, subject: str) -> int:
    """Publish each line of stdin (without its newline) as a message to C{stream}."""
    sent = 0
    with open_client(settings) as client:
        client.set_producer(stream)
        for line in sys.stdin.buffer:
            client.send(subject, [line.rstrip(b"\r\n")])
            sent += 1
    print(f"published {plural(sent, 'message')} to {stream}", file=sys.stderr)
    return 0


# How often `tail --consumer` commits what it printed (and at the end).
COMMIT_EVERY_S = 1.0


def tail(
    settings: ConnectionSettings,
    stream: str,
    pattern: str,
    start: Position | None,
    as_json: bool,
    count: int | None,
    consumer: str | None = None,
    group: str | None = None,
) -> int:
    """
    Print C{stream}'s messages whose subjects C{pattern} finds, from
    C{start} (None: the latest), as they come (C{count} of them, or until
    interrupted). A stream with no record yet is waited for, saying so once
    on stderr (its name may be a typo). As the durable C{consumer}: from
    after its last commit (C{start}, if given, resets it), committing what
    was printed every second and before it returns. As a member of
    C{group} (named C{consumer}, or after this process): the same, sharing
    the stream's records with the group's other members.
    """
    if group is not None and consumer is None:
        consumer = f"{socket.gethostname()}.{os.getpid()}"
    if consumer is not None:
        return _tail_consumer(
            settings, stream, pattern, start, as_json, count, consumer, group or ""
        )
    start = start or LATEST
    with open_bulk(settings) as bulk:
        if start.whence not in (mlm.LATEST, mlm.LAST_VALUES):
            stream_with_records(bulk, stream, "; use --from latest to wait for the first")
        elif bulk.status(stream, mlm.EARLIEST).last == 0:
            print(
                f"waiting for the first record of stream {stream!r}, which has none yet"
                f" ({NAME_HINT})",
                file=sys.stderr,
                flush=True,
            )
    shown = 0
    with open_client(settings) as client:
        client.set_consumer(stream, pattern, start.whence, start.value)
        while count is None or shown < count:
            if _print_record(client.recv(), stream, as_json):
                shown += 1
    return 0


def _print_record(delivery: Delivery | None, stream: str, as_json: bool) -> bool:
    """Print C{delivery} if it is a record of C{stream}; whether it was."""
    if delivery is None or delivery.command != "STREAM_DELIVER" or delivery.address != stream:
        return False
    record = Record.from_delivery(delivery)
    _emit(_json_line(record_json(record)) if as_json else record_line(record))
    return True


def _tail_consumer(
    settings: ConnectionSettings,
    stream: str,
    pattern: str,
    start: Position | None,
    as_json: bool,
    count: int | None,
    consumer: str,
    group: str,
) -> int:
    shown = 0
    printed = 0  # the last record printed
    uncommitted = False  # printed since the last commit
    with open_client(settings) as client:
        if start is None:
            client.consume(stream, pattern, consumer, group)
        else:
            client.consume(stream, pattern, consumer, group, start.whence, start.value)
        next_commit = time.monotonic() + COMMIT_EVERY_S
        try:
            while count is None or shown < count:
                delivery = client.recv(max(0.0, next_commit - time.monotonic()))
                if time.monotonic() >= next_commit:
                    if uncommitted:
                        client.commit(stream, printed)
                        uncommitted = False
                    next_commit = time.monotonic() + COMMIT_EVERY_S
                if not _print_record(delivery, stream, as_json):
                    continue
                assert delivery is not None and delivery.sequence is not None  # version 2
                printed = delivery.sequence
                uncommitted = True
                shown += 1
        finally:
            if uncommitted:
                client.commit(stream, printed)
    return 0


def send(settings: ConnectionSettings, address: str, subject: str, body: str | None) -> int:
    """Send a letter to the mailbox C{address}; stored by the broker when this returns."""
    content = read_body(body)
    with open_client(settings) as client:
        client.sendto(address, subject, [content])
    return 0


def recv(settings: ConnectionSettings, address: str, as_json: bool, count: int | None) -> int:
    """
    Take the letters of mailbox C{address} (connecting as that address) and
    print them: C{count} of them, or until interrupted.
    """
    shown = 0
    with open_client(settings, address) as client:
        while count is None or shown < count:
            delivery = client.recv()
            if delivery is None or delivery.command == "STREAM_DELIVER":
                continue
            _emit(_json_line(letter_json(delivery)) if as_json else letter_line(delivery))
            _answer(client, delivery)
            shown += 1
    return 0


def _answer(client: BlockingClient, delivery: Delivery) -> None:
    """
    Answer a tracked letter with DONE (the client answers untracked ones
    itself): else the broker keeps it in the mailbox for ever.
    """
    if delivery.tracker and delivery.id is not None:
        client.done(delivery)


def await_reply(client: BlockingClient, tracker: str, timeout: float) -> Delivery | None:
    """The letter to our mailbox that answers C{tracker}, or None after C{timeout} seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        delivery = client.recv(left)
        if delivery is None:
            return None
        _answer(client, delivery)
        if delivery.command == "MAILBOX_DELIVER" and delivery.tracker == tracker:
            return delivery


def _ask(client: BlockingClient, service: str, subject: str, body: bytes, timeout: float) -> str:
    """Send a request whose reply C{await_reply} will know; the tracker."""
    tracker = secrets.token_hex(8)
    # The request expires with our patience: nobody waits for a late answer.
    client.sendfor(service, subject, [body], tracker=tracker, timeout_ms=round(timeout * 1000))
    return tracker


def request(
    settings: ConnectionSettings, service: str, subject: str, body: str | None, timeout: float
) -> int:
    """
    Send a request to C{service} and print the reply's body; a reply with
    subject C{error} is a failure (its body is the reason).
    """
    content = read_body(body)
    with open_client(settings) as client:
        tracker = _ask(client, service, subject, content, timeout)
        reply = await_reply(client, tracker, timeout)
    if reply is None:
        raise CommandError(
            f"no reply from service {service!r} within {timeout:g} s: is a worker serving it? "
            "(`malamute services` shows its workers; --timeout to wait longer)"
        )
    data = b"".join(reply.content)
    if reply.subject == "error":
        reason = data.decode("utf-8", errors="replace").strip() or "no reason given"
        raise CommandError(f"service {service!r} answered error: {' / '.join(reason.splitlines())}")
    sys.stdout.buffer.write(data)
    if sys.stdout.isatty() and not data.endswith(b"\n"):
        sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()
    return 0


def fetch_section(settings: ConnectionSettings, name: str) -> Any:
    """
    Section C{name} of the broker's statistics, from its C{$broker} service
    (its JSON, decoded).

    @raise CommandError: if the service does not answer, or answers an error.
    """
    timeout = max(settings.timeout, STATUS_TIMEOUT)
    with open_client(settings) as client:
        tracker = _ask(client, SERVICE, name, b"", timeout)
        reply = await_reply(client, tracker, timeout)
    if reply is None:
        raise CommandError(
            f"the broker's {SERVICE} service did not answer within {timeout:g} s: the broker "
            f"may be older than this command, or its ACL may not let this user `call {SERVICE}`"
        )
    try:
        data = json.loads(b"".join(reply.content))
    except ValueError as e:
        raise CommandError(f"the broker's {SERVICE} service sent what is not JSON: {e}") from None
    if reply.subject == "error":
        reason = data.get("error") if isinstance(data, dict) else data
        raise CommandError(f"the broker's {SERVICE} service refused {name!r}: {reason}")
    return data


def section(settings: ConnectionSettings, name: str, as_json: bool) -> int:
    """Print section C{name}: as a table, or with C{as_json} the JSON as the broker sent it."""
    data = fetch_section(settings, name)
    _emit(json.dumps(data, indent=2) if as_json else render_section(name, data))
    return 0
