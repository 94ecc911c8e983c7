"""
The soak's nemesis: a fault schedule drawn from a seed (L{schedule}, a pure
function: the same seed, length and targets give the same schedule), and
L{Nemesis}, which does and undoes each fault on a L{soak.topology.Cluster}
at its time, logging each as it goes, and restarts what dies by itself.

The kinds of fault (L{KINDS}):

- C{kill}: kill -9 a broker, start it again after a while;
- C{pause}: SIGSTOP a broker for 1 to 8 seconds, then SIGCONT;
- C{restart}: stop a broker cleanly (SIGTERM) and start it again;
- C{cut}: drop every packet between two hosts (iptables in both
  namespaces), then heal;
- C{isolate}: set a host's port on a LAN down (the LAN, or a pair's
  link), then up;
- C{disk}: fill a broker's data disk (its own small tmpfs) with a file
  until it is full, hold, delete the file;
- C{damage}: kill -9 a broker, then truncate its journal file (the
  database or its write-ahead log) or flip one bit of it past the file's
  header, and start it again.

Faults arrive at random (gaps of 0.3 to 1.7 times C{interval} seconds) and
may overlap: that is the point. The first of each kind come first (a
damage, the hardest to place, then the others in a drawn order), so that a
short soak still has every kind it has room for.
Rules: the faults that stop or damage a process (kill, pause, restart,
damage) never overlap on one broker; two disk fills never overlap on one
broker, two cuts on one link, two unpluggings of one port; at most one
broker of a pair is damaged at a time, and while it is (and for
L{CATCH_UP} seconds after it is started again, time to catch up from its
partner) its partner is not stopped, paused or damaged; every fault ends
before the soak does. The schedule cannot foresee a broker that stops by
itself (below), nor what a pair does while its link is cut: a damage
whose broker's partner is down, or was started again less than
L{CATCH_UP} seconds ago (L{catching_up}), or is cut off from it, or was
less than L{CATCH_UP} seconds ago (L{PairSeparations}: a cut between the
two, or one of them unplugged from the pair link), when it comes, is done as a
kill alone: the damaged journal may hold the only copy of what it
acknowledged while its partner was away or apart (a backup that took over
from an active it could not hear), which no broker can keep.

A broker that exits by itself (a pair's backup that found itself a second
active exits on purpose, status 75) is started again after a second, as
systemd's C{Restart=always} would. A damaged broker that refuses its
journal at start (its log: C{the broker cannot start}) is reported and
started afresh: its journal moved aside (L{soak.topology.Cluster.wipe}),
as an operator would; the checker excuses what a broker alone so reports
(L{soak.checker}).

Tests: ``tests/unit/test_soak_nemesis.py``.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from soak.checker import JOURNAL, Report
from soak.topology import CANNOT_START, PAIR_LAN, Cluster, Layout

KINDS: Final = ("kill", "pause", "restart", "cut", "isolate", "disk", "damage")
PROCESS_KINDS: Final = frozenset({"kill", "pause", "restart", "damage"})
WEIGHTS: Final = {
    "kill": 3,
    "pause": 3,
    "restart": 1,
    "cut": 3,
    "isolate": 2,
    "disk": 2,
    "damage": 1,
}
# (shortest, longest) seconds each kind of fault lasts.
DURATIONS: Final = {
    "kill": (0.5, 8.0),
    "pause": (1.0, 8.0),
    "restart": (0.5, 3.0),
    "cut": (2.0, 15.0),
    "isolate": (2.0, 12.0),
    "disk": (3.0, 12.0),
    "damage": (1.0, 8.0),
}
# Seconds at the start of a soak without faults: the clients connect.
WARM_UP: Final = 4.0
# Seconds after a fault on a broker ends before another may start there
# (it starts again meanwhile).
GRACE: Final = 3.0
# Seconds after a damaged pair broker starts again during which its
# partner is left alone: time to catch up from it.
CATCH_UP: Final = 20.0
# Bytes of a file's header that damage never touches (SQLite's database
# header; a write-ahead log's).
HEADERS: Final = {"journal.sqlite": 100, "journal.sqlite-wal": 32}


@dataclass(frozen=True, slots=True)
class Targets:
    """What faults can hit: brokers (with their pair partners), host links, LAN ports."""

    brokers: tuple[str, ...]
    partners: Mapping[str, str]
    links: tuple[tuple[str, str], ...]
    lans: Mapping[str, tuple[str, ...]]


def targets(spec: Layout) -> Targets:
    """A layout's targets."""
    return Targets(
        tuple(b.name for b in spec.brokers),
        spec.partners(),
        tuple(spec.links()),
        {lan: tuple(hosts) for lan, hosts in spec.lans().items()},
    )


@dataclass(frozen=True, slots=True)
class Fault:
    """
    One fault: its number, kind, when it starts and ends (seconds after
    the soak started), what it hits (a broker; two hosts; a LAN and a
    host) and its parameters (a damage's file, how, where).
    """

    n: int
    kind: str
    start: float
    end: float
    target: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "fault": self.n,
            "kind": self.kind,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "target": list(self.target),
            "params": self.params,
        }


def catching_up(launched_at: float | None, alive: bool, now: float) -> bool:
    """
    Whether a pair's partner may lack what its broker acknowledged while it
    was away: it is down, or was started less than L{CATCH_UP} seconds ago
    (C{launched_at}, None if the soak started it) and may still be catching up.
    """
    return not alive or (launched_at is not None and now - launched_at < CATCH_UP)


class PairSeparations:
    """
    Which pairs' brokers cannot talk (a cut between them, or one of them
    unplugged from the pair link), and since when they can again: either
    may have acknowledged alone what the other lacks (a backup that took
    over from an active it could not hear).
    """

    def __init__(self, partners: Mapping[str, str]) -> None:
        self._partners = partners
        self._apart: Counter[frozenset[str]] = Counter()  # faults keeping them apart now
        self._rejoined: dict[frozenset[str], float] = {}

    def _pair(self, kind: str, target: Sequence[str]) -> frozenset[str] | None:
        if kind == "cut":
            a, b = target
        elif kind == "isolate" and target[0] == PAIR_LAN:
            a, b = target[1], self._partners.get(target[1], "")
        else:
            return None  # unplugged from the clients' LAN: the pair link still joins them
        return frozenset((a, b)) if self._partners.get(a) == b else None

    def begin(self, kind: str, target: Sequence[str]) -> None:
        pair = self._pair(kind, target)
        if pair is not None:
            self._apart[pair] += 1

    def end(self, kind: str, target: Sequence[str], now: float) -> None:
        pair = self._pair(kind, target)
        if pair is not None and self._apart[pair] > 0:
            self._apart[pair] -= 1
            if not self._apart[pair]:
                del self._apart[pair]
                self._rejoined[pair] = now

    def cut_off(self, a: str, b: str, now: float) -> bool:
        """Whether C{a} and C{b} are apart now, or were less than L{CATCH_UP} seconds ago."""
        pair = frozenset((a, b))
        rejoined = self._rejoined.get(pair)
        return pair in self._apart or (rejoined is not None and now - rejoined < CATCH_UP)


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


class _Planner:
    """The faults placed so far, and whether a new one keeps the rules (see the module)."""

    def __init__(self, where: Targets) -> None:
        self.where = where
        self.placed: list[tuple[str, tuple[str, ...], float, float]] = []

    def fits(self, kind: str, target: tuple[str, ...], start: float, end: float) -> bool:
        partners = self.where.partners
        for other_kind, other_target, other_start, other_end in self.placed:
            both_process = kind in PROCESS_KINDS and other_kind in PROCESS_KINDS
            margin = 0.0
            if target == other_target and (both_process or kind == other_kind):
                pass
            elif (
                both_process
                and "damage" in (kind, other_kind)
                and partners.get(target[0]) == other_target[0]
            ):
                # One of a pair damaged: its partner is left alone from
                # before the damage until it caught up again afterwards.
                margin = CATCH_UP
            else:
                continue
            if _overlaps((start - margin, end + GRACE + margin), (other_start, other_end + GRACE)):
                return False
        return True

    def take(self, kind: str, target: tuple[str, ...], start: float, end: float) -> None:
        self.placed.append((kind, target, start, end))


def _candidates(kind: str, where: Targets) -> list[tuple[str, ...]]:
    if kind in PROCESS_KINDS or kind == "disk":
        return [(b,) for b in where.brokers]
    if kind == "cut":
        return [tuple(link) for link in where.links]
    return [(lan, host) for lan, hosts in where.lans.items() for host in hosts]


def _params(kind: str, rng: random.Random) -> dict[str, Any]:
    if kind != "damage":
        return {}
    return {
        "file": rng.choice(("journal.sqlite", "journal.sqlite-wal")),
        "how": rng.choice(("truncate", "flip")),
        "at": round(rng.random(), 6),
        "bit": rng.randrange(8),
    }


def schedule(
    seed: int,
    duration: float,
    where: Targets,
    interval: float = 6.0,
    kinds: Sequence[str] = KINDS,
) -> list[Fault]:
    """
    The faults of a soak of C{duration} seconds (see the module), of
    C{kinds} only: the same for the same arguments, another for another
    seed. None comes in the first L{WARM_UP} seconds (the clients connect).
    """
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: want some of {', '.join(KINDS)}")
    rng = random.Random(f"soak-nemesis-{seed}")
    planner = _Planner(where)
    first = [k for k in KINDS if k in kinds]
    rng.shuffle(first)
    if "damage" in first:
        # The hardest to place (a pair's partner is left alone around it) first.
        first.remove("damage")
        first.insert(0, "damage")
    weights = [WEIGHTS[k] for k in first]
    kinds = list(first)
    faults: list[Fault] = []
    t = WARM_UP
    while True:
        t += interval * rng.uniform(0.3, 1.7)
        if t >= duration - 1.0:
            break
        wanted = [*first, rng.choices(kinds, weights)[0]]
        for kind in wanted:
            shortest, longest = DURATIONS[kind]
            # Cut short to end inside the soak, if it can still last its shortest.
            end = min(t + rng.uniform(shortest, longest), duration - 1.0)
            if end - t < shortest:
                continue
            options = _candidates(kind, where)
            rng.shuffle(options)
            target = next((o for o in options if planner.fits(kind, o, t, end)), None)
            if target is None:
                continue
            planner.take(kind, target, t, end)
            faults.append(Fault(len(faults) + 1, kind, t, end, target, _params(kind, rng)))
            if kind in first:
                first.remove(kind)
            break
    return faults


def damage_file(path: Path, how: str, at: float, bit: int) -> dict[str, Any]:
    """
    Truncate C{path} at fraction C{at} of its bytes past the header, or
    flip bit C{bit} of the byte there; what was done.
    """
    header = HEADERS.get(path.name, 100)
    size = path.stat().st_size
    if size <= header:
        return {"file": path.name, "size": size, "done": "nothing: no bytes past the header"}
    offset = header + int(at * (size - header))
    if how == "truncate":
        with path.open("r+b") as f:
            f.truncate(offset)
        return {"file": path.name, "size": size, "truncated_to": offset}
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
    return {"file": path.name, "size": size, "flipped": offset, "bit": bit}


# What a broker logs when it will not start on its journal: the journal
# service's line, or the start-up's for a failure later in opening (the
# pack's origin marks read from a damaged file).
_REFUSED: Final = re.compile(re.escape(CANNOT_START) + r"|startup#critical\] malamute: journal ")
# A refusal that waiting cures: the disk is full (a fill fault), or the
# partner's data directory lock is still held by an exiting process.
_WAIT: Final = re.compile(r"disk is full|SQLITE_FULL|No space left", re.IGNORECASE)


@dataclass
class _BrokerState:
    down: set[int] = field(default_factory=set)  # faults that keep it stopped
    paused: set[int] = field(default_factory=set)
    damaged: bool = False
    relaunch_at: float | None = None
    launched_at: float | None = None  # when the nemesis last started it
    exits: int = 0


class Nemesis:
    """
    Does and undoes a schedule on a cluster (L{step}, called often), logs
    each fault and what the brokers did meanwhile (C{faults.jsonl} lines),
    and restarts what died by itself. L{heal} ends every fault at once.

    @ivar reports: what brokers said they cannot serve (for the checker).
    @ivar started: faults started, by kind.
    @ivar events: counts of the brokers' own doings (exits, refusals, wipes).
    """

    def __init__(self, cluster: Cluster, faults: Sequence[Fault], log: IO[str], t0: float) -> None:
        self.cluster = cluster
        self.pending = sorted(faults, key=lambda f: f.start)
        self.active: list[Fault] = []
        self.log = log
        self.t0 = t0
        self.state = {name: _BrokerState() for name in cluster.brokers}
        self.reports: list[Report] = []
        self.started: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.fills: dict[int, Path] = {}
        self.separations = PairSeparations(cluster.layout.partners())

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, phase: str, **fields: Any) -> None:
        line = {"time": round(self.now(), 3), "phase": phase, **fields}
        self.log.write(json.dumps(line) + "\n")
        self.log.flush()

    # Running the schedule

    def step(self) -> None:
        """Start and end what is due; restart what died by itself."""
        now = self.now()
        for fault in sorted(self.active, key=lambda f: f.end):
            if fault.end <= now:
                self.active.remove(fault)
                self.end(fault)
        while self.pending and self.pending[0].start <= now:
            fault = self.pending.pop(0)
            self.begin(fault)
            self.active.append(fault)
        self.supervise()

    def heal(self) -> None:
        """End every fault now (the rest of the schedule is dropped), then heal everything."""
        self.pending.clear()
        for fault in sorted(self.active, key=lambda f: f.end):
            self.end(fault)
        self.active.clear()
        self.cluster.heal_all()
        for name, state in self.state.items():
            state.down.clear()
            state.paused.clear()
            self.cluster.resume(name)
            if state.relaunch_at is not None:
                state.relaunch_at = min(state.relaunch_at, self.now())
        self.supervise()

    def begin(self, fault: Fault) -> None:
        self.started[fault.kind] += 1
        detail: dict[str, Any] = {}
        target = fault.target
        cluster = self.cluster
        if fault.kind in ("kill", "damage", "restart"):
            name = target[0]
            self.state[name].down.add(fault.n)
            cluster.resume(name)
            if fault.kind == "restart":
                detail["stopped"] = cluster.stop(name) or "cleanly"
            else:
                detail["was_running"] = cluster.alive(name)
                cluster.kill(name)
            if fault.kind == "damage":
                partner = cluster.layout.broker(name).partner
                now = self.now()
                if partner is not None and (
                    catching_up(self.state[partner].launched_at, cluster.alive(partner), now)
                    or self.separations.cut_off(name, partner, now)
                ):
                    detail["damage"] = (
                        f"not done: its partner {partner} is down, catching up from it"
                        " (started again by itself) or cut off from it, so its journal may"
                        " be the only copy"
                    )
                else:
                    detail.update(self.damage(name, fault.params))
        elif fault.kind == "pause":
            name = target[0]
            detail["was_running"] = cluster.pause(name)
            self.state[name].paused.add(fault.n)
        elif fault.kind == "cut":
            cluster.cut(target[0], target[1])
            self.separations.begin(fault.kind, target)
        elif fault.kind == "isolate":
            cluster.unplug(target[0], target[1])
            self.separations.begin(fault.kind, target)
        elif fault.kind == "disk":
            path, written = cluster.fill(target[0])
            self.fills[fault.n] = path
            detail["filled_bytes"] = written
        self.note("start", **fault.as_json(), detail=detail)

    def damage(self, name: str, params: Mapping[str, Any]) -> dict[str, Any]:
        broker = self.cluster.brokers[name]
        files = {p.name: p for p in broker.journal_files()}
        path = files.get(str(params["file"])) or files.get("journal.sqlite")
        if path is None:
            return {"done": "nothing: no journal file yet"}
        self.state[name].damaged = True
        return damage_file(path, str(params["how"]), float(params["at"]), int(params["bit"]))

    def end(self, fault: Fault) -> None:
        target = fault.target
        cluster = self.cluster
        detail: dict[str, Any] = {}
        if fault.kind in ("kill", "damage", "restart"):
            state = self.state[target[0]]
            state.down.discard(fault.n)
            if not state.down:
                self.launch(target[0])
        elif fault.kind == "pause":
            state = self.state[target[0]]
            state.paused.discard(fault.n)
            if not state.paused:
                detail["resumed"] = cluster.resume(target[0])
        elif fault.kind == "cut":
            cluster.heal(target[0], target[1])
            self.separations.end(fault.kind, target, self.now())
        elif fault.kind == "isolate":
            cluster.plug(target[0], target[1])
            self.separations.end(fault.kind, target, self.now())
        elif fault.kind == "disk":
            path = self.fills.pop(fault.n, None)
            if path is not None:
                path.unlink(missing_ok=True)
        self.note("end", fault=fault.n, kind=fault.kind, target=list(target), detail=detail)

    # Brokers that stop by themselves

    def launch(self, name: str) -> None:
        self.cluster.launch(name)
        self.state[name].relaunch_at = None
        self.state[name].launched_at = self.now()
        self.note("launch", broker=name)

    def supervise(self) -> None:
        """Start again every broker that should run and does not (see the module)."""
        now = self.now()
        for name, state in self.state.items():
            if state.down or self.cluster.alive(name):
                continue
            if state.relaunch_at is None:
                self.stopped_by_itself(name, state, now)
            if state.relaunch_at is not None and now >= state.relaunch_at:
                self.launch(name)

    def stopped_by_itself(self, name: str, state: _BrokerState, now: float) -> None:
        code = self.cluster.exit_code(name)
        log = self.cluster.run_log(name)
        self.cluster.forget_exit(name)
        refused = next((ln for ln in log.splitlines() if _REFUSED.search(ln)), None)
        state.exits += 1
        if refused is None:
            self.events["exits"] += 1
            tail = log.strip().splitlines()[-3:]
            self.note("exit", broker=name, code=code, tail=tail)
            state.relaunch_at = now + 1.0
            return
        if _WAIT.search(refused) or not state.damaged:
            self.events["refusals"] += 1
            self.note("refused", broker=name, code=code, line=refused.strip())
            state.relaunch_at = now + 2.0
            return
        spec = self.cluster.layout.broker(name)
        report = Report(now, name, spec.store, JOURNAL, refused.strip())
        self.reports.append(report)
        moved = self.cluster.wipe(name)
        state.damaged = False
        self.events["journals refused and started afresh"] += 1
        self.note("report", broker=name, store=spec.store, scope=JOURNAL, line=report.line)
        self.note("wipe", broker=name, moved=moved)
        state.relaunch_at = now
