"""
What the consumer-group tests share: a member of a group as a
C{malamute tail --group} process whose printed records a thread collects,
and the check of what such members printed (the system tests); the check
that records reached a group's members exactly once, each subject's in
order (the unit tests).

Tests: used by ``tests/system/test_consumers.py``,
``tests/system/test_pack_groups.py``, ``tests/unit/test_broker_groups.py`` and
``tests/unit/test_pack_groups.py``.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.netns import Host
from tests.cli_support import COMMAND, cli_environment


class Member:
    """
    A C{malamute tail --group} process (on C{host} if one is given), its
    printed records collected by a thread.

    @ivar records: (sequence number, subject) of each record printed so far.
    """

    def __init__(
        self, endpoint: str, name: str, group: str, stream: str, host: Host | None = None
    ) -> None:
        self.name = name
        self.records: list[tuple[int, str]] = []
        argv = [
            *COMMAND, "-e", endpoint, "tail", stream, "--group", group, "--consumer", name,
            "--json",
        ]  # fmt: skip
        env = cli_environment()
        popen: Callable[..., subprocess.Popen[str]] = (
            subprocess.Popen if host is None else host.popen
        )
        self.process = popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            record = json.loads(line)
            self.records.append((record["seq"], record["subject"]))

    def stop(self) -> None:
        """Kill the process if it still runs, and wait for it and its reader."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._thread.join(10)
        assert self.process.stdout is not None
        self.process.stdout.close()


class GroupDeliveryCase(SynchronousTestCase):
    """
    A test case whose members of a group got the records in C{got}: per
    member, (sequence number, subject) of each record it got, in order.
    """

    got: Mapping[Any, Sequence[tuple[int, str]]]

    def assertExactlyOnceInOrder(self, total: int) -> None:
        """Every record 1..total reached exactly one member, each subject's in order at each."""
        seqs = sorted(seq for got in self.got.values() for seq, _ in got)
        self.assertEqual(seqs, list(range(1, total + 1)))
        for got in self.got.values():
            by_subject: dict[str, list[int]] = defaultdict(list)
            for seq, subject in got:
                by_subject[subject].append(seq)
            for subject_seqs in by_subject.values():
                self.assertEqual(subject_seqs, sorted(subject_seqs))


def check_printed(
    case: SynchronousTestCase,
    members: Sequence[Member],
    survivors: Iterable[Member],
    wanted: set[int],
    seconds: float,
) -> None:
    """
    Wait up to C{seconds} for C{members} to have printed every record of
    C{wanted} between them; then check that none is missing, that no
    record was printed by two of the C{survivors} (a member killed may
    have printed a record another then got again), and that each member
    printed each subject's records in order.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if {seq for member in members for seq, _ in member.records} >= wanted:
            break
        time.sleep(0.2)
    printed = {seq for member in members for seq, _ in member.records}
    missing = sorted(wanted - printed)
    case.assertEqual(missing[:20], [], f"{len(missing)} records no member printed")
    by_survivors = [seq for member in survivors for seq, _ in member.records]
    case.assertEqual(len(by_survivors), len(set(by_survivors)), "printed by two members")
    for member in members:
        per_subject: dict[str, list[int]] = defaultdict(list)
        for seq, subject in member.records:
            per_subject[subject].append(seq)
        for subject, seqs in per_subject.items():
            case.assertEqual(seqs, sorted(seqs), f"{member.name}: {subject} out of order")
