"""
Last-value streams end to end, with a real broker process and its data
directory (docs/protocol.md, "Last-value streams"): a stream compacted by
subject (``malamute/streams/ticks/compact = subject``) of 1,000 subjects
and 100,000 updates; a reader that asks for its last values half-way,
while the updates go on, gets the latest value of each of the 1,000
subjects as of its request, then every later update, none missing, none
twice; after the broker restarts (and after a kill -9) the snapshot is
the same as before. With a retention of 100 records, the 1,000 latest
values stay.
"""

from __future__ import annotations

import threading
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.blocking import BlockingClient
from malamute_pack.client.bulk import BulkClient
from malamute_pack.client.events import Delivery
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess
from tests.support import skip_slow

STREAM = "ticks"
SUBJECTS = 1000
ROUNDS = 100
CONFIG = f"malamute\n    streams\n        {STREAM}\n            compact = subject\n"


def subject(i: int) -> str:
    return f"sym.{i:04d}"


def write_rounds(endpoint: str, rounds: range) -> None:
    """Each round updates every subject once, in order: update r of subject i is seq r*1000+i+1."""
    with BulkClient(endpoint, timeout=30) as bulk:
        for r in rounds:
            records = [(subject(i), [f"{r}".encode()]) for i in range(SUBJECTS)]
            bulk.append(STREAM, f"round-{r}", records)


def expected_as_of(through: int) -> list[tuple[int, str, bytes]]:
    """The latest update of each subject up to sequence number C{through}, in sequence order."""
    found = []
    for i in range(SUBJECTS):
        last_round = (through - i - 1) // SUBJECTS
        if last_round >= 0:
            found.append((last_round * SUBJECTS + i + 1, subject(i), str(last_round).encode()))
    return sorted(found)


def take(client: BlockingClient, count: int) -> list[Delivery]:
    """The next C{count} stream records (each within 30 s)."""
    got: list[Delivery] = []
    while len(got) < count:
        delivery = client.recv(30)
        if delivery is None:
            raise AssertionError(f"{len(got)} records of {count}, then nothing for 30 s")
        if delivery.command == "STREAM_DELIVER":
            got.append(delivery)
    return got


def snapshot(endpoint: str) -> list[tuple[int, str, bytes]]:
    """The stream's last values as a new reader gets them (the stream is idle)."""
    with BlockingClient(endpoint, timeout=30) as client:
        client.set_consumer(STREAM, "", mlm.LAST_VALUES)
        return [(d.sequence or 0, d.subject, d.content[0]) for d in take(client, SUBJECTS)]


class LastValueStreamTests(SynchronousTestCase):
    skip = skip_slow

    def broker(self, config: str) -> BrokerProcess:
        path = Path(self.mktemp()).resolve()
        path.mkdir()
        (path / "malamute.cfg").write_text(config)
        broker = BrokerProcess(
            path / "broker",
            bind=ANY_TCP_PORT,
            data_dir=path / "data",
            args=["--config", str(path / "malamute.cfg")],
        )
        broker.start()
        self.addCleanup(broker.stop)
        return broker

    def test_snapshotThenLiveAndRestart(self) -> None:
        """
        Half-way through 100,000 updates a reader asks for the last values:
        1,000 of them (the latest of each subject as of its request), then
        every later update in order, none missing, none twice. After a
        restart, and after a kill -9, a new reader gets the same snapshot
        as before.
        """
        broker = self.broker(CONFIG)
        endpoint = broker.endpoint
        write_rounds(endpoint, range(ROUNDS // 2))
        rest = threading.Thread(target=write_rounds, args=(endpoint, range(ROUNDS // 2, ROUNDS)))
        with BlockingClient(endpoint, timeout=30) as reader:
            reader.set_consumer(STREAM, "", mlm.LAST_VALUES)
            rest.start()
            try:
                first = take(reader, SUBJECTS)
                seqs = [d.sequence or 0 for d in first]
                through = seqs[-1]
                self.assertEqual(
                    [(d.sequence, d.subject, d.content[0]) for d in first],
                    expected_as_of(through),
                )
                self.assertGreaterEqual(through, ROUNDS // 2 * SUBJECTS)
                later = take(reader, ROUNDS * SUBJECTS - through)
            finally:
                rest.join(60)
        self.assertEqual(
            [d.sequence for d in later], list(range(through + 1, ROUNDS * SUBJECTS + 1))
        )
        self.assertEqual(
            [(d.subject, d.content[0]) for d in later[-3:]],
            [(subject(i), str(ROUNDS - 1).encode()) for i in range(SUBJECTS - 3, SUBJECTS)],
        )
        before = snapshot(endpoint)
        self.assertEqual(before, expected_as_of(ROUNDS * SUBJECTS))
        broker.stop()
        broker.start()
        self.assertEqual(snapshot(endpoint), before)
        broker.kill()  # and after a crash (kill -9) too
        broker.start()
        self.assertEqual(snapshot(endpoint), before)

    def test_retentionKeepsLatest(self) -> None:
        """
        A last-value stream that retains 100 records keeps, beside them,
        the latest record of every subject: its 1,000 last values.
        """
        broker = self.broker(
            CONFIG
            + "    journal\n        prune-interval = 1\n        streams\n"
            + f"            {STREAM}\n                max-count = 100\n"
        )
        write_rounds(broker.endpoint, range(3))
        with BulkClient(broker.endpoint, timeout=30) as bulk:
            for _ in range(300):  # pruned within a second or two
                if bulk.status(STREAM, mlm.EARLIEST).first > 1:
                    break
                threading.Event().wait(0.1)
            status = bulk.status(STREAM, mlm.EARLIEST)
        self.assertEqual((status.first, status.last), (2 * SUBJECTS + 1, 3 * SUBJECTS))
        self.assertEqual(snapshot(broker.endpoint), expected_as_of(3 * SUBJECTS))
