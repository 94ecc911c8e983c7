"""
Tests for L{malamute_pack.pair.check}: the state a pair's broker records
for a floating address's manager, and the check command that reads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.datadir import DataDirLock
from malamute_pack.pair.check import STATE_FILE, current_state, main, write_state


class CheckTests(SynchronousTestCase):
    """The recorded state and the check."""

    def setUp(self) -> None:
        self.data = Path(self.mktemp())
        self.data.mkdir()

    def locked(self) -> None:
        lock = DataDirLock(self.data)
        lock.acquire()
        self.addCleanup(lock.release)

    def test_activeHolderPasses(self) -> None:
        """
        The state written by the live process that holds the data
        directory's lock is reported; only "active" exits 0.
        """
        self.locked()
        write_state(self.data, "active", "primary")
        self.assertEqual(current_state(self.data), "active")
        self.assertEqual(main([str(self.data)]), 0)
        write_state(self.data, "passive", "primary")
        self.assertEqual(main([str(self.data)]), 1)

    def test_noBrokerIsDown(self) -> None:
        """
        With no state file, or a state no live lock holder wrote (a broker
        killed with -9 leaves its last state), the broker is down.
        """
        self.assertEqual(current_state(self.data), "down")
        write_state(self.data, "active", "backup")
        self.assertEqual(current_state(self.data), "down")  # nobody holds the lock
        self.locked()
        state = json.loads((self.data / STATE_FILE).read_text())
        state["pid"] = 2**22 + 12345  # a process that is not this one
        (self.data / STATE_FILE).write_text(json.dumps(state))
        self.assertEqual(current_state(self.data), "down")

    def test_garbledStateIsDown(self) -> None:
        """A state file that is not what the broker writes counts as down."""
        self.locked()
        (self.data / STATE_FILE).write_text("{not json")
        self.assertEqual(current_state(self.data), "down")

    def test_usage(self) -> None:
        """The command takes exactly one data directory."""
        self.assertEqual(main([]), 2)
