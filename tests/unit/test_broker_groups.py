"""
Tests for consumer groups (L{malamute_pack.broker.groups}) on a real
journal: each record to exactly one member, a subject's records in order at
one member, records given back when a member leaves or its lease expires,
credit respected, the group's position durable across a restart, and the
refusals.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig
from malamute_pack.protocol import mlm
from tests.broker_support import BrokerHarness
from tests.group_members import GroupDeliveryCase

W = b"writer"
MEMBERS = (b"m1", b"m2", b"m3")


def records(messages: list[mlm.Message]) -> list[tuple[int, str]]:
    """(sequence, subject) of the STREAM_RECORDs in C{messages}."""
    return [(m.sequence, m.subject) for m in messages if isinstance(m, mlm.StreamRecord)]


class GroupTestCase(GroupDeliveryCase):
    limits = Limits(group_lease=0)

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())
        self.got: dict[bytes, list[tuple[int, str]]] = defaultdict(list)

    def harness(self) -> BrokerHarness:
        config = BrokerConfig(timeout=600.0, limits=self.limits)
        h = BrokerHarness(config, self.path, JournalConfig(prune_interval_s=3600))
        h.open(W, "writer", version=2)
        h.command(W, mlm.StreamWrite("s"))
        return h

    def write(self, count: int, subjects: int = 10, start: int = 0) -> None:
        for n in range(start, start + count):
            self.h.send(W, mlm.StreamSend(f"k{n % subjects}", [b"x"]))

    def join(self, route: bytes, member: str = "", group: str = "g", pattern: str = "") -> None:
        self.h.open(route, "", version=2)
        answer = self.h.command(
            route, mlm.StreamConsume("s", pattern, member or route.decode(), group)
        )
        self.assertEqual(answer[:1], [mlm.Ok()], answer)
        self.got[route] += records(answer)

    def collect(self) -> None:
        for route in list(self.got) + list(MEMBERS):
            self.got[route] += records(self.h.take(route))


class SharingTests(GroupTestCase):
    def test_eachRecordToOneMember(self) -> None:
        """
        Three members, 300 records over 30 subjects: each record reaches
        exactly one member, each subject only one member, in order.
        """
        for route in MEMBERS:
            self.join(route)
        self.write(300, subjects=30)
        self.collect()
        self.assertExactlyOnceInOrder(300)
        owners = defaultdict(set)
        for route, got in self.got.items():
            for _, subject in got:
                owners[subject].add(route)
        self.assertTrue(all(len(o) == 1 for o in owners.values()))
        self.assertEqual(len([r for r in MEMBERS if self.got[r]]), 3)

    def test_historyShared(self) -> None:
        """A group joining a stream with records reads them from the earliest, shared."""
        self.write(50)
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(50, start=50)
        self.collect()
        self.assertExactlyOnceInOrder(100)

    def test_otherPatternRefused(self) -> None:
        """A member joining with another pattern than the group's gets ERROR 300."""
        self.join(MEMBERS[0], pattern="k1")
        self.h.open(MEMBERS[1], "", version=2)
        got = self.h.command(MEMBERS[1], mlm.StreamConsume("s", "k2", "m2", "g"))
        assert isinstance(got[0], mlm.Error)
        self.assertIn("reads 'k1'", got[0].status_reason)

    def test_refusalsChangeNothing(self) -> None:
        """
        A join refused for its pattern or its position leaves no group and
        no membership behind: the connection can join properly after.
        """
        self.h.open(MEMBERS[0], "", version=2)
        for bad in (
            mlm.StreamConsume("s", "regex:(", "m1", "g"),
            mlm.StreamConsume("s", "", "m1", "g", mlm.TIME, 5),
        ):
            got = self.h.command(MEMBERS[0], bad)
            self.assertIsInstance(got[0], mlm.Error, bad)
        self.assertEqual(self.h.broker.consumers.groups.groups, {})
        got = self.h.command(MEMBERS[0], mlm.StreamConsume("s", "", "m1", "g"))
        self.assertEqual(got[:1], [mlm.Ok()])

    def test_groupsAreIndependent(self) -> None:
        """Two groups on one stream each get every record once."""
        self.join(MEMBERS[0], group="a")
        self.join(MEMBERS[1], group="b")
        self.write(20)
        self.collect()
        self.assertEqual([s for s, _ in self.got[MEMBERS[0]]], list(range(1, 21)))
        self.assertEqual([s for s, _ in self.got[MEMBERS[1]]], list(range(1, 21)))


class LeavingTests(GroupTestCase):
    def test_unacknowledgedGoToOthers(self) -> None:
        """
        A member that closes with records unacknowledged: they go to the
        others, before any later record of their subjects; nothing lost.
        """
        for route in MEMBERS:
            self.join(route)
        self.write(150, subjects=15)
        self.collect()
        gone = MEMBERS[0]
        taken = self.got.pop(gone)
        self.assertTrue(taken)
        self.h.send(gone, mlm.ConnectionClose())
        self.write(150, subjects=15, start=150)
        self.collect()
        self.got.pop(gone, None)
        # Every record it held reached another member, in order per subject.
        self.assertExactlyOnceInOrder(300)

    def test_acknowledgedNotGivenBack(self) -> None:
        """Records a member committed stay done when it leaves."""
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(40)
        self.collect()
        first = self.got.pop(MEMBERS[0])
        last = max(seq for seq, _ in first)
        self.h.send(MEMBERS[0], mlm.StreamCommit("s", last))
        committed = [m for m in self.h.take(MEMBERS[0]) if isinstance(m, mlm.StreamCommitted)]
        self.assertEqual([(c.sequence, c.status_code) for c in committed], [(last, 200)])
        self.h.send(MEMBERS[0], mlm.ConnectionClose())
        self.collect()
        self.got.pop(MEMBERS[0], None)
        again = {seq for got in self.got.values() for seq, _ in got} & {s for s, _ in first}
        self.assertEqual(again, set())

    def test_leaseExpiry(self) -> None:
        """A member holding a record past the lease loses its records to the others."""
        self.h.close()
        self.limits = Limits(group_lease=10)
        self.h = self.harness()
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(20)
        self.collect()
        slow = MEMBERS[0]
        held = {seq for seq, _ in self.got.pop(slow)}
        self.h.send(MEMBERS[1], mlm.StreamCommit("s", 20))
        for _ in range(3):
            self.h.clock.advance(5)
            self.h.send(MEMBERS[1], mlm.ConnectionPing())
            self.h.send(MEMBERS[1], mlm.StreamCommit("s", 20))
            self.h.broker.expire_silent()  # the sweep, as the broker's timer runs it
        self.collect()
        self.got.pop(slow, None)
        self.assertEqual(held - {s for s, _ in self.got[MEMBERS[1]]}, set())
        self.h.send(slow, mlm.StreamCommit("s", 20))
        [answer] = [m for m in self.h.take(slow) if isinstance(m, mlm.StreamCommitted)]
        self.assertEqual(answer.status_code, 300)


class RejoinTests(GroupTestCase):
    def test_groupWithoutMembersResumesFromItsPosition(self) -> None:
        """
        When every member has left, a new member gets what was not
        acknowledged, then what came meanwhile; the emptied group is not kept.
        """
        self.join(MEMBERS[0])
        self.write(10)
        self.collect()
        self.h.send(MEMBERS[0], mlm.StreamCommit("s", 6))
        self.h.send(MEMBERS[0], mlm.ConnectionClose())
        self.collect()
        self.assertEqual(self.h.broker.consumers.groups.groups, {})
        self.write(5, start=10)
        self.got.clear()
        self.join(MEMBERS[1])
        self.collect()
        self.assertEqual([s for s, _ in self.got[MEMBERS[1]]], list(range(7, 16)))


class CreditTests(GroupTestCase):
    def test_noCreditWaits(self) -> None:
        """
        A member without credit is sent nothing; its subjects' records wait
        for it, and come in order when it grants credit.
        """
        self.join(MEMBERS[0])
        self.h.send(MEMBERS[0], mlm.Credit(0))
        self.write(5, subjects=1)
        self.collect()
        self.assertEqual(self.got[MEMBERS[0]], [])
        self.h.send(MEMBERS[0], mlm.Credit(3))
        self.collect()
        self.assertEqual([s for s, _ in self.got[MEMBERS[0]]], [1, 2, 3])
        self.h.send(MEMBERS[0], mlm.Credit(10))
        self.collect()
        self.assertEqual([s for s, _ in self.got[MEMBERS[0]]], [1, 2, 3, 4, 5])

    def test_fullQueuesReadAgainFromTheJournal(self) -> None:
        """
        More records than a member without credit can queue: the group
        falls behind and reads them from the journal later, none lost.
        """
        self.join(MEMBERS[0])
        self.h.send(MEMBERS[0], mlm.Credit(0))
        self.write(1000, subjects=1)
        self.collect()
        self.h.send(MEMBERS[0], mlm.Credit(60_000))
        for _ in range(20):
            self.h.clock.advance(0.1)
            self.collect()
        self.assertEqual([s for s, _ in self.got[MEMBERS[0]]], list(range(1, 1001)))


class DurableTests(GroupTestCase):
    def test_positionSurvivesRestart(self) -> None:
        """
        A group whose members committed part of what they got resumes,
        after a restart, with only the unacknowledged records.
        """
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(60)
        self.collect()
        acked: set[int] = set()
        for route in MEMBERS[:2]:
            got = self.got[route]
            upto = got[len(got) // 2][0]
            self.h.send(route, mlm.StreamCommit("s", upto))
            acked |= {s for s, _ in got if s <= upto}
        self.collect()
        self.h.settle()
        self.h.close()
        self.h = self.harness()
        self.got.clear()
        self.join(MEMBERS[2])
        self.collect()
        self.assertEqual(
            sorted(s for s, _ in self.got[MEMBERS[2]]), sorted(set(range(1, 61)) - acked)
        )


def committed(messages: list[mlm.Message]) -> list[tuple[int, int]]:
    """(sequence, code) of the STREAM_COMMITTEDs in C{messages}."""
    return [(m.sequence, m.status_code) for m in messages if isinstance(m, mlm.StreamCommitted)]


class StuckMemberTests(GroupTestCase):
    limits = Limits(group_lease=10)

    def test_memberWithoutCreditExpires(self) -> None:
        """
        A member that stops granting credit while still connected: the
        records assigned to it (never sent) count toward its lease, and when
        the lease runs out they go to the other member; the group goes on.
        """
        self.join(MEMBERS[0])
        self.h.send(MEMBERS[0], mlm.Credit(0))
        self.join(MEMBERS[1])
        self.write(40, subjects=8)
        self.collect()
        stuck = self.h.broker.consumers.groups.groups[("s", "g")].members["m1"]
        self.assertTrue(stuck.pending)
        self.assertEqual(self.got[MEMBERS[0]], [])
        for _ in range(3):
            self.h.clock.advance(5)
            for route in MEMBERS[:2]:
                self.h.send(route, mlm.ConnectionPing())
            self.h.broker.expire_silent()
        self.collect()
        self.assertExactlyOnceInOrder(40)
        self.assertEqual(self.h.broker.consumers.groups.expired, 1)

    def test_slowMemberThatCommitsKeepsItsRecords(self) -> None:
        """A member that acknowledges within each lease keeps its place, however long it holds."""
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(40, subjects=8)
        self.collect()
        for n in range(4):
            self.h.clock.advance(8)
            for route in MEMBERS[:2]:
                got = self.got[route]
                self.h.send(route, mlm.StreamCommit("s", got[n][0]))
            self.h.broker.expire_silent()
        self.assertEqual(self.h.broker.consumers.groups.expired, 0)


class BacklogTests(GroupTestCase):
    def test_newMemberSharesWaitingBacklog(self) -> None:
        """
        A member that joins while records wait at another member (which has
        no credit) takes over the subjects it wins: both get records, each
        record once, each subject in order.
        """
        self.join(MEMBERS[0])
        self.h.send(MEMBERS[0], mlm.Credit(0))
        self.write(100, subjects=10)
        self.collect()
        self.assertEqual(self.got[MEMBERS[0]], [])
        self.join(MEMBERS[1])
        self.collect()
        self.assertTrue(self.got[MEMBERS[1]], "the new member got nothing of the backlog")
        self.h.send(MEMBERS[0], mlm.Credit(1000))
        self.collect()
        self.assertExactlyOnceInOrder(100)
        subjects = [{s for _, s in self.got[route]} for route in MEMBERS[:2]]
        self.assertEqual(subjects[0] & subjects[1], set())

    def test_subjectInHandMovesAfterItsCommit(self) -> None:
        """
        A subject the first member was sent records of stays with it while
        they are unacknowledged; its waiting records move to the new member
        that wins it once the first member commits them.
        """
        self.join(MEMBERS[0])
        self.h.send(MEMBERS[0], mlm.Credit(0))
        self.write(60, subjects=3)
        self.h.send(MEMBERS[0], mlm.Credit(3))
        self.collect()
        first = list(self.got[MEMBERS[0]])
        self.assertEqual([s for s, _ in first], [1, 2, 3])
        self.join(MEMBERS[1])
        self.collect()
        self.assertEqual(self.got[MEMBERS[1]], [], "a subject in hand moved")
        self.h.send(MEMBERS[0], mlm.StreamCommit("s", 3))
        self.collect()
        self.assertTrue(self.got[MEMBERS[1]], "nothing moved after the commit")
        self.h.send(MEMBERS[0], mlm.Credit(1000))
        self.collect()
        self.assertExactlyOnceInOrder(60)


class CommitTests(GroupTestCase):
    def test_commitOfRecordNotDeliveredRefused(self) -> None:
        """
        A member's commit of a record it was never sent (another member's,
        or one not written yet) is answered 300, and acknowledges nothing;
        its commit of its own record is answered 200.
        """
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(40, subjects=8)
        self.collect()
        other = self.got[MEMBERS[1]][-1][0]
        mine = self.got[MEMBERS[0]][-1][0]
        for seq in (other, 1000):
            self.h.send(MEMBERS[0], mlm.StreamCommit("s", seq))
            self.assertEqual(committed(self.h.take(MEMBERS[0])), [(seq, 300)])
        group = self.h.broker.consumers.groups.groups[("s", "g")]
        self.assertNotIn(other, group.acked)
        self.h.send(MEMBERS[0], mlm.StreamCommit("s", mine))
        self.h.settle()
        self.assertEqual(committed(self.h.take(MEMBERS[0])), [(mine, 200)])

    def test_commitAgainAnswered(self) -> None:
        """A member's commit repeated (its own record, acknowledged before) is answered 200."""
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(40, subjects=8)
        self.collect()
        mine = self.got[MEMBERS[0]][2][0]
        for _ in range(2):
            self.h.send(MEMBERS[0], mlm.StreamCommit("s", mine))
            self.h.settle()
            self.assertEqual(committed(self.h.take(MEMBERS[0])), [(mine, 200)])

    def test_commitOfRecordGivenBackAndAcknowledgedRefused(self) -> None:
        """
        A member leaves; the records it was sent go to the other member,
        which acknowledges them. The member, back, commits one of them (a
        commit sent again after a reconnection): answered 300, though it is
        below the group's position, since another member acknowledged it
        (found by the soak: two members had one record acknowledged); its
        commit of a record it acknowledged itself before is answered 200.
        """
        self.join(MEMBERS[0])
        self.join(MEMBERS[1])
        self.write(40, subjects=8)
        self.collect()
        sent = [seq for seq, _ in self.got[MEMBERS[0]]]
        self.h.send(MEMBERS[0], mlm.StreamCommit("s", sent[0]))
        self.h.settle()
        self.assertEqual(committed(self.h.take(MEMBERS[0])), [(sent[0], 200)])
        self.h.send(MEMBERS[0], mlm.StreamCancel("s"))  # it leaves: its records go to m2
        self.h.settle()
        self.h.take(MEMBERS[0])
        self.collect()
        taken = [seq for seq, _ in self.got[MEMBERS[1]]]
        self.assertTrue(set(sent[1:]) <= set(taken))
        self.h.send(MEMBERS[1], mlm.StreamCommit("s", taken[-1]))
        self.h.settle()
        self.assertEqual(committed(self.h.take(MEMBERS[1])), [(taken[-1], 200)])
        group = self.h.broker.consumers.groups.groups[("s", "g")]
        self.assertEqual(group.floor, 40)
        answer = self.h.command(MEMBERS[0], mlm.StreamConsume("s", "", "m1", "g"))
        self.assertEqual(answer[:1], [mlm.Ok()])
        for seq, code in ((sent[-1], 300), (sent[0], 200)):
            self.h.send(MEMBERS[0], mlm.StreamCommit("s", seq))
            self.h.settle()
            self.assertEqual(committed(self.h.take(MEMBERS[0])), [(seq, code)])


class MembershipTests(GroupTestCase):
    limits = Limits(group_lease=0, max_subscriptions=3)

    def test_membershipsCountAsSubscriptions(self) -> None:
        """
        A connection's group memberships count toward its subscriptions: past
        the limit, joining one more group is refused.
        """
        self.h.open(MEMBERS[0], "", version=2)
        for n in range(3):
            got = self.h.command(MEMBERS[0], mlm.StreamConsume(f"s{n}", "", "m", "g"))
            self.assertEqual(got[:1], [mlm.Ok()])
        got = self.h.command(MEMBERS[0], mlm.StreamConsume("s3", "", "m", "g"))
        assert isinstance(got[0], mlm.Error)
        self.assertIn("too many subscriptions", got[0].status_reason)

    def test_creditPumpsOnlyMembershipsWithRecordsWaiting(self) -> None:
        """
        A member of several groups with nothing waiting has no membership to
        pump; one with records waiting for credit has exactly those.
        """
        self.h.open(MEMBERS[0], "", version=2)
        self.h.send(MEMBERS[0], mlm.Credit(0))
        for n in range(3):
            self.h.command(MEMBERS[0], mlm.StreamConsume(f"s{n}", "", "m", "g"))
        groups = self.h.broker.consumers.groups
        self.assertEqual(groups.waiting_members(), 0)
        self.h.command(W, mlm.StreamWrite("s1"))
        self.h.send(W, mlm.StreamSend("k", [b"x"]))
        self.h.settle()  # a group takes records once durable
        self.assertEqual(groups.waiting_members(), 1)
        self.h.send(MEMBERS[0], mlm.Credit(5))
        self.assertEqual(groups.waiting_members(), 0)
        self.assertEqual(len(records(self.h.take(MEMBERS[0]))), 1)


class RejoinAsSameMemberTests(GroupTestCase):
    def test_onlyMemberReplacedKeepsTheGroup(self) -> None:
        """
        A new connection joining under the name of a group's only member
        replaces it in the same group: a later member shares with it, each
        record once.
        """
        self.join(MEMBERS[0], member="m1")
        self.write(20)
        self.collect()
        self.got.clear()
        self.join(MEMBERS[1], member="m1")
        self.join(MEMBERS[2], member="m3")
        self.assertEqual(len(self.h.broker.consumers.groups.groups), 1)
        self.write(20, start=20)
        self.collect()
        self.got.pop(MEMBERS[0], None)
        self.assertExactlyOnceInOrder(40)
