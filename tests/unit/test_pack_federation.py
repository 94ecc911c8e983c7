"""
Tests for L{malamute_pack.pack.federation}, L{malamute_pack.pack.peer_broker}
and L{malamute_pack.pack.sessions}: several broker models, each with a real
journal and its L{Pack}, wired by an in-memory network that carries the
whispers between them in order (no ZRE, no sockets), with MLM clients on
each broker driven through the real session table.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.access import AccessControl
from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig
from malamute_pack.pack.federation import HEADER_PROTOCOL, PROTOCOL, Pack
from malamute_pack.pack.peer_broker import MAX_ASKS, REWIND_DELAY
from malamute_pack.protocol import mlm, packlink
from malamute_pack.protocol.records import StreamRecord
from tests.broker_support import BrokerHarness
from tests.support import fill_disk, mount_tmpfs


@dataclass
class Peer:
    """What a ZRE node tells the pack of a peer (the L{ZrePeerInfo} interface)."""

    uuid: bytes
    name: str
    headers: dict[str, str] = field(default_factory=lambda: {HEADER_PROTOCOL: PROTOCOL})


class Network:
    """
    Brokers with their packs, and the whispers in flight between them,
    delivered in order by L{run}.
    """

    def __init__(
        self,
        base: Path,
        names: list[str],
        journal: bool = True,
        owners: bool = False,
        limits: Limits | None = None,
    ) -> None:
        """
        @param owners: the brokers' clients authenticate (each broker has
            access control) and the packs tell each other the owners of
            addresses, as a CURVE pack's brokers do.
        @param limits: every broker's limits (the defaults if None).
        """
        self._limits = limits or Limits()
        self.harnesses: dict[str, BrokerHarness] = {}
        self._owners = owners
        self.packs: dict[str, Pack] = {}
        self.peers: dict[str, Peer] = {}
        self.in_flight: deque[tuple[str, str, list[bytes]]] = deque()
        # (from, to) pairs whose link is full: whispers are refused.
        self.full: set[tuple[str, str]] = set()
        self.sent: list[tuple[str, str, packlink.LinkMessage]] = []
        self._base = base
        self._journal = journal
        base.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(names):
            self.peers[name] = Peer(bytes([i + 1]) * 16, name)
            self._start(name)

    def _start(self, name: str, later: float = 0.0) -> None:
        """
        Start broker C{name} and its pack, on its journal file if it has
        one, its clock C{later} seconds on.
        """
        harness = BrokerHarness(
            BrokerConfig(timeout=60.0, limits=self._limits),
            self._base / f"{name}.sqlite" if self._journal else None,
            JournalConfig(prune_interval_s=3600),
        )
        harness.clock.advance(later)
        self.harnesses[name] = harness
        marks = harness.journal.origin_marks() if harness.journal is not None else {}
        since = harness.journal.newest_times() if harness.journal is not None else {}
        owners = None
        if self._owners:
            harness.broker.access = AccessControl(harness.clock)
            owners = harness.broker.access.owners
        pack = Pack(
            harness.broker,
            harness.clock,
            "pack",
            self.peers[name].uuid.hex().upper(),
            self._whisperer(name),
            marks,
            owners=owners,
            since=since,
        )
        pack.start()
        self.packs[name] = pack

    def restart(self, name: str) -> None:
        """
        Broker C{name} stops (what is in flight to or from it is lost, the
        others see it exit) and starts again on its journal, alone.
        """
        for other in self.packs:
            if other != name:
                self.part(name, other)
        self.packs[name].stop()
        self.harnesses[name].close()
        self._start(name)

    def start_afresh(self, name: str, later: float) -> None:
        """
        Broker C{name} stops and starts again alone on a new journal (its
        files removed), with a new identity, its clock C{later} seconds on.
        """
        for other in self.packs:
            if other != name:
                self.part(name, other)
        self.packs[name].stop()
        self.harnesses[name].close()
        for file in self._base.glob(f"{name}.sqlite*"):
            file.unlink()
        old = self.peers[name]
        self.peers[name] = Peer(bytes([old.uuid[0] + 100]) * 16, name)
        self._start(name, later)

    def _whisperer(self, sender: str):  # type: ignore[no-untyped-def]
        def whisper(uuid: bytes, frames: object) -> bool:
            to = next(n for n, p in self.peers.items() if p.uuid == uuid)
            if (sender, to) in self.full:
                return False
            self.in_flight.append((sender, to, list(frames)))  # type: ignore[call-overload]
            return True

        return whisper

    def join(self, a: str, b: str) -> None:
        """A and B see each other join the pack."""
        self.packs[a].peer_joined(self.peers[b], "pack")
        self.packs[b].peer_joined(self.peers[a], "pack")
        self.run()

    def mesh(self) -> None:
        names = list(self.packs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                self.join(a, b)

    def part(self, a: str, b: str) -> None:
        """A and B lose each other (EXIT); what was in flight between them is lost."""
        self.packs[a].peer_exited(self.peers[b])
        self.packs[b].peer_exited(self.peers[a])
        self.in_flight = deque(m for m in self.in_flight if {m[0], m[1]} != {a, b})

    def run(self) -> None:
        """Deliver everything in flight, letting journals settle, until all is quiet."""
        for _ in range(10_000):
            for harness in self.harnesses.values():
                harness.settle()
                harness.clock.advance(0)
            if not self.in_flight:
                for harness in self.harnesses.values():
                    harness.clock.advance(0.06)  # retries of outboxes and stalls
                    harness.settle()
                if not self.in_flight:
                    return
            while self.in_flight:
                sender, to, frames = self.in_flight.popleft()
                self.sent.append((sender, to, packlink.decode(frames)))
                self.packs[to].whispered(self.peers[sender], frames)
        raise AssertionError("the network never went quiet")

    def deliver_now(self) -> None:
        """Deliver what is in flight, and what that sends, with no time passing."""
        while self.in_flight:
            for harness in self.harnesses.values():
                harness.settle()
            sender, to, frames = self.in_flight.popleft()
            self.sent.append((sender, to, packlink.decode(frames)))
            self.packs[to].whispered(self.peers[sender], frames)

    def forwarded(self, sender: str, to: str) -> list[packlink.Forward]:
        return [
            m
            for s, t, m in self.sent
            if s == sender and t == to and isinstance(m, packlink.Forward)
        ]

    def close(self) -> None:
        for pack in self.packs.values():
            pack.stop()
        for harness in self.harnesses.values():
            harness.close()


W, R, R2 = b"writer", b"reader", b"reader2"


def subjects(messages: list[mlm.Message]) -> list[str]:
    return [
        m.subject
        for m in messages
        if isinstance(
            m,
            mlm.StreamDeliver
            | mlm.StreamRecord
            | mlm.MailboxDeliver
            | mlm.MailboxRecord
            | mlm.ServiceDeliver
            | mlm.ServiceRecord,
        )
    ]


class PackTestCase(SynchronousTestCase):
    names: ClassVar[list[str]] = ["a", "b", "c"]
    journal = True
    limits = Limits()

    def setUp(self) -> None:
        self.net = Network(Path(self.mktemp()), self.names, self.journal, limits=self.limits)
        self.addCleanup(self.net.close)
        self.net.mesh()

    def h(self, name: str) -> BrokerHarness:
        return self.net.harnesses[name]

    def write(self, broker: str, stream: str, *subjects: str) -> None:
        h = self.h(broker)
        if not h.connected(W):
            h.open(W, "writer")
            self.assertEqual(h.command(W, mlm.StreamWrite(stream)), [mlm.Ok()])
        for subject in subjects:
            h.send(W, mlm.StreamSend(subject, [subject.encode()]))
        self.net.run()

    def read(self, broker: str, route: bytes, stream: str, pattern: str, version: int = 1) -> None:
        h = self.h(broker)
        if not h.connected(route):
            h.open(route, route.decode(), version=version)
        self.assertEqual(h.command(route, mlm.StreamRead(stream, pattern)), [mlm.Ok()])
        self.net.run()

    def got(self, broker: str, route: bytes) -> list[str]:
        return subjects(self.h(broker).take(route))


class StreamTests(PackTestCase):
    def test_recordReachesMatchingReadersOnEveryHostOnce(self) -> None:
        """A record written on A reaches a matching reader on B and one on C, once each."""
        self.read("b", R, "s", "x.*")
        self.read("c", R, "s", "x.*")
        self.write("a", "s", "x.1", "x.2")
        self.assertEqual(self.got("b", R), ["x.1", "x.2"])
        self.assertEqual(self.got("c", R), ["x.1", "x.2"])

    def test_interestOnly(self) -> None:
        """A record no reader of a host matches never crosses to that host."""
        self.read("b", R, "s", "x.*")
        self.write("a", "s", "y.1", "x.1", "y.2")
        self.assertEqual([f.subject for f in self.net.forwarded("a", "b")], ["x.1"])
        self.assertEqual(self.net.forwarded("a", "c"), [])

    def test_oneHop(self) -> None:
        """A record forwarded to B is delivered there and never sent on to C."""
        self.read("b", R, "s", "")
        self.read("c", R, "s", "")
        self.write("a", "s", "m")
        self.assertEqual(self.net.forwarded("b", "c"), [])
        self.assertEqual(self.net.forwarded("c", "b"), [])
        self.assertEqual(self.got("b", R), ["m"])
        self.assertEqual(self.got("c", R), ["m"])

    def test_lastReaderGoneStopsForwarding(self) -> None:
        """When the last reader of a pattern on B cancels, records stop crossing to B."""
        self.read("b", R, "s", "")
        self.h("b").command(R, mlm.StreamCancel("s"))
        self.net.run()
        self.write("a", "s", "m")
        self.assertEqual(self.net.forwarded("a", "b"), [])

    def test_positionsAreLocal(self) -> None:
        """A version 2 reader on B gets B's own sequence numbers, in B's order."""
        self.read("b", R, "s", "", version=2)
        self.write("b", "s", "local")
        self.write("a", "s", "remote")
        self.h("b").take(R)
        self.read("b", R2, "s", "", version=2)
        self.h("b").send(R2, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        self.net.run()
        got = [
            (m.sequence, m.subject) for m in self.h("b").take(R2) if isinstance(m, mlm.StreamRecord)
        ]
        self.assertEqual(got, [(1, "local"), (2, "remote")])

    def test_slowRemoteReaderCatchesUpWithoutGap(self) -> None:
        """A reader on B out of credit gets A's records from B's journal when it grants more."""
        self.read("b", R, "s", "", version=2)
        self.h("b").send(R, mlm.Credit(2))
        self.write("a", "s", *[f"m{i}" for i in range(6)])
        self.assertEqual(self.got("b", R), ["m0", "m1"])
        self.h("b").send(R, mlm.Credit(10))
        self.net.run()
        self.assertEqual(self.got("b", R), ["m2", "m3", "m4", "m5"])

    def test_backAfterDowntimeAsksSinceItLastTookPart(self) -> None:
        """
        B, which never took a record from A, restarts and is apart while A
        writes; when they meet again B asks A for what it wrote since B's
        newest record (less the clocks' skew), not from now on: B's reader
        gets what A wrote meanwhile, and nothing older.
        """
        self.write("a", "s", "old")
        for name in ("a", "b"):
            self.h(name).clock.advance(100.0)
        self.h("b").open(W, "writer")
        self.h("b").command(W, mlm.StreamWrite("s"))
        self.h("b").send(W, mlm.StreamSend("mine", [b"x"]))
        self.net.run()
        self.net.restart("b")
        self.net.part("b", "c")
        self.read("b", R, "s", "")
        self.h("a").clock.advance(1.0)
        self.write("a", "s", "meanwhile")
        self.net.join("a", "b")
        self.assertEqual(self.got("b", R), ["meanwhile"])

    def test_lateJoinerReplaysHistoryFromPeers(self) -> None:
        """A reader on B reading from the earliest gets what A wrote before, then live."""
        self.write("a", "s", "old1", "old2")
        self.read("b", R2, "other", "")  # opens the connection
        self.h("b").open(R, "late", version=2)
        self.h("b").send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        self.net.run()
        self.assertEqual(self.got("b", R), ["old1", "old2"])
        self.write("a", "s", "new")
        self.assertEqual(self.got("b", R), ["new"])

    def test_historyNotForLiveReaders(self) -> None:
        """History replayed from A for a late joiner on B does not reach B's live readers."""
        self.write("a", "s", "old")
        self.read("b", R2, "s", "")
        self.h("b").open(R, "late", version=2)
        self.h("b").send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        self.net.run()
        self.assertEqual(self.got("b", R), ["old"])
        self.assertEqual(self.got("b", R2), [])

    def test_liveDuringHistoryReachesLiveReaders(self) -> None:
        """
        Records written on A while it replays history to B are live for B's
        readers from the latest: they get them; the history reader gets all.
        """
        self.write("a", "s", "old")
        self.read("b", R2, "s", "")
        self.h("b").open(R, "late", version=2)
        self.h("b").send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        # A takes the history request, and is replaying when more is written.
        while self.net.in_flight:
            sender, to, frames = self.net.in_flight.popleft()
            self.net.packs[to].whispered(self.net.peers[sender], frames)
        self.h("a").send(W, mlm.StreamSend("new", [b"x"]))
        self.net.run()
        self.assertEqual(self.got("b", R), ["old", "new"])
        self.assertEqual(self.got("b", R2), ["new"])

    def test_resumeAfterPartition(self) -> None:
        """Records written on A while B was apart reach B's reader once they meet again."""
        self.read("b", R, "s", "")
        self.write("a", "s", "before")
        self.net.part("a", "b")
        self.write("a", "s", "apart1", "apart2")
        self.net.join("a", "b")
        self.write("a", "s", "after")
        self.assertEqual(self.got("b", R), ["before", "apart1", "apart2", "after"])

    def test_duplicateForwardDropped(self) -> None:
        """A record B already has from A (same origin sequence) is dropped, not delivered again."""
        self.read("b", R, "s", "")
        self.write("a", "s", "m")
        first = self.net.forwarded("a", "b")[0]
        self.net.packs["b"].whispered(self.net.peers["a"], packlink.encode(first))
        self.net.run()
        self.assertEqual(self.got("b", R), ["m"])
        self.assertEqual(self.net.packs["b"].peers[self.net.peers["a"].uuid].counters.duplicates, 1)

    def test_fullLinkFallsBehindThenCatchesUp(self) -> None:
        """While A's link to B is full, records wait in A's journal; none is lost or doubled."""
        self.read("b", R, "s", "")
        self.net.full.add(("a", "b"))
        self.write("a", "s", "m1", "m2", "m3")
        self.assertEqual(self.got("b", R), [])
        self.net.full.clear()
        self.net.run()
        self.assertEqual(self.got("b", R), ["m1", "m2", "m3"])


class MailboxTests(PackTestCase):
    def test_letterToAddressOnAnotherHost(self) -> None:
        """A letter sent on A to a client connected on B is delivered on B and leaves A."""
        self.h("b").open(R, "bob")
        self.net.run()
        self.h("a").open(W, "alice", version=2)
        self.h("a").send(W, mlm.MailboxSend("bob", "hi", "", 0, [b"body"]))
        self.net.run()
        self.assertEqual(self.got("b", R), ["hi"])
        stored = [m for m in self.h("a").take(W) if isinstance(m, mlm.Stored)]
        self.assertEqual([s.status_code for s in stored], [200])
        self.assertEqual(self.h("a").broker.post.letter_bytes, 0)

    def test_letterFollowsAddressThatConnectsLater(self) -> None:
        """A letter for an address connected nowhere waits on A, then goes to C when it opens."""
        self.h("a").open(W, "alice")
        self.h("a").send(W, mlm.MailboxSend("carol", "later", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(len(self.h("a").broker.post.mailbox("carol")), 1)
        self.assertEqual(self.h("c").open(R, "carol"), [])
        self.net.run()
        self.assertEqual(self.got("c", R), ["later"])
        self.assertEqual(len(self.h("a").broker.post.mailbox("carol")), 0)

    def test_storedLetterKnownAfterRestart(self) -> None:
        """
        A letter B stored for A, whose answer A never got before B restarted,
        is known when A hands it over again: stored once, delivered once.
        """
        self.h("b").open(R, "bob")
        self.h("a").open(W, "alice")
        self.net.run()
        self.net.full.add(("b", "a"))  # nothing B says reaches A
        self.h("b").send(R, mlm.ConnectionClose())  # bob leaves; A does not hear it
        self.h("a").send(W, mlm.MailboxSend("bob", "once", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(len(self.h("b").broker.post.mailbox("bob")), 1)
        self.net.restart("b")
        self.net.full.clear()
        self.net.join("a", "b")
        self.net.join("b", "c")
        self.assertEqual(len(self.h("b").broker.post.mailbox("bob")), 1)
        self.assertEqual(
            self.h("b").open(R, "bob"), [mlm.MailboxDeliver("alice", "bob", "once", "", [b"x"])]
        )
        self.net.run()
        self.assertEqual(self.got("b", R), [])
        self.assertEqual(len(self.h("a").broker.post.mailbox("bob")), 0)

    def test_localClientTakesAddressBack(self) -> None:
        """A client opening an address locally gets the letters that would have crossed."""
        self.h("b").open(R, "bob")
        self.net.run()
        self.h("b").send(R, mlm.ConnectionClose())
        self.net.run()
        self.h("a").open(R2, "bob")
        self.h("a").open(W, "alice")
        self.h("a").send(W, mlm.MailboxSend("bob", "here", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(self.got("a", R2), ["here"])

    def test_confirmReachesSenderOnAnotherHost(self) -> None:
        """A recipient's CONFIRM of a tracked letter reaches its sender on the other host."""
        self.h("b").open(R, "bob")
        self.h("a").open(W, "alice")
        self.net.run()
        self.h("a").send(W, mlm.MailboxSend("bob", "hi", "t1", 0, [b"x"]))
        self.net.run()
        self.h("b").take(R)
        self.h("b").send(R, mlm.Confirm("t1", 200, "ok"))
        self.net.run()
        confirms = [m for m in self.h("a").take(W) if isinstance(m, mlm.Confirm)]
        self.assertEqual([(c.tracker, c.status_code) for c in confirms], [("t1", 200)])

    def test_lostStoreAnswerDoesNotDuplicate(self) -> None:
        """A letter handed to B again (A never heard B stored it) is not stored twice on B."""
        self.h("b").open(R, "bob")
        self.net.run()
        self.net.full.add(("b", "a"))  # B's answers cannot reach A
        self.h("a").open(W, "alice")
        self.h("a").send(W, mlm.MailboxSend("bob", "once", "", 0, [b"x"]))
        self.net.run()
        self.net.part("a", "b")
        self.net.full.clear()
        self.net.join("a", "b")
        self.assertEqual(self.got("b", R), ["once"])


class RefusedLetterTests(PackTestCase):
    limits = Limits(mailbox_max_messages=1)

    def test_letterRefusedThenHandedOverAgainIsTaken(self) -> None:
        """
        A letter B refused (its mailbox was full: retry later), handed over
        again by A once B can take it, is stored and delivered on B, not
        answered "stored" as one B already had (found by the soak: a pair
        that refused relayed letters for a journal error answered their
        retries "stored" and never had them).
        """
        self.h("b").open(R, "bob")
        self.net.run()
        self.h("b").full.add(R)  # bob takes nothing for now
        self.h("a").open(W, "alice", version=2)
        self.h("a").send(W, mlm.MailboxSend("bob", "one", "", 0, [b"1"]))
        self.net.run()
        self.h("a").send(W, mlm.MailboxSend("bob", "two", "", 0, [b"2"]))
        self.net.deliver_now()
        refusals = [m for _, _, m in self.net.sent if isinstance(m, packlink.Answer)]
        self.assertEqual([a.code for a in refusals], [200, 300])
        self.assertEqual(len(self.h("a").broker.post.mailbox("bob")), 1)  # taken back
        self.h("b").full.clear()
        self.net.run()  # both brokers try again what stalled
        self.assertEqual(self.got("b", R), ["one", "two"])
        self.assertEqual(len(self.h("a").broker.post.mailbox("bob")), 0)
        self.assertEqual(len(self.h("b").broker.post.mailbox("bob")), 0)


class ServiceTests(PackTestCase):
    def offer(self, broker: str, route: bytes, service: str = "echo") -> None:
        h = self.h(broker)
        h.open(route, route.decode())
        self.assertEqual(h.command(route, mlm.ServiceOffer(service, "")), [mlm.Ok()])
        self.net.run()

    def test_requestServedOnAnotherHost(self) -> None:
        """A request on A with no local worker is served by B's worker; the reply comes back."""
        self.offer("b", b"worker")
        self.h("a").open(W, "client")
        self.net.run()
        self.h("a").send(W, mlm.ServiceSend("echo", "ping", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(self.got("b", b"worker"), ["ping"])
        self.h("b").send(b"worker", mlm.MailboxSend("client", "pong", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(self.got("a", W), ["pong"])

    def test_localWorkerFirst(self) -> None:
        """A request goes to a local worker when one can take it."""
        self.offer("b", b"remote")
        self.offer("a", b"local")
        self.h("a").open(W, "client")
        for i in range(3):
            self.h("a").send(W, mlm.ServiceSend("echo", f"r{i}", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(self.got("a", b"local"), ["r0", "r1", "r2"])
        self.assertEqual(self.got("b", b"remote"), [])

    def test_requestOnLostPeerRedispatched(self) -> None:
        """A request held for a v2 worker on B goes to C's worker when B is lost."""
        h = self.h("b")
        h.open(b"worker", "worker", version=2)
        h.command(b"worker", mlm.ServiceOffer("echo", ""))
        self.net.run()
        self.h("a").open(W, "client")
        self.h("a").send(W, mlm.ServiceSend("echo", "job", "", 0, [b"x"]))
        self.net.run()
        self.assertEqual(self.got("b", b"worker"), ["job"])
        self.net.part("a", "b")
        self.net.part("b", "c")
        self.offer("c", b"worker")
        self.assertEqual(self.got("c", b"worker"), ["job"])

    def test_requestForGoneWorkersComesBack(self) -> None:
        """
        A request that reaches B after B's last worker left is refused by B
        and goes to C's worker instead, once: not left waiting on B.
        """
        self.offer("b", b"worker")
        self.offer("c", b"worker")
        self.h("a").open(W, "client")
        self.net.run()
        # B's worker leaves; A hears of it only after the request is on its way.
        self.net.full.add(("b", "a"))
        self.h("b").send(b"worker", mlm.ConnectionClose())
        self.h("a").send(W, mlm.ServiceSend("echo", "job", "", 0, [b"x"]))
        self.h("a").send(W, mlm.ServiceSend("echo", "job2", "", 0, [b"x"]))
        self.net.run()
        self.net.full.clear()
        self.net.run()
        self.assertEqual(sorted(self.got("c", b"worker")), ["job", "job2"])
        self.assertEqual(len(self.h("b").broker.post.service("echo").queue), 0)

    def test_doneLostInPartitionAnsweredAgain(self) -> None:
        """
        A request B finished while apart from A (its DONE lost) and that A
        hands over again after they meet is answered DONE at once, not run
        again; the requests queued behind it then flow.
        """
        h = self.h("b")
        h.open(b"worker", "worker", version=2)
        h.command(b"worker", mlm.ServiceOffer("echo", ""))
        self.net.run()
        self.h("a").open(W, "client", version=2)
        self.h("a").send(W, mlm.ServiceSend("echo", "held", "", 0, [b"x"]))
        self.h("a").send(W, mlm.ServiceSend("echo", "queued", "", 0, [b"x"]))
        self.net.run()
        record = next(m for m in h.take(b"worker") if isinstance(m, mlm.ServiceRecord))
        self.net.full.add(("b", "a"))  # B's answers are lost
        h.send(b"worker", mlm.Done(record.id))
        self.net.run()
        self.net.part("a", "b")
        self.net.full.clear()
        self.net.join("a", "b")
        self.assertEqual(self.got("b", b"worker"), ["queued"])

    def test_requestFinishedOnPeerLeavesOrigin(self) -> None:
        """When B's v2 worker answers DONE, A forgets the request (nothing held, no bytes)."""
        h = self.h("b")
        h.open(b"worker", "worker", version=2)
        h.command(b"worker", mlm.ServiceOffer("echo", ""))
        self.net.run()
        self.h("a").open(W, "client")
        self.h("a").send(W, mlm.ServiceSend("echo", "job", "", 0, [b"x"]))
        self.net.run()
        record = next(m for m in h.take(b"worker") if isinstance(m, mlm.ServiceRecord))
        h.send(b"worker", mlm.Done(record.id))
        self.net.run()
        self.assertEqual(self.h("a").broker.post.letter_bytes, 0)


class PeersByOriginTests(PackTestCase):
    """The pack's peer brokers by origin id (L{Pack.by_origin}), kept in step with L{Pack.peers}."""

    def origin(self, name: str) -> str:
        return self.net.peers[name].uuid.hex().upper()

    def assertInStep(self, pack: Pack) -> None:
        """C{pack.by_origin} holds exactly the peers of C{pack.peers}, each under its origin."""
        self.assertEqual(pack.by_origin, {p.origin: p for p in pack.peers.values()})

    def test_peersThatJoinAreFoundByOrigin(self) -> None:
        """The brokers that joined are found by their origin ids, as the same peer brokers."""
        pack = self.net.packs["a"]
        self.assertInStep(pack)
        self.assertEqual(set(pack.by_origin), {self.origin("b"), self.origin("c")})
        self.assertIs(pack.by_origin[self.origin("b")], pack.peers[self.net.peers["b"].uuid])

    def test_peerThatLeftIsNotFound(self) -> None:
        """A broker that left the pack is no longer found by its origin; the others still are."""
        pack = self.net.packs["a"]
        self.net.part("a", "b")
        self.assertInStep(pack)
        self.assertNotIn(self.origin("b"), pack.by_origin)
        self.assertIn(self.origin("c"), pack.by_origin)

    def test_peerBackUnderTheSameOrigin(self) -> None:
        """
        A broker that left and joined again (its origin id the same) is
        found as the new peer broker, not the one that left.
        """
        pack = self.net.packs["a"]
        gone = pack.by_origin[self.origin("b")]
        self.net.part("a", "b")
        self.net.join("a", "b")
        self.assertInStep(pack)
        back = pack.by_origin[self.origin("b")]
        self.assertIsNot(back, gone)
        self.assertIs(back, pack.peers[self.net.peers["b"].uuid])

    def test_stoppedPackFindsNone(self) -> None:
        """A pack that stopped finds no peer by origin."""
        pack = self.net.packs["a"]
        pack.stop()
        self.assertEqual(pack.by_origin, {})


class MalformedTests(PackTestCase):
    names: ClassVar[list[str]] = ["a", "b"]

    def test_malformedWhisperCounted(self) -> None:
        """A whisper that is not a pack message is dropped and counted."""
        pack = self.net.packs["a"]
        pack.whispered(self.net.peers["b"], [b"\xaa\xa3\x63\x01"])
        pack.whispered(self.net.peers["b"], [b"garbage"])
        self.assertEqual(pack.counters.malformed, 2)

    def test_oversizedForwardRefused(self) -> None:
        """A FORWARD past the client limits (frames, bytes) is refused and counted, not written."""
        self.h("a").open(R, "reader")
        self.h("a").command(R, mlm.StreamRead("s", ""))
        pack = self.net.packs["a"]
        member = pack.peers[self.net.peers["b"].uuid]
        limits = self.h("a").broker.limits
        for content in ((b"x",) * limits.max_frames, (b"x" * (limits.max_message_bytes + 1),)):
            pack.whispered(
                self.net.peers["b"],
                packlink.encode(packlink.Forward("s", 1, 0, "w", "big", 0, content)),
            )
        self.assertEqual(member.counters.refused, 2)
        self.assertEqual(self.got("a", R), [])

    def test_strangerIgnored(self) -> None:
        """A whisper from a node not in the pack is ignored and counted."""
        pack = self.net.packs["a"]
        pack.whispered(Peer(b"\x09" * 16, "x"), packlink.encode(packlink.Sync("x")))
        self.assertEqual(pack.counters.strangers, 1)

    def test_otherProtocolVersionIgnored(self) -> None:
        """A broker speaking another inter-broker protocol version does not federate."""
        pack = self.net.packs["a"]
        pack.peer_joined(Peer(b"\x09" * 16, "x", {HEADER_PROTOCOL: "99"}), "pack")
        self.assertEqual(pack.counters.incompatible, 1)
        self.assertNotIn(b"\x09" * 16, pack.peers)


class OwnerTests(SynchronousTestCase):
    """A CURVE pack's brokers tell each other who owns which address."""

    def setUp(self) -> None:
        self.net = Network(Path(self.mktemp()), ["a", "b"], owners=True)
        self.addCleanup(self.net.close)

    def open_as(self, broker: str, route: bytes, address: str, user: str) -> list[mlm.Message]:
        """C{user} opens C{address} on C{broker}; what the broker answered."""
        h = self.net.harnesses[broker]
        h.sessions.receive(route, mlm.encode(mlm.ConnectionOpen(address=address)), user)
        return h.take(route)

    def test_claimTravels(self) -> None:
        """
        alice's claim of C{alice} on one broker reaches the other: there bob
        opening C{alice} gets ERROR 403, alice still may.
        """
        self.net.mesh()
        self.assertEqual(self.open_as("a", R, "alice", "alice"), [mlm.Ok()])
        self.net.run()
        (refusal,) = self.open_as("b", R2, "alice", "bob")
        assert isinstance(refusal, mlm.Error)
        self.assertEqual(refusal.status_code, 403)
        self.assertEqual(self.open_as("b", W, "alice", "alice"), [mlm.Ok()])
        self.assertEqual(self.net.packs["b"].counters.owners_learned, 1)

    def test_claimsMadeApartLearnedOnJoin(self) -> None:
        """Claims made before two brokers meet are exchanged when they join."""
        self.open_as("a", R, "alice", "alice")
        self.open_as("b", R2, "bob", "bob")
        self.net.mesh()
        owners = {n: self.net.harnesses[n].broker.access.owners for n in "ab"}  # type: ignore[union-attr]
        for name in "ab":
            self.assertEqual(
                (owners[name].owner("alice"), owners[name].owner("bob")), ("alice", "bob")
            )

    def test_conflictingClaimsConverge(self) -> None:
        """
        The same address claimed by two users on two brokers apart: once
        they meet, both keep the earlier claim, and the later claimant is
        refused on both.
        """
        self.net.harnesses["b"].clock.advance(5)
        self.open_as("a", R, "x", "alice")  # at 0
        self.open_as("b", R2, "x", "bob")  # at 5
        self.net.mesh()
        for name in "ab":
            owners = self.net.harnesses[name].broker.access.owners  # type: ignore[union-attr]
            self.assertEqual(owners.owner("x"), "alice", name)
        (refusal,) = self.open_as("b", W, "x", "bob")
        assert isinstance(refusal, mlm.Error)
        self.assertEqual(refusal.status_code, 403)

    def test_openPackBelievesNoClaim(self) -> None:
        """
        A broker of an open pack (no owners given to its pack) tells no
        claim and believes none: an OWNER from a peer is counted and ignored.
        """
        open_net = Network(Path(self.mktemp()), ["a", "b"])
        self.addCleanup(open_net.close)
        open_net.mesh()
        pack = open_net.packs["a"]
        pack.whispered(open_net.peers["b"], packlink.encode(packlink.Owner("alice", "mallory", 1)))
        self.assertEqual(pack.counters.owners_ignored, 1)
        self.assertFalse(any(isinstance(m, packlink.Owner) for _, _, m in open_net.sent))


# Values that reach the meaningful paths (known names, a bad pattern, big numbers).
_names = st.sampled_from(["s", "bob", "echo", "", "x" * 255, "é"])
_patterns = st.sampled_from(["", "x.*", "(", "prefix:x", "fields:a=1"])
_numbers = st.sampled_from([0, 1, 2, 3, 7, 255, 65535, 2**32 - 1, 2**63])
_contents = st.lists(st.binary(max_size=8), max_size=3).map(tuple)


def _value(name: str, kind: str) -> st.SearchStrategy[object]:
    if kind == "s":
        return _patterns if name == "pattern" else _names
    return _numbers.filter(lambda n: n < (1 << (8 * int(kind))))


@st.composite
def _link_messages(draw: st.DrawFn) -> packlink.LinkMessage:
    cls = draw(st.sampled_from(list(packlink.MESSAGE_TYPES.values())))
    values = {name: draw(_value(name, kind)) for name, kind in cls.LAYOUT}
    if cls.HAS_CONTENT:
        values["content"] = draw(_contents)
    message: packlink.LinkMessage = cls(**values)
    return message


class RoguePeerTests(SynchronousTestCase):
    @settings(max_examples=60, deadline=None)
    @given(st.lists(_link_messages(), max_size=25))
    def test_anyMessagesLeaveTheBrokerWorking(self, messages: list[packlink.LinkMessage]) -> None:
        """
        Whatever well-formed messages a pack member sends, in any order,
        nothing escapes the pack, and the broker still serves its clients.
        """
        net = Network(Path(self.mktemp()), ["a", "b"], journal=False)
        try:
            net.join("a", "b")
            pack, rogue = net.packs["a"], net.peers["b"]
            for message in messages:
                pack.whispered(rogue, packlink.encode(message))
            h = net.harnesses["a"]
            h.clock.advance(1.0)
            h.open(R, "reader")
            self.assertEqual(h.command(R, mlm.StreamRead("local", "")), [mlm.Ok()])
            h.open(W, "writer")
            self.assertEqual(h.command(W, mlm.StreamWrite("local")), [mlm.Ok()])
            h.send(W, mlm.StreamSend("still", [b"x"]))
            self.assertEqual(subjects(h.take(R)), ["still"])
        finally:
            net.close()


class ForwardFailureTests(SynchronousTestCase):
    """Records a peer forwarded that this broker could not write are asked for again."""

    def copy(self, harness: BrokerHarness) -> list[str]:
        """The subjects of stream C{s} in C{harness}'s journal, in order."""
        journal = harness.journal
        assert journal is not None
        read: list[list[StreamRecord]] = []
        journal.read_stream("s", 1, 100).addCallback(read.append)
        harness.clock.run_thread_calls(lambda: bool(read))
        return [r.subject for r in read[0]]

    def forwards_failed(self) -> tuple[Network, Path]:
        """
        A writes five records; B's disk (a small tmpfs) is full when A
        replays them to a reader on B, so B's writes of them fail. The
        network and the file that fills B's disk.
        """
        mount = Path(self.mktemp()).resolve()
        mount_tmpfs(self, mount, "2m")
        net = Network(mount / "net", ["a", "b"])
        self.addCleanup(net.close)
        net.mesh()
        a, b = net.harnesses["a"], net.harnesses["b"]
        a.open(W, "writer")
        a.command(W, mlm.StreamWrite("s"))
        for n in range(5):
            a.send(W, mlm.StreamSend(f"m{n}", [bytes(65536)]))
        net.run()
        filler = mount / "filler"
        fill_disk(filler)
        b.open(R, "late", version=2)
        b.send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        net.run()
        self.assertGreaterEqual(net.packs["b"].counters.forwards_failed, 1)
        return net, filler

    def test_notWrittenAskedForAgain(self) -> None:
        """
        B's disk is full when A replays its records to a reader on B: B's
        writes of them fail, so B takes them back (its mark for A returns)
        and, a second later, with space freed, asks A again: B's copy holds
        each once, in order. Before, B skipped them for good.
        """
        net, filler = self.forwards_failed()
        b = net.harnesses["b"]
        self.assertEqual(self.copy(b), [])
        filler.unlink()
        b.clock.advance(REWIND_DELAY)
        net.run()
        self.assertEqual(self.copy(b), [f"m{n}" for n in range(5)])

    def test_notWrittenAskedForAgainAfterReconnection(self) -> None:
        """
        As above, but A and B lose each other before B asks again: when
        they meet again B asks A from the first record it could not write,
        not from after its mark, and its copy holds each once, in order
        (found by the soak: those records were never asked for again).
        """
        net, filler = self.forwards_failed()
        b = net.harnesses["b"]
        net.part("a", "b")
        filler.unlink()
        net.join("a", "b")
        net.run()
        self.assertEqual(self.copy(b), [f"m{n}" for n in range(5)])

    def test_laterRecordsWaitForTheMissing(self) -> None:
        """
        B could not write A's first five records; the disk frees and A
        writes two more before B asks again: B does not take them before
        the first five (it would store A's records out of A's order, and a
        group would deliver them so: found by the soak); its copy holds
        all seven, in A's order, once B has asked again.
        """
        net, filler = self.forwards_failed()
        a, b = net.harnesses["a"], net.harnesses["b"]
        filler.unlink()
        for n in (5, 6):
            a.send(W, mlm.StreamSend(f"m{n}", [b"x"]))
        net.run()
        self.assertEqual(self.copy(b), [])
        self.assertEqual(net.packs["b"].peers[net.peers["a"].uuid].counters.deferred, 2)
        b.clock.advance(REWIND_DELAY)
        net.run()
        self.assertEqual(self.copy(b), [f"m{n}" for n in range(7)])

    def test_askedUntilTheyCome(self) -> None:
        """
        B's disk stays full when it first asks A again: it asks again
        later (twice as long after each time), and takes the records once
        the disk frees, in order.
        """
        net, filler = self.forwards_failed()
        b = net.harnesses["b"]
        b.clock.advance(REWIND_DELAY)
        net.run()
        self.assertEqual(self.copy(b), [])
        filler.unlink()
        b.clock.advance(2 * REWIND_DELAY)
        net.run()
        self.assertEqual(self.copy(b), [f"m{n}" for n in range(5)])

    def test_goneAtTheOriginTakenAsLost(self) -> None:
        """
        A no longer has the records B could not write (an operator deleted
        its stream) and writes another: once B has asked A again
        L{MAX_ASKS} times with none of them coming, it takes what A sends
        again past them, and counts them lost, rather than waiting forever.
        """
        net, filler = self.forwards_failed()
        a, b = net.harnesses["a"], net.harnesses["b"]
        filler.unlink()
        assert a.journal is not None
        a.journal.delete_stream("s")
        a.send(W, mlm.StreamSend("m5", [b"x"]))
        net.run()
        delay = REWIND_DELAY
        for _ in range(MAX_ASKS):
            b.clock.advance(delay)
            net.run()
            delay *= 2
            self.assertEqual(self.copy(b), [])
        b.clock.advance(delay)
        net.run()
        self.assertEqual(self.copy(b), ["m5"])
        counters = net.packs["b"].peers[net.peers["a"].uuid].counters
        self.assertEqual(counters.never_sent_again, 5)


class FirstMeetingTests(SynchronousTestCase):
    """Two brokers meeting for the first time."""

    def test_newPeerSendsWhatItWroteSinceThisOneStarted(self) -> None:
        """
        A reader on B, B running alone; A (a broker B never saw, say one
        started afresh) writes, then the two meet: B asks A for what it
        wrote since B started, not from now on, and its reader gets it.
        """
        net = Network(Path(self.mktemp()), ["a", "b"])
        self.addCleanup(net.close)
        a, b = net.harnesses["a"], net.harnesses["b"]
        b.open(R, "reader")
        b.command(R, mlm.StreamRead("s", ""))
        for harness in (a, b):
            harness.clock.advance(10.0)
        a.open(W, "writer")
        a.command(W, mlm.StreamWrite("s"))
        a.send(W, mlm.StreamSend("early", [b"x"]))
        net.run()
        net.join("a", "b")
        self.assertEqual(subjects(b.take(R)), ["early"])
