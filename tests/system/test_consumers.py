"""
Durable named readers end to end, with real processes: C{malamute tail
--consumer} run twice resumes where the first left off, across a broker's
C{kill -9} and restart, and across a pair's fail-over (the position is
replicated to the partner); group members that share a stream, one killed
or stalled past the broker's timeout. Model:
L{malamute_pack.broker.consumers}.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient
from malamute_pack.client.errors import MalamuteError
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.cli_support import COMMAND, cli_environment, malamute
from tests.group_members import Member, check_printed
from tests.pair_system_support import ACTIVE, TAKING_OVER, PairCase
from tests.support import skip_slow

STREAM = "orders"
RECORDS = 1000


def write_records(endpoint: str, count: int = RECORDS) -> None:
    """Append C{count} records to L{STREAM}, durable when this returns."""
    bulk = BulkClient(endpoint)
    try:
        for start in range(0, count, 250):
            batch = [(f"o.{n % 7}", [f"order {n}".encode()]) for n in range(start, start + 250)]
            bulk.append(STREAM, f"batch-{start}", batch)
    finally:
        bulk.close()


def sequences(output: bytes) -> list[int]:
    """The sequence numbers of the records C{tail --json} printed."""
    return [json.loads(line)["seq"] for line in output.splitlines()]


class ConsumerTailTests(SynchronousTestCase):
    skip = skip_slow

    def setUp(self) -> None:
        self.broker = BrokerProcess(Path(self.mktemp()))
        self.broker.start()
        self.addCleanup(self.broker.stop)
        write_records(self.broker.endpoint)

    def tail(self, count: int) -> list[int]:
        done = malamute(
            "-e", self.broker.endpoint, "tail", STREAM, "--consumer", "c1", "--json",
            "--count", str(count),
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        return sequences(done.stdout)

    def test_secondProcessResumes(self) -> None:
        """tail --consumer c1 --count 400, then --count 600 in a new process: 1-400, 401-1000."""
        self.assertEqual(self.tail(400), list(range(1, 401)))
        self.assertEqual(self.tail(600), list(range(401, 1001)))

    def test_resumesAfterKillAndRestart(self) -> None:
        """The acknowledged position survives a kill -9 of the broker and its restart."""
        self.assertEqual(self.tail(400), list(range(1, 401)))
        self.broker.kill()
        self.broker.start()
        self.assertEqual(self.tail(600), list(range(401, 1001)))

    def test_listedWithLag(self) -> None:
        """`malamute consumers` lists the consumer, its position and its lag."""
        self.tail(400)
        done = malamute("-e", self.broker.endpoint, "consumers", "--json")
        self.assertEqual(done.returncode, 0, done.stderr.decode())
        [consumer] = json.loads(done.stdout)
        self.assertEqual(
            (consumer["stream"], consumer["name"], consumer["position"], consumer["lag"]),
            (STREAM, "c1", 400, 600),
        )


class ConsumerGroupTests(SynchronousTestCase):
    skip = skip_slow

    def test_threeMembersOneKilled(self) -> None:
        """
        Three `tail --group` processes share 10,000 records over 100
        subjects; one is killed (-9) part-way: every record is printed by a
        member (the killed one's unacknowledged records by the others), no
        record by two of the members left, each subject's records in order
        at each member.
        """
        broker = BrokerProcess(Path(self.mktemp()), args=["--timeout", "3000"])
        broker.start()
        self.addCleanup(broker.stop)
        members = [Member(broker.endpoint, f"m{n}", "g", STREAM) for n in range(3)]
        for member in members:
            self.addCleanup(member.stop)
        deadline = time.monotonic() + 30
        # `malamute consumers` shows the group connected, with its members.
        listed: list[dict[str, Any]] = []
        while not (listed and sorted(listed[0]["members"]) == ["m0", "m1", "m2"]):
            self.assertLess(time.monotonic(), deadline, f"the members did not join: {listed}")
            time.sleep(0.2)
            done = malamute("-e", broker.endpoint, "consumers", "--json")
            listed = [c for c in json.loads(done.stdout) if c["name"] == "g"]
        self.assertEqual((listed[0]["kind"], listed[0]["connected"]), ("group", True))
        bulk = BulkClient(broker.endpoint)
        self.addCleanup(bulk.close)
        for start in range(0, 10_000, 500):
            batch = [(f"s.{n % 100}", [b"x"]) for n in range(start, start + 500)]
            bulk.append(STREAM, f"b{start}", batch)
            if start == 4000:
                killed = members[0]
                while len(killed.records) < 200 and time.monotonic() < deadline + 30:
                    time.sleep(0.05)
                killed.stop()
        survivors = members[1:]
        check_printed(self, members, survivors, set(range(1, 10_001)), 60)
        self.assertTrue(all(member.records for member in survivors))

    def test_stalledMemberDropsWhatWasGivenBack(self) -> None:
        """
        A member that stops calling its client longer than the broker's
        timeout is forgotten, and the records sent to it go to the other
        member, who acknowledges them. Woken, the stalled member's client
        connects again and drops the records it still held for the
        application: at most the first one it hands over before it hears
        that the broker forgot it is one the other member had (its commit
        is refused, 300); every record is acknowledged by one member.
        """
        broker = BrokerProcess(Path(self.mktemp()), args=["--timeout", "1000"])
        broker.start()
        self.addCleanup(broker.stop)
        stalled = BlockingClient([broker.endpoint], "m1", timeout=5.0, heartbeat=0.3)
        self.addCleanup(stalled.close)
        stalled.consume(STREAM, "", "m1", "g", mlm.RESUME)
        write_records(broker.endpoint, 250)
        other = BlockingClient([broker.endpoint], "m2", timeout=5.0, heartbeat=0.3)
        self.addCleanup(other.close)
        other.consume(STREAM, "", "m2", "g", mlm.RESUME)
        acknowledged: dict[int, str] = {}

        def take(client: BlockingClient, name: str, seconds: float) -> list[int]:
            got = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                delivery = client.recv(timeout=0.1)
                if delivery is None or delivery.sequence is None:
                    continue
                got.append(delivery.sequence)
                try:
                    client.commit(STREAM, delivery.sequence)
                except MalamuteError as e:
                    self.assertEqual(e.code, 300, str(e))
                else:
                    self.assertNotIn(delivery.sequence, acknowledged)
                    acknowledged[delivery.sequence] = name
            return got

        # The stalled member makes no call for 3 s: the broker forgets it.
        taken_over = take(other, "m2", 3.0)
        self.assertTrue(taken_over, "the other member got nothing given back")
        woken = take(stalled, "m1", 3.0)
        before = [seq for seq in woken if acknowledged.get(seq) == "m2" and seq in taken_over]
        self.assertLessEqual(len(before), 1, f"handed over after the other had them: {before}")
        take(other, "m2", 1.0)
        self.assertEqual(sorted(acknowledged), list(range(1, 251)))


class ConsumerPairTests(PairCase):
    """A consumer's position replicated to the pair's partner."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_resumesAfterFailover": "mpcf"}

    def tail(self, count: int) -> list[int]:
        host = self.lan.hosts[2]
        done = host.run(
            [
                *COMMAND, "-e", ",".join(self.both), "tail", STREAM, "--consumer", "c1",
                "--json", "--count", str(count),
            ],
            capture_output=True,
            timeout=120,
            env=cli_environment(),
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr)
        return [json.loads(line)["seq"] for line in done.stdout.splitlines()]

    def test_resumesAfterFailover(self) -> None:
        """
        1000 records; the consumer takes 400 from the active; the active is
        killed (-9), and the consumer in a new process (both endpoints) gets
        401-1000 from the backup, which takes over.
        """
        self.start_pair()
        host = self.lan.hosts[2]
        write = host.run(
            [*COMMAND, "-e", ",".join(self.both), "import", "-", STREAM],
            input="".join(
                json.dumps({"subject": f"o.{n % 7}", "body": f"order {n}"}) + "\n"
                for n in range(RECORDS)
            ),
            capture_output=True,
            text=True,
            timeout=120,
            env=cli_environment(),
        )
        self.assertEqual(write.returncode, 0, write.stderr)
        self.assertEqual(self.tail(400), list(range(1, 401)))
        self.broker(1).kill()
        # h2 takes over on the first request it hears from a client (Binary Star).
        self.assertEqual(self.tail(600), list(range(401, 1001)))
        self.wait_logs([(2, TAKING_OVER), (2, ACTIVE)], 5.0, "h2 did not take over")
