"""
Tests for L{malamute_pack.journal} durability against a real crash: a child
process (``tests/journal_store_child.py``, real reactor, real Journal) is
killed with SIGKILL in the middle of a load, and every record it had been
told was durable must be in the database when it is reopened.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalConfig
from tests.support import skip_slow
from tests.unit.test_journal_journal import new_path, open_journal

REPO = Path(__file__).resolve().parents[2]
ACKS_BEFORE_KILL = 10_000
TIMEOUT_S = 15.0


def run_until_acks(path: Path, wanted: int) -> tuple[list[str], float]:
    """
    Run the child on ``path`` until it has printed ``wanted`` lines, kill it
    with SIGKILL, and return every line it printed before dying and how long
    it ran.
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.journal_store_child", str(path.resolve())],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    fd = child.stdout.fileno()
    output = b""
    started = time.monotonic()
    try:
        while output.count(b"\n") < wanted and time.monotonic() - started < TIMEOUT_S:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                output += chunk
        child.send_signal(signal.SIGKILL)
        rest, errors = child.communicate(timeout=TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if child.returncode != -signal.SIGKILL:
        raise AssertionError(f"child ended by itself ({child.returncode}): {errors.decode()}")
    # Lines the child printed before the kill, including any still in the pipe.
    lines = (output + rest).decode().splitlines()
    return lines[:-1] if not (output + rest).endswith(b"\n") else lines, time.monotonic() - started


class KillNineTests(TestCase):
    skip = skip_slow

    @inlineCallbacks
    def test_acknowledgedSurviveKill(self) -> Generator[Deferred[Any], Any, None]:
        """
        After SIGKILL mid-load every id the child printed from on_durable is
        among the recovered records (unless it was one of the confirmed and
        removed ones), and ids go on after the highest printed.
        """
        path = new_path(self)
        lines, _ = run_until_acks(path, ACKS_BEFORE_KILL)
        self.assertEqual([line for line in lines if not line.isdigit()], [])
        acknowledged = [int(line) for line in lines]
        self.assertGreaterEqual(len(acknowledged), ACKS_BEFORE_KILL)
        journal, recovered = open_journal(self, path)
        present = {record.id for record in recovered.queued}
        kept = [rid for rid in acknowledged if rid % 3]
        self.assertEqual([rid for rid in kept if rid not in present], [])
        self.assertEqual(recovered.queued, sorted(recovered.queued, key=lambda r: r.id))
        after = journal.store_queued("mailbox", "m", "a", "s", "t", None, [], lambda e: None)
        self.assertGreater(after.id, max(acknowledged))
        # The killed journal's numbering resumes past a crash_skip hole.
        self.assertTrue(journal.crashed)
        first, last = recovered.streams["s"]
        committed = last - JournalConfig().crash_skip
        records = yield journal.read_stream("s", first, last)
        self.assertEqual([r.seq for r in records], list(range(first, committed + 1)))
