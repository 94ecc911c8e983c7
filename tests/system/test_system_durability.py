"""
Slow system tests of the broker's journal with the broker as a real
process: nothing acknowledged with STORED 200 is lost, and no id is given
to two letters, when the broker is SIGKILLed under load and restarted; a
full disk makes the broker refuse letters (STORED 300, never delivered)
while it goes on serving, and store them again once space is freed.

Skipped with ``MALAMUTE_SKIP_SLOW=1``. Run with
``.venv/bin/python -m twisted.trial --temp-directory=/tmp/sysdur
tests.system.test_system_durability``.

Tests: this is a test module; its helpers are ``tests/system_support.py``,
``tests/system_load.py`` and the broker process of
L{malamute_pack.testing.brokerprocess}.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from time import monotonic, sleep

import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess, fresh_ipc_endpoint
from tests.support import fill_disk, mount_tmpfs, skip_slow
from tests.system_load import (
    Delivery,
    Recipient,
    ReconnectingClient,
    Sender,
    letter_subjects,
    pump,
)
from tests.system_support import Peer

LETTERS = 20_000
WINDOW = 500
KILL_AFTER = 5_000
QUIET = 2.0
LOAD_DEADLINE = 50.0


class SystemTestCase(SynchronousTestCase):
    """
    A broker process and ZeroMQ peers, all torn down after each test. The
    broker runs in the test's directory, its data dir is C{data} there
    unless given, and its output goes to C{broker.log} there (every start
    appends).
    """

    def setUp(self) -> None:
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)

    def start_broker(self, label: str, data_dir: Path | None = None) -> BrokerProcess:
        """
        A broker on a fresh ipc endpoint, serving once this returns; it must
        shut down cleanly when the test ends.
        """
        broker = BrokerProcess(
            self.base,
            bind=fresh_ipc_endpoint(f"system-{label}"),
            data_dir=self.base / "data" if data_dir is None else data_dir,
        )
        # Cleanups run last first: this one after every peer's close.
        self.addCleanup(broker.stop)
        broker.start()
        return broker

    def peer(self, broker: BrokerProcess) -> Peer:
        peer = Peer(self.context, broker.endpoint)
        self.addCleanup(peer.close)
        return peer


@dataclass
class KillNineRun:
    """
    What a load run through a kill -9 left: the clients, how many letters
    had STORED 200 when the broker was killed, and when (seconds from the
    start) it was killed and the run ended.
    """

    broker: BrokerProcess
    sender: Sender
    rx: Recipient
    worker: Recipient
    acked_at_kill: int
    killed_at: float
    elapsed: float

    @property
    def clients(self) -> list[ReconnectingClient]:
        return [self.rx, self.worker, self.sender]

    @property
    def deliveries(self) -> list[Delivery]:
        return self.rx.deliveries + self.worker.deliveries


class KillNineTests(SystemTestCase):
    skip = skip_slow

    def load_through_kill(self, ahead: int = 0, resend_reversed: bool = False) -> KillNineRun:
        """
        A version 2 sender pipelines LETTERS mailbox and service letters
        while a version 2 recipient ("rx") and worker (of "svc") take them
        and answer DONE; once KILL_AFTER have STORED 200 the broker is
        SIGKILLed and restarted on the same data dir and endpoint; the
        clients open again on ERROR 500 and the sender resends what it has
        no STORED for. Runs until every letter has STORED 200 and the
        recipients have been quiet for QUIET seconds.

        @param ahead: kill only once a recipient has been handed an id this
            far beyond the highest one acknowledged with STORED (or at half
            the letters): a moment when letters are out whose STORED (their
            commit) may not have happened yet.
        @param resend_reversed: the sender resends in reverse order.
        """
        started = monotonic()
        broker = self.start_broker("kill9")
        sender = Sender(
            self.peer(broker), letter_subjects(LETTERS), "rx", "svc", WINDOW, resend_reversed
        )
        rx = Recipient(self.peer(broker), "rx")
        worker = Recipient(self.peer(broker), "worker", service="svc")
        clients = [rx, worker, sender]
        poller = zmq.Poller()
        for client in clients:
            poller.register(client.peer.socket, zmq.POLLIN)
            client.connect()

        killed: tuple[int, float] | None = None
        deadline = started + LOAD_DEADLINE
        while True:
            pump(clients, poller, 0.05)
            now = monotonic()
            if (
                killed is None
                and len(sender.acked) >= KILL_AFTER
                and (
                    ahead == 0
                    or ids_ahead(sender, rx, worker) >= ahead
                    or len(sender.acked) >= LETTERS // 2
                )
            ):
                killed = (len(sender.acked), now - started)
                broker.kill()
                broker.start()  # the same endpoint and data dir, serving once this returns
                rx.generation = worker.generation = 1
            quiet = min(now - rx.last_delivery, now - worker.last_delivery)
            if killed is not None and sender.done() and quiet > QUIET:
                return KillNineRun(broker, sender, rx, worker, *killed, now - started)
            if now > deadline:
                self.fail(
                    f"load not finished in {LOAD_DEADLINE}s: acked={len(sender.acked)} "
                    f"in_flight={len(sender.in_flight)} to_send={len(sender.to_send)} "
                    f"rx={len(rx.deliveries)} worker={len(worker.deliveries)} "
                    f"killed={killed} errors={sender.errors + rx.errors + worker.errors}\n"
                    f"{broker.log_text()}"
                )

    def test_nothingAcknowledgedIsLostAcrossKillNine(self) -> None:
        """
        Through a kill -9 under load (L{load_through_kill}) every letter
        acknowledged with STORED 200 is delivered at least once, to the
        right kind of recipient, with its content. Prints the run's figures
        as one C{kill9:} line.
        """
        run = self.load_through_kill()
        sender, deliveries = run.sender, run.deliveries
        by_subject = Counter(d.subject for d in deliveries)
        by_id = Counter(d.id for d in deliveries)
        lost = sorted(set(sender.acked) - set(by_subject))
        print(
            f"kill9: sent={LETTERS} acked={len(sender.acked)} delivered={len(deliveries)} "
            f"distinct={len(by_subject)} duplicates={len(deliveries) - len(by_subject)} "
            f"lost={len(lost)} duplicate_ids={len(deliveries) - len(by_id)} "
            f"resent={sender.resent} acked_before_kill={run.acked_at_kill} "
            f"kill_at={run.killed_at:.2f}s secs={run.elapsed:.1f}"
        )
        self.assertEqual(lost, [], f"lost (first 20): {lost[:20]}\n{run.broker.log_text()}")
        self.assertEqual(len(sender.acked), LETTERS)
        # The kill happened mid-load: acknowledgements before it and after it.
        self.assertGreaterEqual(run.acked_at_kill, KILL_AFTER)
        self.assertLess(run.acked_at_kill, LETTERS)
        self.assertTrue(run.broker.alive(), run.broker.log_text())
        # Every client noticed the restart and opened again; no other ERROR.
        for client in run.clients:
            self.assertGreaterEqual(client.opens, 2, client.address)
            self.assertEqual([e for e in client.errors if e[0] != mlm.COMMAND_INVALID], [])
        # The right letters reached the right recipients, intact.
        self.assertEqual({d.subject[0] for d in run.rx.deliveries}, {"m"})
        self.assertEqual({d.subject[0] for d in run.worker.deliveries}, {"s"})
        self.assertEqual([d for d in deliveries if d.content != (d.subject.encode(),)], [])

    def test_idsStayUniqueAcrossKillNine(self) -> None:
        """
        Ids are stable across a restart, so a recipient may discard a
        redelivery by its id (docs/protocol.md): through a kill -9 under
        load (L{load_through_kill}, killed while ids are out ahead of the
        STOREDs, the sender resending in reverse order) no id names two
        different letters, in the STORED 200 the sender got and the records
        the recipients got.
        """
        run = self.load_through_kill(ahead=WINDOW // 10, resend_reversed=True)
        clashes = run.sender.id_clashes + id_clashes(run.sender.ids, run.deliveries)
        self.assertEqual(
            clashes[:10],
            [],
            f"{len(clashes)} ids name two letters: (id, letter, other letter, 1 if the "
            f"other was read after the kill, maybe still sent by the killed broker); "
            f"acknowledged letters a recipient discarding seen ids would never process: "
            f"{len(lost_to_dedup(run.sender.acked, run.rx, run.worker))}",
        )


def ids_ahead(sender: Sender, *recipients: Recipient) -> int:
    """How far the highest id handed to a recipient is beyond the highest STORED 200."""
    # The STOREDs that have arrived by now, after the records read.
    for message in sender.peer.receive_ready():
        sender.handle(message)
    return max(r.max_id for r in recipients) - max(sender.ids, default=0)


def id_clashes(
    acked: dict[int, str], deliveries: list[Delivery]
) -> list[tuple[int, str, str] | tuple[int, str, str, int]]:
    """
    (id, letter, other letter, the other's generation) for every record
    whose id already named another letter, in a STORED 200 or a record.
    """
    names = dict(acked)
    return [
        (d.id, names[d.id], d.subject, d.generation)
        for d in deliveries
        if names.setdefault(d.id, d.subject) != d.subject
    ]


def lost_to_dedup(acked: dict[str, list[int]], *recipients: Recipient) -> set[str]:
    """The acknowledged subjects recipients discarding ids they had seen would never process."""
    processed: set[str] = set()
    for recipient in recipients:
        seen: set[int] = set()
        for d in recipient.deliveries:
            if d.id not in seen:
                seen.add(d.id)
                processed.add(d.subject)
    return set(acked) - processed


class FullDiskTests(SystemTestCase):
    """
    The broker's data dir on a 1 MiB tmpfs, filled up once the broker
    serves. Version 2 mailbox letters from C{tx} to C{inbox}.

    @ivar stored: subjects of the letters acknowledged with STORED 200.
    @ivar refused: subjects of the letters answered with STORED 300.
    """

    skip = skip_slow

    def setUp(self) -> None:
        super().setUp()
        self.mount = self.base / "mnt"
        mount_tmpfs(self, self.mount, "1m")  # unmounted after the broker's stop
        self.broker = self.start_broker("disk", self.mount)
        self.tx = self.peer(self.broker)
        self.assertEqual(self.tx.command(mlm.ConnectionOpen(version=2, address="tx")), mlm.Ok())
        self.stored: list[str] = []
        self.refused: list[str] = []

    def post(self, subject: str, content: bytes) -> mlm.Stored:
        """Send a letter to C{inbox} (tracker = subject); its STORED."""
        reply = self.tx.command(mlm.MailboxSend("inbox", subject, subject, 0, [content]))
        assert isinstance(reply, mlm.Stored), f"{reply}\n{self.broker.log_text()}"
        self.assertEqual(reply.tracker, subject)
        if reply.status_code == mlm.SUCCESS:
            self.stored.append(subject)
        else:
            self.refused.append(subject)
        return reply

    def fill_until_refused(self) -> mlm.Stored:
        """Fill the disk, then send 4 KiB letters until one is refused; that STORED."""
        fill_disk(self.mount / "filler")
        for i in range(500):
            reply = self.post(f"full-{i}", bytes(4096))
            if reply.status_code != mlm.SUCCESS:
                return reply
        raise AssertionError(f"no refusal after 500 letters\n{self.broker.log_text()}")

    def free_space(self) -> None:
        (self.mount / "filler").unlink()

    def receive_mail(self, inbox: Peer) -> list[str]:
        """Subjects of the records C{inbox} gets until it is quiet for 1 s, each DONE."""
        got: list[str] = []
        while (record := inbox.receive(1.0)) is not None:
            assert isinstance(record, mlm.MailboxRecord), record
            got.append(record.subject)
            inbox.send(mlm.Done(record.id, mlm.SUCCESS, ""))
        return got

    def test_fullDiskRefusesThenRecovers(self) -> None:
        """
        On a full disk the broker answers a version 2 MAILBOX_SEND with
        STORED 300 naming the journal error, logs it, and goes on serving:
        PING gets PONG and a stream still delivers live. Once space is freed
        a MAILBOX_SEND gets STORED 200 again, and the recipient gets exactly
        the letters stored with 200, none of those refused.
        """
        self.assertEqual(self.post("before", b"b").status_code, mlm.SUCCESS)
        refusal = self.fill_until_refused()
        self.assertEqual((refusal.status_code, refusal.id), (mlm.FAILED, 0), str(refusal))
        self.assertIn("journal", refusal.status_reason, str(refusal))
        self.assertIn("full", refusal.status_reason, str(refusal))

        # Still serving.
        self.assertEqual(self.tx.command(mlm.ConnectionPing()), mlm.ConnectionPong())
        writer = self.peer(self.broker)
        reader = self.peer(self.broker)
        self.assertEqual(writer.command(mlm.ConnectionOpen()), mlm.Ok())
        self.assertEqual(writer.command(mlm.StreamWrite("ticks")), mlm.Ok())
        self.assertEqual(reader.command(mlm.ConnectionOpen()), mlm.Ok())
        self.assertEqual(reader.command(mlm.StreamRead("ticks", "")), mlm.Ok())
        writer.send(mlm.StreamSend("tick-1", [b"live"]))
        self.assertEqual(reader.receive(5.0), mlm.StreamDeliver("ticks", "", "tick-1", [b"live"]))
        self.assertTrue(self.broker.alive(), self.broker.log_text())
        log = self.broker.log_text(tail=1_000_000)
        self.assertIn("journal write failed", log)
        self.assertIn("not journaled", log)

        # Space again: stored and delivered. The first batch after freeing may still fail.
        self.free_space()
        deadline = monotonic() + 2.0
        after = None
        for attempt in itertools.count():
            if self.post(f"after-{attempt}", b"a").status_code == mlm.SUCCESS:
                after = f"after-{attempt}"
                break
            if monotonic() > deadline:
                self.fail(f"no STORED 200 within 2s of freeing space\n{self.broker.log_text()}")
            sleep(0.1)

        inbox = self.peer(self.broker)
        self.assertEqual(inbox.command(mlm.ConnectionOpen(version=2, address="inbox")), mlm.Ok())
        self.assertEqual(self.receive_mail(inbox), self.stored, self.broker.log_text())
        self.assertIn(after, self.stored)

    def test_refusedLetterNeverLostNorInvented(self) -> None:
        """
        With the recipient online while the disk fills (docs/protocol.md,
        "Durable mailboxes and service queues"): every letter acknowledged
        with STORED 200 reaches it, and it gets nothing the sender was not
        answered for; a letter refused with 300 after it was handed over may
        arrive too (the sender's retry would duplicate it, never lose it).
        """
        inbox = self.peer(self.broker)
        self.assertEqual(inbox.command(mlm.ConnectionOpen(version=2, address="inbox")), mlm.Ok())
        self.assertEqual(self.post("before", b"b").status_code, mlm.SUCCESS)
        refusal = self.fill_until_refused()
        self.assertEqual(refusal.status_code, mlm.FAILED, str(refusal))
        self.assertIn("disk is full", refusal.status_reason)
        got = self.receive_mail(inbox)
        self.free_space()
        self.assertTrue(set(self.stored) <= set(got), f"refused: {refusal}")
        self.assertTrue(set(got) <= set(self.stored) | set(self.refused), got)
