"""
The soak's fault schedule (L{soak.nemesis.schedule}): the same for the
same seed and another for another, every kind drawn, and the rules kept
(no two process faults at once on one broker, one damaged broker of a pair
at a time with its partner left alone meanwhile, every fault inside the
soak); how a journal file is damaged (L{soak.nemesis.damage_file}); and
the names and subnets a run claims (L{soak.slots}) for each topology
(L{soak.topology.layout}).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.netns import Lan
from soak import slots
from soak.nemesis import (
    CATCH_UP,
    GRACE,
    KINDS,
    PROCESS_KINDS,
    WARM_UP,
    Fault,
    PairSeparations,
    Targets,
    catching_up,
    damage_file,
    schedule,
    targets,
)
from soak.topology import PAIR_LAN, TOPOLOGIES, layout


def where(topology: str) -> Targets:
    names = slots.names(topology, 0)
    return targets(layout(topology, names.prefix, names.subnet, names.pair_subnet))


def overlap(a: Fault, b: Fault, margin: float = 0.0) -> bool:
    """Whether C{a}'s time (C{margin} more on each side) and C{b}'s overlap, each with its grace."""
    return a.start - margin < b.end + GRACE and b.start < a.end + GRACE + margin


class ScheduleTests(SynchronousTestCase):
    """The schedule drawn from a seed."""

    def test_sameSeedSameSchedule(self) -> None:
        """The same seed, length and targets give the same faults; another seed others."""
        for topology in TOPOLOGIES:
            one = schedule(7, 600.0, where(topology))
            self.assertEqual(one, schedule(7, 600.0, where(topology)))
            self.assertNotEqual(one, schedule(8, 600.0, where(topology)))

    def test_everyKindDrawn(self) -> None:
        """
        Every kind of fault is drawn in a soak of a minute, for every
        topology and several seeds; the first of each kind come first.
        """
        for topology, seed in itertools.product(TOPOLOGIES, range(10)):
            faults = schedule(seed, 60.0, where(topology), interval=3.0)
            kinds = [f.kind for f in faults]
            self.assertEqual(set(kinds), set(KINDS), (topology, seed))
            self.assertEqual(set(kinds[: len(KINDS) + 3]), set(KINDS), (topology, seed))

    def test_onlyTheKindsAsked(self) -> None:
        """A schedule of some kinds has those only; an unknown kind is refused."""
        faults = schedule(3, 300.0, where("pair"), kinds=("kill", "cut"))
        self.assertEqual({f.kind for f in faults}, {"kill", "cut"})
        self.assertRaises(ValueError, schedule, 3, 60.0, where("pair"), kinds=("melt",))

    def test_rulesKept(self) -> None:
        """
        For many seeds: every fault starts after the warm-up and ends before
        the soak does; process faults never overlap on one broker, nor two
        faults of one kind on one target; a damaged pair broker's partner
        has no process fault from the damage until its catch-up is over;
        every target exists.
        """
        for topology in TOPOLOGIES:
            targets_ = where(topology)
            for seed in range(30):
                faults = schedule(seed, 300.0, targets_, interval=2.0)
                for fault in faults:
                    self.assertGreaterEqual(fault.start, WARM_UP)
                    self.assertLessEqual(fault.end, 299.0)
                    self.assertLess(fault.start, fault.end)
                    if fault.kind in PROCESS_KINDS or fault.kind == "disk":
                        self.assertIn(fault.target[0], targets_.brokers)
                    elif fault.kind == "cut":
                        self.assertIn(fault.target, targets_.links)
                    else:
                        self.assertIn(fault.target[1], targets_.lans[fault.target[0]])
                for a, b in itertools.combinations(faults, 2):
                    both_process = a.kind in PROCESS_KINDS and b.kind in PROCESS_KINDS
                    if a.target == b.target and (both_process or a.kind == b.kind):
                        self.assertFalse(overlap(a, b), (topology, seed, a, b))
                    for damaged, other in ((a, b), (b, a)):
                        partner = targets_.partners.get(damaged.target[0])
                        if (
                            damaged.kind == "damage"
                            and partner is not None
                            and other.kind in PROCESS_KINDS
                            and other.target == (partner,)
                        ):
                            self.assertFalse(
                                overlap(damaged, other, CATCH_UP), (topology, seed, damaged, other)
                            )

    def test_damageParameters(self) -> None:
        """A damage names a journal file, how (truncate or flip), where and which bit."""
        damages = [
            f
            for seed in range(20)
            for f in schedule(seed, 600.0, where("pack3"))
            if f.kind == "damage"
        ]
        self.assertTrue(damages)
        for fault in damages:
            self.assertIn(fault.params["file"], ("journal.sqlite", "journal.sqlite-wal"))
            self.assertIn(fault.params["how"], ("truncate", "flip"))
            self.assertTrue(0 <= fault.params["at"] < 1 and 0 <= fault.params["bit"] < 8)
        self.assertEqual({f.params["how"] for f in damages}, {"truncate", "flip"})


class DamageFileTests(SynchronousTestCase):
    """What a damage does to a file."""

    def file(self, name: str, size: int = 1000) -> Path:
        directory = Path(self.mktemp())
        directory.mkdir()
        path = directory / name
        path.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
        return path

    def test_flipOneBitPastTheHeader(self) -> None:
        """A flip changes one bit, past the database's 100-byte header, at the fraction given."""
        path = self.file("journal.sqlite")
        before = path.read_bytes()
        done = damage_file(path, "flip", 0.5, 3)
        after = path.read_bytes()
        changed = [i for i in range(len(before)) if before[i] != after[i]]
        self.assertEqual(changed, [100 + 450])
        self.assertEqual(before[550] ^ after[550], 1 << 3)
        self.assertEqual(done, {"file": "journal.sqlite", "size": 1000, "flipped": 550, "bit": 3})

    def test_truncatePastTheHeader(self) -> None:
        """A truncation keeps the header (32 bytes of a write-ahead log) and cuts there."""
        path = self.file("journal.sqlite-wal")
        done = damage_file(path, "truncate", 0.0, 0)
        self.assertEqual(path.stat().st_size, 32)
        self.assertEqual(done["truncated_to"], 32)
        small = self.file("journal.sqlite", 50)
        self.assertIn("nothing", damage_file(small, "flip", 0.3, 1)["done"])

    def test_damageSparesTheOnlyCopy(self) -> None:
        """
        A damage comes to a broker whose partner is down, or was started
        again (by the nemesis, after it stopped by itself) less than
        CATCH_UP seconds before: its journal may be the only copy, so the
        damage is not done; a partner running since the soak began, or for
        CATCH_UP seconds, leaves it be done.
        """
        self.assertTrue(catching_up(None, False, 100.0))
        self.assertTrue(catching_up(90.0, True, 90.0 + CATCH_UP - 0.1))
        self.assertFalse(catching_up(90.0, True, 90.0 + CATCH_UP))
        self.assertFalse(catching_up(None, True, 5.0))

    def test_damageSparesTheOnlyCopyAcrossACut(self) -> None:
        """
        A pair's brokers cut apart (a cut between their hosts, or one
        unplugged from the pair link; not the clients' LAN) are cut off
        while any such fault lasts and for CATCH_UP seconds after the last
        ends: either may have acknowledged alone what the other lacks, so a
        damage then is not done (found by the soak: a backup took over
        during a cut, its journal was damaged and started afresh, and what
        it acknowledged alone was lost); other brokers are never cut off.
        """
        apart = PairSeparations({"h1": "h2", "h2": "h1"})
        self.assertFalse(apart.cut_off("h1", "h2", 0.0))
        apart.begin("isolate", ("lan", "h1"))
        apart.begin("cut", ("h1", "h3"))
        self.assertFalse(apart.cut_off("h1", "h2", 1.0))
        apart.begin("cut", ("h1", "h2"))
        apart.begin("isolate", (PAIR_LAN, "h2"))
        apart.end("cut", ("h1", "h2"), 5.0)
        self.assertTrue(apart.cut_off("h2", "h1", 6.0))
        apart.end("isolate", (PAIR_LAN, "h2"), 10.0)
        self.assertTrue(apart.cut_off("h1", "h2", 10.0 + CATCH_UP - 0.1))
        self.assertFalse(apart.cut_off("h1", "h2", 10.0 + CATCH_UP))


class SlotTests(SynchronousTestCase):
    """The names each run claims."""

    def test_namesApart(self) -> None:
        """
        Every slot of every topology has its own prefix (a valid Lan prefix,
        with the pair link's too) and its own two subnets of 10.78.
        """
        prefixes: set[str] = set()
        subnets: set[str] = set()
        for topology in TOPOLOGIES:
            for slot in range(len(slots.SLOTS)):
                names = slots.names(topology, slot)
                Lan(names.prefix, names.subnet, 4)
                Lan(f"{names.prefix}l", names.pair_subnet, 2)
                self.assertTrue(names.subnet.startswith("10.78."))
                prefixes.add(names.prefix)
                subnets.update((names.subnet, names.pair_subnet))
        count = len(TOPOLOGIES) * len(slots.SLOTS)
        self.assertEqual((len(prefixes), len(subnets)), (count, 2 * count))
        self.assertRaises(ValueError, slots.names, "pair", len(slots.SLOTS))

    def test_claimHeld(self) -> None:
        """
        A slot claimed is not given to a second claim until released; a
        claim without a slot takes the first free one.
        """
        directory = Path(self.mktemp())
        directory.mkdir()
        first = slots.claim("pair", None, directory)
        self.addCleanup(first.release)
        self.assertEqual(first.slot, 0)
        self.assertRaises(RuntimeError, slots.claim, "pair", 0, directory)
        second = slots.claim("pair", None, directory)
        self.addCleanup(second.release)
        self.assertEqual(second.slot, 1)
        other = slots.claim("pack3", 0, directory)
        other.release()
        first.release()
        again = slots.claim("pair", 0, directory)
        again.release()

    def test_layouts(self) -> None:
        """Each topology's stores, endpoints and fault targets."""
        pair = layout("pair", "mpsp0", "10.78.72", "10.78.73")
        self.assertEqual(pair.stores(), {"pair": "pair"})
        self.assertEqual(pair.endpoints("pair"), ["tcp://10.78.72.1:9999", "tcp://10.78.72.2:9999"])
        self.assertEqual(targets(pair).partners, {"h1": "h2", "h2": "h1"})
        self.assertEqual(set(targets(pair).lans), {"lan", "pairlink"})
        pack = layout("pack3", "mpsk0", "10.78.0", "10.78.1")
        self.assertEqual(pack.stores(), {"h1": "alone", "h2": "alone", "h3": "alone"})
        self.assertEqual(len(targets(pack).links), 6)
        mixed = layout("pair-in-pack", "mpsq0", "10.78.144", "10.78.145")
        self.assertEqual(mixed.stores(), {"pair": "pair", "h3": "alone"})
        self.assertEqual(mixed.host_addresses(1), ["10.78.144.1", "10.78.145.1"])
        self.assertEqual(mixed.host_addresses(3), ["10.78.144.3"])
        self.assertRaises(ValueError, layout, "ring", "mpsx0", "10.78.9", "10.78.10")
