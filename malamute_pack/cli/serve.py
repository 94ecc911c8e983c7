"""
C{malamute serve SERVICE -- COMMAND}: a worker that answers each request
to a service by running a command, the request's body on its stdin, and
replying with what it wrote to stdout. A command that exits non-zero, or
runs longer than the time allowed (it is killed), is answered with
subject C{error} and its stderr (or the reason).

The command runs with its input and output in temporary files, not pipes,
and the client is polled while it runs: no threads, no deadlock on a
large body, and the connection's heartbeats go on meanwhile. A request is
answered DONE only once replied to, so a worker that dies mid-request
leaves it to be served again by another.

Tests: ``tests/system/test_cli.py``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Final

from malamute_pack.cli.connection import ConnectionSettings, open_client
from malamute_pack.cli.errors import CommandError
from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.events import Delivery

# How often a running command is checked on (the client is polled meanwhile).
_POLL: Final = 0.02
ERROR_SUBJECT: Final = "error"


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run of the command gave: the reply's subject and body."""

    ok: bool
    body: bytes


def _temporary() -> IO[bytes]:
    return tempfile.TemporaryFile(prefix="malamute-serve-")


def run_command(
    client: BlockingClient, command: list[str], request: Delivery, timeout: float
) -> Outcome:
    """
    Run C{command} for C{request}, polling C{client} while it runs; killed
    after C{timeout} seconds. Its stdout on success, else its stderr or why.
    """
    with _temporary() as stdin, _temporary() as stdout, _temporary() as stderr:
        stdin.write(b"".join(request.content))
        stdin.seek(0)
        env = dict(
            os.environ,
            MALAMUTE_SERVICE=request.address,
            MALAMUTE_SUBJECT=request.subject,
            MALAMUTE_SENDER=request.sender,
        )
        try:
            process = subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=env)
        except OSError as e:
            return Outcome(False, f"cannot run {shlex.join(command)}: {e}".encode())
        try:
            deadline = time.monotonic() + timeout
            while process.poll() is None:
                if time.monotonic() >= deadline:
                    process.kill()
                    process.wait()
                    return Outcome(
                        False, f"{shlex.join(command)} ran longer than {timeout:g} s".encode()
                    )
                client.pause(_POLL)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        stdout.seek(0)
        stderr.seek(0)
        if process.returncode == 0:
            return Outcome(True, stdout.read())
        why = stderr.read().strip()
        status = process.returncode
        return Outcome(False, why or f"{shlex.join(command)} exited with status {status}".encode())


def serve(
    settings: ConnectionSettings,
    service: str,
    pattern: str,
    command: list[str],
    timeout: float,
    count: int | None,
) -> int:
    """
    Serve C{service} (requests whose subjects C{pattern} finds) with
    C{command}: C{count} requests, or until interrupted.
    """
    if not command:
        raise CommandError("serve needs a command after --: malamute serve SERVICE -- COMMAND")
    if shutil.which(command[0]) is None:
        raise CommandError(f"no command {command[0]!r} found (is it on PATH?)")
    served = 0
    with open_client(settings, auto_done=False) as client:
        client.set_worker(service, pattern)
        print(f"serving {service} with {shlex.join(command)}", file=sys.stderr, flush=True)
        while count is None or served < count:
            request = client.recv()
            if request is None:
                continue
            if request.command != "SERVICE_DELIVER":
                # Not a request (a letter to this worker's own address): taken and dropped.
                with contextlib.suppress(ValueError):
                    client.done(request)
                continue
            outcome = run_command(client, command, request, timeout)
            subject = request.subject if outcome.ok else ERROR_SUBJECT
            if request.sender:
                client.sendto(request.sender, subject, [outcome.body], tracker=request.tracker)
            if not outcome.ok:
                reason = outcome.body.decode("utf-8", "replace").strip().splitlines()
                print(
                    f"request {request.subject!r} from {request.sender or '-'}: "
                    f"{reason[-1] if reason else 'failed'}",
                    file=sys.stderr,
                    flush=True,
                )
            with contextlib.suppress(ValueError):
                client.done(request)
            served += 1
    return 0
