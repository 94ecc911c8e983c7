"""
Helpers shared by the test modules: skipping slow system tests, locating
the shared reference material, capturing log events, waiting in the
reactor for a condition, and small full disks (a tmpfs mounted for one
test, and filling it).

Slow system tests (real broker processes, kill -9 runs, tmpfs mounts) run in
CI and are skipped locally with ``MALAMUTE_SKIP_SLOW=1``.

Tests: this module is exercised by every test module that imports it
(``tests/unit/test_journal_disk_full.py`` and ``tests/system/test_system_durability.py``
for the disks).
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from twisted.internet import reactor
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import ILogObserver, LogEvent, globalLogPublisher
from twisted.trial.unittest import SkipTest, SynchronousTestCase

SHARED = Path(os.environ.get("MALAMUTE_SHARED", Path(__file__).resolve().parents[2] / "shared"))

# Set as a test class's or method's ``skip`` attribute.
skip_slow: str | None = (
    "slow system test skipped: MALAMUTE_SKIP_SLOW is set"
    if os.environ.get("MALAMUTE_SKIP_SLOW")
    else None
)


async def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the reactor run until C{condition()} holds; fail after C{timeout} seconds."""
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"condition not met within {timeout}s")
        await deferLater(cast(IReactorTime, reactor), 0.005)


def capture_log(case: SynchronousTestCase) -> list[LogEvent]:
    """Every log event from now until C{case} ends."""
    events: list[LogEvent] = []
    observer = cast(ILogObserver, events.append)
    globalLogPublisher.addObserver(observer)
    case.addCleanup(globalLogPublisher.removeObserver, observer)
    return events


def mount_tmpfs(case: SynchronousTestCase, path: Path, size: str) -> None:
    """
    Mount a tmpfs of C{size} (C{"256k"}, C{"1m"}) on C{path}, made if
    missing, and unmount it when C{case} ends: after every cleanup
    registered later (a journal's close, a broker's stop) has run.

    @raise SkipTest: where this process may not mount one (not root).
    """
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        raise SkipTest(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    case.addCleanup(subprocess.run, ["umount", str(path)], check=True)


def fill_disk(path: Path) -> int:
    """Write the file C{path} until its file system has no space left; the bytes written."""
    written = 0
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(b"\0" * 4096)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                return written
