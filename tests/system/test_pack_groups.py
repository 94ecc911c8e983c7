"""
Consumer groups across a pack, with real processes: two brokers in a pack
(network namespaces, beacons), three `malamute tail --group` members, two
on one broker and one on the other, sharing records written on both
brokers; one member killed part-way. Model: L{malamute_pack.pack.groups}.
"""

from __future__ import annotations

import json
import time
from typing import ClassVar

from tests.cli_support import COMMAND, cli_environment
from tests.group_members import Member, check_printed
from tests.pack_system_support import PackCase

STREAM = "orders"
GROUP = "g"
RECORDS = 10_000
SUBJECTS = 100


class PackGroupTests(PackCase):
    """A consumer group whose members are on two brokers of a pack."""

    size: ClassVar[int] = 2
    LANS: ClassVar[dict[str, tuple[str, str]]] = {
        "test_threeMembersTwoBrokersOneKilled": ("mpgr1", "10.77.81"),
    }

    def pack_args(self, index: int) -> list[str]:
        # Members' connections expire 3 s after a kill -9, not 10.
        return [*super().pack_args(index), "--timeout", "3000"]

    def write(self, index: int, start: int, count: int) -> None:
        """Records C{start}..C{start + count - 1} (subject by number) written on broker hINDEX."""
        lines = "".join(
            json.dumps({"subject": f"s.{n % SUBJECTS}", "body": f"r{n}"}) + "\n"
            for n in range(start, start + count)
        )
        done = self.lan.hosts[index - 1].run(
            [*COMMAND, "-e", self.broker(index).endpoint, "import", "-", STREAM],
            input=lines,
            timeout=120,
            env=cli_environment(),
        )
        self.assertEqual(done.returncode, 0, done.stderr)

    def groups_listed(self) -> list[str]:
        """The brokers (h1, h2) that list the group among their consumers."""
        where = []
        for index in (1, 2):
            done = self.lan.hosts[index - 1].run(
                [*COMMAND, "-e", self.broker(index).endpoint, "consumers", "--json"],
                timeout=30,
                env=cli_environment(),
            )
            self.assertEqual(done.returncode, 0, done.stderr)
            if any(c["name"] == GROUP for c in json.loads(done.stdout)):
                where.append(f"h{index}")
        return where

    def test_threeMembersTwoBrokersOneKilled(self) -> None:
        """
        Members m1 and m2 on h1 and m3 on h2 share 10,000 records over 100
        subjects, written half on each broker; m3 is killed (-9) part-way:
        every record is printed by a member (m3's unacknowledged ones by the
        others), none by two of the members left, each subject's records
        in order at each member; the group lives on one broker only.
        """
        members = [
            Member(self.broker(1).endpoint, "m1", GROUP, STREAM, self.lan.hosts[0]),
            Member(self.broker(1).endpoint, "m2", GROUP, STREAM, self.lan.hosts[0]),
            Member(self.broker(2).endpoint, "m3", GROUP, STREAM, self.lan.hosts[1]),
        ]
        for member in members:
            self.addCleanup(member.stop)
        deadline = time.monotonic() + 30
        while not self.groups_listed():
            self.assertLess(time.monotonic(), deadline, "the members did not join")
            time.sleep(0.2)
        killed = members[2]
        for start in range(0, RECORDS, 1000):
            self.write(1 if start % 2000 == 0 else 2, start, 1000)
            if start == 4000:
                while len(killed.records) < 200 and time.monotonic() < deadline + 30:
                    time.sleep(0.05)
                killed.stop()
        survivors = members[:2]
        wanted = set(range(1, RECORDS + 1))
        check_printed(self, members, survivors, wanted, 90)
        self.assertTrue(
            all(member.records for member in members), [len(m.records) for m in members]
        )
        home = self.groups_listed()
        self.assertEqual(len(home), 1, "the group lives on one broker")
        print(f"\npack group on {home[0]}: {[(m.name, len(m.records)) for m in members]} printed")
