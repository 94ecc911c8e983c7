"""
The C{malamute} command as the system tests run it: this interpreter with
the checkout's package, in an environment without the settings the command
would otherwise take from it instead of its arguments; a run of it whose
result is checked for tracebacks, and the end of one left running.

Tests: used by ``tests/system/test_cli.py``, ``tests/system/test_cli_tail.py``,
``tests/system/test_consumers.py``, ``tests/system/test_pack_groups.py`` (through
``tests/group_members.py``).
"""

from __future__ import annotations

import subprocess
import sys

from malamute_pack.testing.brokerprocess import checkout_environment

COMMAND = [sys.executable, "-m", "malamute_pack.cli"]

# What the command would take from the environment instead of its arguments.
_SETTINGS = ("MALAMUTE_ENDPOINT", "MALAMUTE_USER", "MALAMUTE_PASSWORD", "MALAMUTE_ADDRESS")


def cli_environment(**extra: str) -> dict[str, str]:
    """The checkout's environment for the command, with C{extra} (settings included) on top."""
    env = checkout_environment(**extra)
    for name in _SETTINGS:
        if name not in extra:
            env.pop(name, None)
    return env


def malamute(*args: str, stdin: bytes = b"", **env: str) -> subprocess.CompletedProcess[bytes]:
    """Run the command with C{args}; its result (never a traceback, checked)."""
    done = subprocess.run(
        [*COMMAND, *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        env=cli_environment(**env),
    )
    if b"Traceback" in done.stderr:
        raise AssertionError(f"a traceback from {args}:\n{done.stderr.decode()}")
    return done


def kill_process(process: subprocess.Popen[bytes]) -> None:
    """Kill C{process} if it still runs, wait for it, and close its stderr."""
    if process.poll() is None:
        process.kill()
    process.wait()
    if process.stderr is not None:
        process.stderr.close()
