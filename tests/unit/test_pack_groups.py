"""
Tests for L{malamute_pack.pack.groups}: consumer groups whose members are on
several brokers of a pack, on broker models with real journals wired by the
in-memory network of ``test_pack_federation`` (each broker's L{Pack}, no
ZRE, no sockets), with MLM version 2 clients driven through the real
session table.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import ClassVar

from malamute_pack.pack.groups import MAX_VECTOR_ENTRIES, WINDOW, home_weight
from malamute_pack.protocol import mlm, packlink
from tests.broker_support import BrokerHarness
from tests.group_members import GroupDeliveryCase
from tests.unit.test_pack_federation import Network

W = b"writer"
STREAM = "s"


def records(messages: list[mlm.Message]) -> list[tuple[int, str]]:
    """(sequence, subject) of the STREAM_RECORDs in C{messages}."""
    return [(m.sequence, m.subject) for m in messages if isinstance(m, mlm.StreamRecord)]


class PackGroupCase(GroupDeliveryCase):
    names: ClassVar[list[str]] = ["a", "b"]

    def setUp(self) -> None:
        self.net = Network(Path(self.mktemp()), self.names)
        self.addCleanup(self.net.close)
        self.net.mesh()
        self.got: dict[tuple[str, bytes], list[tuple[int, str]]] = defaultdict(list)
        self.other: dict[tuple[str, bytes], list[mlm.Message]] = defaultdict(list)

    def h(self, name: str) -> BrokerHarness:
        return self.net.harnesses[name]

    def group_homed_on(self, name: str, among: list[str] | None = None) -> str:
        """A group name whose home, of the brokers C{among} (all), is C{name}."""
        ids = {n: self.net.peers[n].uuid.hex().upper() for n in among or self.names}
        for n in range(1000):
            group = f"g{n}"
            if max(ids, key=lambda b: home_weight(ids[b], STREAM, group)) == name:
                return group
        raise AssertionError("no such group name")

    def write(self, broker: str, count: int, subjects: int = 10, start: int = 0) -> None:
        h = self.h(broker)
        if not h.connected(W):
            h.open(W, "writer", version=2)
            h.command(W, mlm.StreamWrite(STREAM))
        for n in range(start, start + count):
            h.send(W, mlm.StreamSend(f"k{n % subjects}", [b"x"]))
        self.net.run()

    def join(
        self, broker: str, route: bytes, group: str, pattern: str = "", credit: int | None = None
    ) -> None:
        h = self.h(broker)
        h.open(route, "", version=2)
        if credit is not None:
            h.send(route, mlm.Credit(credit))
        answer = h.command(route, mlm.StreamConsume(STREAM, pattern, route.decode(), group))
        self.assertEqual(answer[:1], [mlm.Ok()], answer)
        self.net.run()

    def collect(self) -> None:
        self.net.run()
        for name, h in self.net.harnesses.items():
            for route in list(h.sent):
                if route == W:
                    continue
                messages = h.take(route)
                self.got[(name, route)] += records(messages)
                self.other[(name, route)] += [
                    m for m in messages if not isinstance(m, mlm.StreamRecord)
                ]

    def commit(self, broker: str, route: bytes, seq: int) -> None:
        self.h(broker).send(route, mlm.StreamCommit(STREAM, seq))
        self.net.run()


class SharingTests(PackGroupCase):
    def test_membersOnTwoBrokersShareTheRecords(self) -> None:
        """
        Two members on the home and one on another broker, 300 records
        written on both brokers: each record reaches exactly one member, in
        the home's numbering, each subject's records in order, and the
        member on the other broker gets its share.
        """
        group = self.group_homed_on("a")
        self.join("a", b"m1", group)
        self.join("a", b"m2", group)
        self.join("b", b"m3", group)
        self.write("a", 150, subjects=30)
        self.write("b", 150, subjects=30, start=150)
        self.collect()
        self.assertExactlyOnceInOrder(300)
        self.assertTrue(self.got[("b", b"m3")], "the remote member got nothing")
        self.assertEqual(self.net.packs["b"].groups.counters.joined_elsewhere, 1)
        self.assertEqual(self.net.packs["a"].groups.counters.hosted, 1)

    def test_latestMeansLiveAcrossThePack(self) -> None:
        """
        A group reset to the latest record on its home does not ask the
        peers for their history: records written on a peer before the
        join are not delivered, those written after are.
        """
        group = self.group_homed_on("b")
        self.write("a", 10)
        h = self.h("b")
        h.open(b"m1", "", version=2)
        answer = h.command(b"m1", mlm.StreamConsume(STREAM, "", "m1", group, mlm.LATEST))
        self.assertEqual(answer[:1], [mlm.Ok()])
        self.net.run()
        self.write("a", 5, start=10)
        self.collect()
        self.assertEqual(
            [subject for _, subject in self.got[("b", b"m1")]], ["k0", "k1", "k2", "k3", "k4"]
        )

    def test_noGroupStateOnTheMembersBroker(self) -> None:
        """A member's broker keeps no group of its own: the group lives on its home only."""
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        self.assertEqual(self.h("b").broker.consumers.groups.groups, {})
        self.assertIn((STREAM, group), self.h("a").broker.consumers.groups.groups)

    def test_commitAnsweredThroughTheHome(self) -> None:
        """
        A remote member's commit is made at the home (its position saved
        there) and answered to the client with STREAM_COMMITTED.
        """
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        self.write("a", 10)
        self.collect()
        self.assertEqual([s for s, _ in self.got[("b", b"m1")]], list(range(1, 11)))
        self.commit("b", b"m1", 10)
        self.collect()
        self.assertIn(mlm.StreamCommitted(STREAM, 10), self.other[("b", b"m1")])
        position = self.h("a").broker.consumers.groups.groups[(STREAM, group)].floor
        self.assertEqual(position, 10)

    def test_remoteMemberLeavesItsRecordsGoToAnother(self) -> None:
        """
        A member on another broker that leaves (closes) unacknowledged:
        what it held goes to the member on the home, nothing lost.
        """
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        self.write("a", 20)
        self.collect()
        self.assertEqual(len(self.got[("b", b"m1")]), 20)
        self.join("a", b"m2", group)
        self.h("b").send(b"m1", mlm.ConnectionClose())
        self.collect()
        self.assertEqual([s for s, _ in self.got[("a", b"m2")]], list(range(1, 21)))

    def test_membersBrokerLostItsRecordsGoToAnother(self) -> None:
        """
        The home loses the member's broker (EXIT): that member's records
        go to the member on the home.
        """
        group = self.group_homed_on("a")
        self.join("a", b"m1", group)
        self.join("b", b"m2", group)
        self.write("a", 100, subjects=20)
        self.collect()
        held = {s for s, _ in self.got[("b", b"m2")]}
        self.assertTrue(held)
        self.assertTrue(held.isdisjoint(s for s, _ in self.got[("a", b"m1")]))
        self.net.part("a", "b")
        self.collect()
        on_home = [s for s, _ in self.got[("a", b"m1")]]
        self.assertEqual(sorted(on_home), list(range(1, 101)))
        self.assertLessEqual(held, set(on_home))

    def test_leaseExpiredAtTheHomeEndsTheRemoteMembership(self) -> None:
        """
        A remote member that holds records unacknowledged past the lease
        loses them to the member on the home, and its client is told.
        """
        group = self.group_homed_on("a")
        self.join("a", b"m1", group, pattern="")
        self.join("b", b"m2", group)
        self.write("a", 100, subjects=20)
        self.collect()
        held = {s for s, _ in self.got[("b", b"m2")]}
        self.assertTrue(held)
        for s, _ in self.got[("a", b"m1")]:
            self.commit("a", b"m1", s)
        self.h("a").clock.pump([1.0] * 46)  # past the 30 s lease, and a sweep
        self.collect()
        self.assertLessEqual(held, {s for s, _ in self.got[("a", b"m1")]})
        errors = [m for m in self.other[("b", b"m2")] if isinstance(m, mlm.Error)]
        self.assertEqual(len(errors), 1, self.other[("b", b"m2")])
        self.assertIn("lease expired", errors[0].status_reason)

    def test_memberNameTakenOverOnAnotherBroker(self) -> None:
        """
        A client on the home joining under the name of a member on another
        broker takes its place: the member's client there is told.
        """
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        h = self.h("a")
        h.open(b"other", "", version=2)
        h.command(b"other", mlm.StreamConsume(STREAM, "", "m1", group))
        self.collect()
        errors = [m for m in self.other[("b", b"m1")] if isinstance(m, mlm.Error)]
        self.assertEqual(len(errors), 1, self.other[("b", b"m1")])
        self.assertIn("another connection joined", errors[0].status_reason)
        self.write("a", 5)
        self.collect()
        self.assertEqual(len(self.got[("a", b"other")]), 5)
        self.assertEqual(self.got[("b", b"m1")], [])

    def test_homeRefusalReachesTheClient(self) -> None:
        """
        A join the home refuses (another pattern than the group's) ends
        the membership: the client gets an ERROR, and its commits fail.
        """
        group = self.group_homed_on("a")
        self.join("a", b"m1", group, pattern="k1.*")
        self.join("b", b"m2", group, pattern="k2.*")
        self.collect()
        errors = [m for m in self.other[("b", b"m2")] if isinstance(m, mlm.Error)]
        self.assertEqual(len(errors), 1, self.other[("b", b"m2")])
        self.assertIn("reads 'k1.*'", errors[0].status_reason)
        self.commit("b", b"m2", 1)
        self.collect()
        (answer,) = [m for m in self.other[("b", b"m2")] if isinstance(m, mlm.StreamCommitted)]
        self.assertEqual(answer.status_code, mlm.FAILED)

    def test_creditOfTheClientRespected(self) -> None:
        """
        A remote member whose client gave 5 credits gets 5 records; the
        home sends its broker at most a window ahead; more credit brings
        the rest, in order.
        """
        group = self.group_homed_on("a")
        self.join("b", b"m1", group, credit=5)
        self.write("a", WINDOW + 200, subjects=1)
        self.collect()
        self.assertEqual([s for s, _ in self.got[("b", b"m1")]], [1, 2, 3, 4, 5])
        sent = [m for s, t, m in self.net.sent if isinstance(m, packlink.GroupRecord)]
        self.assertEqual(len(sent), WINDOW)
        self.h("b").send(b"m1", mlm.Credit(WINDOW + 1000))
        self.collect()
        self.assertEqual([s for s, _ in self.got[("b", b"m1")]], list(range(1, WINDOW + 201)))

    def test_homeSendingPastTheWindowRefused(self) -> None:
        """
        Records a home sends past the window (1,024 records), or past a
        member's unacknowledged bytes, while the client takes none, are
        refused and counted, not queued.
        """
        group = self.group_homed_on("a")
        self.join("b", b"m1", group, credit=0)
        pack = self.net.packs["b"]

        def record(seq: int, size: int) -> None:
            message = packlink.GroupRecord(STREAM, group, "m1", seq, 0, "", "k", (b"x" * size,))
            pack.whispered(self.net.peers["a"], packlink.encode(message))

        for seq in range(1, WINDOW + 2):
            record(seq, 1)
        self.assertEqual(pack.groups.counters.refused, 1)
        self.h("b").send(b"m1", mlm.Credit(WINDOW + 1000))
        self.collect()
        self.assertEqual(len(self.got[("b", b"m1")]), WINDOW)
        self.join("b", b"m2", group, credit=0)
        big = 4 * 1024 * 1024  # 4 of them are a member's 16 MiB

        def large(seq: int) -> None:
            message = packlink.GroupRecord(STREAM, group, "m2", seq, 0, "", "k", (b"x" * big,))
            pack.whispered(self.net.peers["a"], packlink.encode(message))

        for seq in range(100, 105):
            large(seq)
        self.assertEqual(pack.groups.counters.refused, 2)

    def test_acknowledgedVectorsBounded(self) -> None:
        """
        What peers say groups acknowledged is kept up to 100,000 (origin,
        number) entries in all: past that the least recently changed
        group's is forgotten, the latest kept.
        """
        pack = self.net.packs["b"]
        origins = {f"O{n}": n + 1 for n in range(packlink.MAX_ORIGINS)}
        for n in range(200):
            message = packlink.GroupPosition(STREAM, f"g{n}", 0, packlink.encode_vector(origins))
            pack.whispered(self.net.peers["a"], packlink.encode(message))
        self.assertLessEqual(pack.groups.remembered, MAX_VECTOR_ENTRIES)
        self.assertGreater(pack.groups.remembered, MAX_VECTOR_ENTRIES - packlink.MAX_ORIGINS)
        self.assertEqual(pack.groups.acknowledged(STREAM, "g199"), origins)
        self.assertIsNone(pack.groups.acknowledged(STREAM, "g0"))

    def test_commitAfterThePackStopped(self) -> None:
        """A remote member's commit once its broker's pack stopped is answered 300, not lost."""
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        self.net.packs["b"].stop()
        self.commit("b", b"m1", 1)
        self.collect()
        (answer,) = [m for m in self.other[("b", b"m1")] if isinstance(m, mlm.StreamCommitted)]
        self.assertEqual(answer.status_code, mlm.FAILED)

    def test_peerUserNotBelievedInAnOpenPack(self) -> None:
        """In an open pack a peer's word for its client's user is not believed: anonymous."""
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        (member,) = self.h("a").broker.consumers.groups.groups[(STREAM, group)].members.values()
        self.assertEqual(member.connection.session.user, "")


class MovingTests(PackGroupCase):
    names: ClassVar[list[str]] = ["a", "b", "c"]

    def setUp(self) -> None:
        self.net = Network(Path(self.mktemp()), self.names)
        self.addCleanup(self.net.close)
        self.got = defaultdict(list)
        self.other = defaultdict(list)

    def test_localGroupMovesToTheHomeThatJoins(self) -> None:
        """
        A group made on b while b was alone moves to its home a when a
        joins the pack: b's member reads through a from then on.
        """
        group = self.group_homed_on("a", ["a", "b"])
        self.join("b", b"m1", group)
        self.assertIn((STREAM, group), self.h("b").broker.consumers.groups.groups)
        self.net.join("a", "b")
        self.assertEqual(self.h("b").broker.consumers.groups.groups, {})
        self.assertIn((STREAM, group), self.h("a").broker.consumers.groups.groups)
        self.write("a", 10)
        self.collect()
        self.assertEqual([s for s, _ in self.got[("b", b"m1")]], list(range(1, 11)))

    def test_movedGroupPassesOverWhatWasAcknowledged(self) -> None:
        """
        A group made on b while alone, whose member acknowledged 20
        records there, moves to its home a when a joins: a passes over
        those 20 (b told it what was acknowledged before the member came)
        and the member gets only what is written after.
        """
        group = self.group_homed_on("a", ["a", "b"])
        self.join("b", b"m1", group)
        self.write("b", 20)
        self.collect()
        self.assertEqual(len(self.got[("b", b"m1")]), 20)
        self.commit("b", b"m1", 20)
        self.got.clear()
        self.net.join("a", "b")
        self.write("b", 5, start=20)
        self.collect()
        self.assertEqual(
            [subject for _, subject in self.got[("b", b"m1")]], ["k0", "k1", "k2", "k3", "k4"]
        )

    def test_resetForgetsWhatWasAcknowledgedEverywhere(self) -> None:
        """
        A group reset to the earliest record at its home (a) after it
        acknowledged 20 records: when a leaves, the next home (b) delivers
        the 20 again, unacknowledged since the reset (the pack was told
        the reset, which replaces what it knew of the group).
        """
        group = self.group_homed_on("a", ["a", "b"])
        self.net.join("a", "b")
        self.join("b", b"m1", group)
        self.write("b", 20)
        self.collect()
        self.commit("b", b"m1", 20)
        self.h("a").clock.advance(1.0)
        h = self.h("b")
        h.send(b"m1", mlm.StreamCancel(STREAM))
        h.send(b"m1", mlm.StreamConsume(STREAM, "", "m1", group, mlm.EARLIEST))
        self.collect()
        self.assertEqual(len(self.got[("b", b"m1")]), 40)
        self.h("a").clock.advance(1.0)
        self.net.run()
        self.got.clear()
        self.net.part("a", "b")
        self.collect()
        self.assertEqual(len(self.got[("b", b"m1")]), 20)

    def sixty_acknowledged(self) -> str:
        """
        The three in a pack, members on b and c of a group homed on a, 60
        records written on b and c, each acknowledged: the group's name.
        """
        self.net.mesh()
        group = self.group_homed_on("a")
        self.join("b", b"m1", group)
        self.join("c", b"m2", group)
        self.write("b", 30, subjects=6)
        self.write("c", 30, subjects=6, start=30)
        self.collect()
        for name, route in (("b", b"m1"), ("c", b"m2")):
            got = self.got[(name, route)]
            self.assertTrue(got)
            self.commit(name, route, got[-1][0])
        return group

    def test_homeLostMembersMoveToTheNextHome(self) -> None:
        """
        The home (a) leaves the pack after its members on b and c
        acknowledged 60 records written on b and c: they join the group's
        next home, which passes over those 60 (the position a told the
        pack, in origin terms) and delivers the 30 written after, each once.
        """
        self.sixty_acknowledged()
        self.assertEqual(sum(len(g) for g in self.got.values()), 60)
        self.h("a").clock.advance(1.0)  # a tells the pack its position
        self.net.run()
        self.got.clear()
        self.net.part("a", "b")
        self.net.part("a", "c")
        moved = (
            self.net.packs["b"].groups.counters.moved + self.net.packs["c"].groups.counters.moved
        )
        self.assertEqual(moved, 2)
        self.write("b", 30, subjects=6, start=60)
        self.collect()
        got = [(s, subject) for key, g in self.got.items() for s, subject in g]
        self.assertEqual(len(got), 30, got)
        self.assertEqual(
            sorted(subject for _, subject in got), sorted(f"k{n % 6}" for n in range(60, 90))
        )

    def test_whatWasAcknowledgedSurvivesRestarts(self) -> None:
        """
        What a group acknowledged, as its home (a) told the pack, is kept in
        every broker's journal: b and c restart (forgetting what they
        heard), then a leaves, and the next home still passes over the 60
        records acknowledged and delivers only the 30 written after.
        """
        group = self.sixty_acknowledged()
        self.h("a").clock.advance(1.0)  # a tells the pack its position
        self.net.run()
        for name in ("b", "c"):
            self.h(name).clock.advance(1.0)  # each keeps what it heard
            self.h(name).settle()
        self.net.restart("b")
        self.net.restart("c")
        self.net.join("b", "c")
        self.got.clear()
        self.join("b", b"m1", group)
        self.join("c", b"m2", group)
        self.write("b", 30, subjects=6, start=60)
        self.collect()
        got = [(s, subject) for key, g in self.got.items() for s, subject in g]
        self.assertEqual(
            sorted(subject for _, subject in got), sorted(f"k{n % 6}" for n in range(60, 90))
        )


class FreshHomeTests(PackGroupCase):
    names: ClassVar[list[str]] = ["a", "b", "c"]

    def test_freshHomeDoesNotPassOverWhatItNeverHad(self) -> None:
        """
        The group acknowledged a's first 5 of 10 records at its home b. c,
        started afresh, meets the pack after a wrote an eleventh: it takes
        that one (a peer is asked for what it wrote since this broker
        started) and none of the ten. The group's member comes back: c is
        its home, and acknowledges the eleventh. When c leaves, b still
        delivers a's records 6 to 10, which c never had: what c
        acknowledged does not claim them (found by the soak: the next home
        passed over them, never delivered).
        """
        self.assertRedelivered(self.freshHomeLeaves(told=True), range(5, 10))

    def test_freshHomeNotToldPassesOverNothing(self) -> None:
        """
        As above, but c becomes the home before anyone told it what the
        group acknowledged (b, the old home, had not told the pack yet, and
        c meets only a): c, which took a's records only from the eleventh,
        does not claim a's earlier records either, so when c leaves, b
        still delivers a's records 6 to 10 (found by the soak: a home on a
        journal started afresh, not told yet, counted its copy as all of
        a's, and the next home passed over what it never had).
        """
        self.assertRedelivered(self.freshHomeLeaves(told=False), range(5, 10))

    def freshHomeLeaves(self, told: bool) -> set[str]:
        """
        The scenario of the tests above: the subjects the member gets once
        c, started afresh and the group's home, leaves. C{told}: b tells the
        pack what the group acknowledged before c becomes its home, and c
        meets b too (else c meets only a, and b hears from c when c leaves).
        """
        # c's identity once started afresh (Network.start_afresh).
        fresh: dict[str, str | bytes] = {
            "a": "a",
            "b": "b",
            "c": bytes([self.net.peers["c"].uuid[0] + 100]) * 16,
        }
        group = next(
            f"g{n}"
            for n in range(1000)
            if self.home(f"g{n}", {"a": "a", "b": "b"}) == "b" and self.home(f"g{n}", fresh) == "c"
        )
        self.net.part("c", "a")
        self.net.part("c", "b")
        self.join("a", b"m1", group)
        self.write("a", 10, subjects=11)
        self.collect()
        first = self.got[("a", b"m1")]
        self.assertEqual(len(first), 10)
        self.commit("a", b"m1", first[4][0])
        if told:
            self.h("b").clock.advance(1.0)  # b tells the pack what was acknowledged
            self.net.run()
        self.h("a").send(b"m1", mlm.StreamCancel(STREAM))
        self.net.run()
        self.h("a").take(b"m1")
        self.net.start_afresh("c", later=1000.0)
        c = self.h("c")
        c.open(b"r", "reader")  # c reads the stream: it asks its peers for it when it meets them
        c.command(b"r", mlm.StreamRead(STREAM, ""))
        self.h("a").clock.advance(1500.0)
        self.write("a", 1, subjects=11, start=10)
        self.net.join("c", "a")
        if told:
            self.net.join("c", "b")
        self.got.clear()
        self.join("a", b"m1", group)  # again (its connection expired meanwhile)
        self.collect()
        self.assertIn((STREAM, group), self.h("c").broker.consumers.groups.groups)
        self.assertEqual([subject for _, subject in self.got[("a", b"m1")]], ["k10"])
        self.commit("a", b"m1", self.got[("a", b"m1")][-1][0])
        self.h("c").clock.advance(1.0)  # c tells the pack what was acknowledged
        self.net.run()
        if not told:
            self.net.join("c", "b")  # b hears it from c
        self.got.clear()
        self.net.part("c", "a")
        self.net.part("c", "b")
        self.collect()
        return {subject for _, subject in self.got[("a", b"m1")]}

    def assertRedelivered(self, got: set[str], numbers: range) -> None:
        """The subjects C{got} include k{n} for each of C{numbers}."""
        wanted = {f"k{n}" for n in numbers}
        self.assertTrue(wanted <= got, sorted(got))

    def home(self, group: str, among: dict[str, str | bytes]) -> str:
        """
        Which of the brokers C{among} is the home of C{group}: each a
        broker's name (its identity now) or the identity it will have.
        """
        ids = {
            name: (self.net.peers[who].uuid if isinstance(who, str) else who).hex().upper()
            for name, who in among.items()
        }
        return max(ids, key=lambda b: home_weight(ids[b], STREAM, group))
