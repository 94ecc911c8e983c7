"""
Slow system tests of the broker's memory bounds, with the broker as a real
process (L{malamute_pack.testing.brokerprocess}) and its resident memory read
with psutil while careless clients push at it:

- a stream reader that never drains its socket (journal on and off);
- a producer flooding a stream nobody reads as fast as it can;
- 400 letters of 1 MiB to 400 different addresses nobody has opened.

In each, the broker's resident memory grows by less than L{RSS_BOUND}, and
a bystander's PINGs and letters are answered throughout (within a
generous liveness bound, not a benchmark). The figures are printed for the
record. Skipped with C{MALAMUTE_SKIP_SLOW=1}.

Tests: this is a test module; its helpers are ``tests/system_support.py``
and the broker process of L{malamute_pack.testing.brokerprocess}.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import zmq
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess
from tests.support import skip_slow
from tests.system_support import Peer

MIB = 1024 * 1024
# What the broker may grow by in any of these runs: its queues' bounds
# (journal backlog 32 MiB, letters 48 MiB, 4000 messages per peer) and
# Python's own overhead on top of them.
RSS_BOUND = 100 * MIB
# A bystander's PING must be answered within this (liveness, not speed).
LIVENESS_S = 5.0
FLOOD_S = 6.0


class RssWatch:
    """Samples a process's resident memory every 50 ms in a thread; keeps the peak."""

    def __init__(self, pid: int) -> None:
        self._process = psutil.Process(pid)
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, self._process.memory_info().rss)
            except psutil.Error:
                return

    def stop(self) -> int:
        """Stop sampling; the peak growth over the baseline, in bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak - self.baseline


class Bystander:
    """A well-behaved client: PINGs and mails itself, timing each answer."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.peer = Peer(context, endpoint)
        reply = self.peer.command(mlm.ConnectionOpen(version=2, address="bystander"))
        assert reply == mlm.Ok(), reply
        self.slowest = 0.0
        self.rounds = 0

    def round(self) -> None:
        """One PING and one letter to itself, each answered within L{LIVENESS_S}."""
        started = time.monotonic()
        self.peer.send(mlm.ConnectionPing())
        self.peer.expect(mlm.ConnectionPong, LIVENESS_S)
        self.peer.send(mlm.MailboxSend("bystander", "hello", "", 0, [b"hi"]))
        # Its own letter may reach it before the STORED that acknowledges it.
        got: dict[type[mlm.Message], mlm.Message] = {}
        while len(got) < 2:
            message = self.peer.receive(LIVENESS_S)
            assert message is not None, f"no answer within {LIVENESS_S}s; got {got}"
            got[type(message)] = message
        stored, record = got[mlm.Stored], got[mlm.MailboxRecord]
        assert isinstance(stored, mlm.Stored) and stored.status_code == mlm.SUCCESS, stored
        assert isinstance(record, mlm.MailboxRecord)
        self.peer.send(mlm.Done(record.id, mlm.SUCCESS, ""))
        self.slowest = max(self.slowest, time.monotonic() - started)
        self.rounds += 1


class MemoryCase(SynchronousTestCase):
    skip = skip_slow

    def start(self, *, journal: bool = True) -> BrokerProcess:
        broker = BrokerProcess(Path(self.mktemp()), journal=journal)
        broker.start()
        self.addCleanup(broker.stop)  # a clean shutdown after the abuse is part of the test
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.addCleanup(self.context.term)
        return broker

    def peer(self, broker: BrokerProcess, address: str, *, receive_queue: int = 100_000) -> Peer:
        peer = Peer(self.context, broker.endpoint)
        peer.socket.setsockopt(zmq.RCVHWM, receive_queue)
        self.addCleanup(peer.close)
        reply = peer.command(mlm.ConnectionOpen(version=2, address=address))
        self.assertEqual(reply, mlm.Ok())
        return peer

    def flood(self, broker: BrokerProcess, stream: str, size: int) -> tuple[int, int, float]:
        """
        Send stream messages of C{size} bytes as fast as the broker takes
        them for L{FLOOD_S} seconds, with a bystander's round every 200 ms.
        Returns (messages sent, peak RSS growth, the bystander's slowest round).
        """
        producer = self.peer(broker, f"producer-{stream}")
        producer.send(mlm.StreamWrite(stream))
        bystander = Bystander(self.context, broker.endpoint)
        self.addCleanup(bystander.peer.close)
        frames = mlm.encode(mlm.StreamSend("flood", [b"x" * size]))
        watch = RssWatch(broker.pid)
        sent = 0
        end = time.monotonic() + FLOOD_S
        next_round = time.monotonic()
        try:
            while (now := time.monotonic()) < end:
                if now >= next_round:
                    bystander.round()
                    next_round = time.monotonic() + 0.2
                for _ in range(100):
                    try:
                        producer.socket.send_multipart(frames, zmq.NOBLOCK)
                    except zmq.Again:
                        producer.socket.poll(10, zmq.POLLOUT)
                        break
                    sent += 1
        finally:
            grown = watch.stop()
        bystander.round()
        self.assertTrue(broker.alive(), broker.log_text())
        return sent, grown, bystander.slowest

    def report(self, what: str, sent: int, grown: int, slowest: float) -> None:
        print(
            f"\n{what}: {sent} messages sent, peak RSS growth {grown / MIB:.1f} MiB, "
            f"bystander's slowest round {slowest * 1000:.0f} ms"
        )


class StalledReaderTests(MemoryCase):
    def stalled_reader(self, journal: bool) -> None:
        broker = self.start(journal=journal)
        reader = self.peer(broker, "reader", receive_queue=10)
        reader.send(mlm.StreamRead("ticks", ""))
        self.assertIsInstance(reader.expect(mlm.Ok), mlm.Ok)
        sent, grown, slowest = self.flood(broker, "ticks", 4096)
        self.report(f"stalled reader, journal {'on' if journal else 'off'}", sent, grown, slowest)
        self.assertLess(grown, RSS_BOUND)
        self.assertGreater(sent, 10_000)  # the flood was one: far past every queue

    def test_journalOn(self) -> None:
        """
        A reader that never reads while 4 KiB messages pour into its stream
        costs the broker a bounded amount of memory (its deliveries wait in
        the journal); everyone else is answered throughout.
        """
        self.stalled_reader(journal=True)

    def test_journalOff(self) -> None:
        """
        The same without a journal: the reader misses what it cannot take
        (a gap), the broker does not hold it.
        """
        self.stalled_reader(journal=False)


class UnreadStreamTests(MemoryCase):
    def test_floodWithJournal(self) -> None:
        """
        A producer flooding 4 KiB messages to a stream nobody reads is held
        back by the journal's backlog bound (the broker stops reading while
        the journal catches up) instead of growing the broker; a bystander
        is answered throughout.
        """
        broker = self.start()
        sent, grown, slowest = self.flood(broker, "unread", 4096)
        self.report("flood to an unread stream, journal on", sent, grown, slowest)
        self.assertLess(grown, RSS_BOUND)
        self.assertGreater(sent, 10_000)


class LetterBudgetTests(MemoryCase):
    def test_bigLettersToManyAddresses(self) -> None:
        """
        400 letters of 1 MiB to 400 addresses nobody opened: the broker
        accepts them until its letter budget is spent and refuses the rest
        with STORED 300 "memory full ... retry later", never holding more;
        a bystander is answered throughout; the accepted letters are all
        delivered once their addresses open.
        """
        broker = self.start()
        sender = self.peer(broker, "sender")
        bystander = Bystander(self.context, broker.endpoint)
        self.addCleanup(bystander.peer.close)
        watch = RssWatch(broker.pid)
        accepted: list[str] = []
        refusals: list[str] = []
        try:
            for n in range(400):
                address = f"offline-{n}"
                sender.send(mlm.MailboxSend(address, "big", "", 0, [b"m" * MIB]))
                stored = sender.expect(mlm.Stored, LIVENESS_S)
                assert isinstance(stored, mlm.Stored)
                if stored.status_code == mlm.SUCCESS:
                    accepted.append(address)
                else:
                    refusals.append(stored.status_reason)
                if n % 20 == 0:
                    bystander.round()
        finally:
            grown = watch.stop()
        self.report("400 letters of 1 MiB", 400, grown, bystander.slowest)
        print(f"accepted {len(accepted)}, refused {len(refusals)}")
        self.assertLess(grown, RSS_BOUND)
        self.assertTrue(accepted and refusals, (len(accepted), len(refusals)))
        self.assertEqual(accepted, [f"offline-{n}" for n in range(len(accepted))])
        self.assertIn("memory full", refusals[0])
        self.assertIn("retry later", refusals[0])
        for address in accepted[:5] + accepted[-5:]:
            inbox = self.peer(broker, address)
            record = inbox.expect(mlm.MailboxRecord)
            assert isinstance(record, mlm.MailboxRecord)
            self.assertEqual(record.content, [b"m" * MIB])
