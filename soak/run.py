"""
One soak from start to end (L{run}): claim names (L{soak.slots}), make the
topology (L{soak.topology.Cluster}), start its brokers and wait until they
serve, start the clients (L{soak.workload}, L{soak.client}), run the
nemesis (L{soak.nemesis}) for the soak's length while sampling memory
(L{soak.memory}); then heal everything and start every broker, let the
load finish (an append not yet acknowledged is tried until it is, for a
while), wait until the readers are quiet, read every store's stream back
(the final reads), stop the brokers, and check (L{soak.checker}) and
report (L{soak.report}).

Everything made is destroyed on the way out, whatever happens: SIGINT
and SIGTERM interrupt the run (the clients are killed by their pids, the
brokers too, the tmpfs mounts unmounted, the namespaces deleted).

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

from malamute_pack.testing.brokerprocess import (
    PROJECT_ROOT,
    checkout_environment,
    python_command,
)
from malamute_pack.testing.netns import Host
from soak import checker, history, nemesis, report, slots, workload
from soak.memory import Sampler
from soak.topology import ACTIVE, BOUND, PASSIVE, Cluster, layout, process_rss

# Seconds the readers must have received nothing before the final reads,
# and the longest the end waits for that.
QUIET: Final = 15.0
END_WAIT: Final = 300.0
MIB: Final = 2**20


@dataclass(frozen=True)
class Settings:
    """What a soak runs (the command's options, L{soak.__main__})."""

    topology: str
    seed: int
    seconds: float
    out: Path
    keep: bool = False
    slot: int | None = None
    interval: float = 6.0
    pause: float = 0.1
    disk_mb: int = 128
    broker_rss_mb: int = 512
    client_rss_mb: int = 256
    quiet: float = QUIET
    kinds: tuple[str, ...] = nemesis.KINDS
    extra: tuple[str, ...] = field(default_factory=tuple)

    def command(self) -> str:
        """The command that replays this soak's seed."""
        minutes = self.seconds / 60
        whole = self.seconds >= 60 and minutes == round(minutes, 3)
        length = f"--minutes {minutes:g}" if whole else f"--seconds {self.seconds:g}"
        return (
            shlex.join(["scripts/soak", "--seed", str(self.seed), "--topology", self.topology])
            + f" {length}"
            + "".join(f" {shlex.quote(a)}" for a in self.extra)
        )


class ClientProcess:
    """A L{soak.client} process on a host: its job, history file and stop file."""

    def __init__(self, host: Host, job: dict[str, Any], directory: Path, t0: float) -> None:
        self.name = str(job["process"])
        self.kind = str(job["kind"])
        self.host = host
        self.out = directory / f"{self.name}.jsonl"
        self.err = directory / f"{self.name}.err"
        self.stop_file = directory / f"{self.name}.stop"
        self.job = {**job, "out": str(self.out), "stop": str(self.stop_file), "t0": t0}
        self.out.touch()
        self.incarnation = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        job = {**self.job, "incarnation": self.incarnation}
        with self.err.open("ab") as err:
            return subprocess.Popen(
                python_command(self.host.name, "-m", "soak.client", json.dumps(job)),
                cwd=PROJECT_ROOT,
                env=checkout_environment(PYTHONUNBUFFERED="1"),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
            )

    def restart(self) -> None:
        """Start it again after it died: it goes on from its history file (L{soak.client})."""
        self.process.wait()
        self.incarnation += 1
        self.process = self._start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process.poll() is None else None

    def size(self) -> int:
        try:
            return self.out.stat().st_size
        except OSError:
            return 0

    def stop(self) -> None:
        self.stop_file.touch()

    def wait(self, timeout: float) -> bool:
        """Wait for it to exit; whether it did (else it is killed)."""
        try:
            self.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            self.kill()
            return False

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived."""


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise L{Interrupted} meanwhile (so that cleanups run)."""

    def raise_(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signal.Signals(signum).name)

    old = {s: signal.signal(s, raise_) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def pair_state(log: str) -> str:
    """
    What a pair's broker last said it is in its latest run's log: C{active},
    C{passive} or C{starting} (its state file may be stale: a full disk
    keeps it from being written).
    """
    active, passive = log.rfind(ACTIVE), log.rfind(PASSIVE)
    if active < 0 and passive < 0:
        return "starting"
    return "active" if active > passive else "passive"


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", flush=True)


class Soak:
    """One run (see the module)."""

    def __init__(self, settings: Settings, names: slots.Names) -> None:
        self.settings = settings
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.run_dir = (
            settings.out / f"{settings.topology}-seed{settings.seed}-{stamp}-{os.getpid()}"
        ).resolve()
        self.run_dir.mkdir(parents=True)
        self.layout = layout(settings.topology, names.prefix, names.subnet, names.pair_subnet)
        self.cluster = Cluster(self.layout, self.run_dir, settings.disk_mb)
        self.clients: list[ClientProcess] = []
        self.t0 = time.monotonic()
        self.sampler = Sampler(self.locate, process_rss, self.t0)
        self.faults_log: IO[str] | None = None
        self.nemesis: nemesis.Nemesis | None = None
        self.started_wall = datetime.now(UTC).isoformat(timespec="seconds")

    def locate(self) -> Iterator[tuple[str, str, int | None]]:
        for name, broker in self.cluster.brokers.items():
            process = broker.process
            yield name, "broker", process.pid if process.alive() else None
        for client in self.clients:
            yield client.name, "client", client.pid

    # Phases

    def start_brokers(self) -> None:
        for name in self.cluster.brokers:
            self.cluster.launch(name)
        deadline = time.monotonic() + 60.0
        while not self.serving():
            if time.monotonic() > deadline:
                raise RuntimeError("the brokers did not start within 60 s:\n" + self.log_tails())
            for name in self.cluster.brokers:
                if not self.cluster.alive(name):
                    raise RuntimeError(f"broker {name} exited at start:\n" + self.log_tails())
            time.sleep(0.2)

    def serving(self) -> bool:
        """Every broker runs and has bound; a pair has one active and one passive."""
        for name in self.cluster.brokers:
            if not self.cluster.alive(name) or BOUND not in self.cluster.run_log(name):
                return False
        for store, kind in self.layout.stores().items():
            if kind != checker.PAIR:
                continue
            states = sorted(
                pair_state(self.cluster.run_log(b.name)) for b in self.layout.store_brokers(store)
            )
            if states != ["active", "passive"]:
                return False
        return True

    def log_tails(self) -> str:
        return "\n".join(
            f"----- {name} -----\n{b.process.log_text(3000)}"
            for name, b in self.cluster.brokers.items()
        )

    def start_clients(self) -> None:
        directory = self.run_dir / "clients"
        directory.mkdir()
        for job in workload.jobs(self.layout, self.settings.seed, self.settings.pause):
            self.clients.append(ClientProcess(self.cluster.client_host, job, directory, self.t0))

    def soak(self) -> None:
        settings = self.settings
        faults = nemesis.schedule(
            settings.seed,
            settings.seconds,
            nemesis.targets(self.layout),
            settings.interval,
            settings.kinds,
        )
        (self.run_dir / "schedule.json").write_text(
            json.dumps([f.as_json() for f in faults], indent=1) + "\n"
        )
        self.faults_log = (self.run_dir / "faults.jsonl").open("a")
        self.nemesis = nemesis.Nemesis(self.cluster, faults, self.faults_log, self.t0)
        say(
            f"{settings.topology} seed {settings.seed}: {len(faults)} faults in "
            f"{settings.seconds:g} s, {len(self.clients)} clients; in {self.run_dir}"
        )
        end = self.t0 + settings.seconds
        next_note = time.monotonic() + 30.0
        while time.monotonic() < end:
            self.nemesis.step()
            self.sampler.step()
            self.check_clients()
            if time.monotonic() >= next_note:
                next_note += 30.0
                self.progress()
            time.sleep(0.05)

    def check_clients(self) -> None:
        """
        A client that died before it was told to stop (a crash of its own,
        not a fault of the soak's) is logged and started again: it goes on
        from its history (the same consumer, group member, keys and ids).
        """
        assert self.nemesis is not None
        for client in self.clients:
            code = client.process.poll()
            if code is not None and not client.stop_file.exists():
                tail = client.err.read_text(errors="replace").strip().splitlines()[-3:]
                self.nemesis.note("client-exit", client=client.name, code=code, tail=tail)
                self.nemesis.events["client crashes (restarted)"] += 1
                why = " | ".join(tail)[-200:]
                say(f"client {client.name} exited with {code} ({why}): restarted")
                client.restart()

    def progress(self) -> None:
        assert self.nemesis is not None
        started = ", ".join(f"{k} {v}" for k, v in sorted(self.nemesis.started.items()))
        down = [n for n in self.cluster.brokers if not self.cluster.alive(n)]
        say(
            f"t={time.monotonic() - self.t0:.0f}s faults: {started or 'none yet'}; "
            f"brokers down: {', '.join(down) or 'none'}; history "
            f"{sum(c.size() for c in self.clients) // 1024} KiB"
        )

    def heal(self) -> None:
        assert self.nemesis is not None
        say("healing: every fault ended, every broker started")
        self.nemesis.heal()
        deadline = time.monotonic() + 60.0
        while not self.serving():
            self.nemesis.step()
            if time.monotonic() > deadline:
                say("the brokers are not all serving after 60 s; going on anyway")
                break
            time.sleep(0.2)

    def finish_load(self) -> None:
        load = [c for c in self.clients if c.kind in workload.LOAD_KINDS]
        for client in load:
            client.stop()
        deadline = time.monotonic() + 90.0
        for client in load:
            while client.process.poll() is None and time.monotonic() < deadline:
                self.tick()
            if not client.wait(0.1):
                say(f"client {client.name} did not finish its load in time: killed")

    def tick(self) -> None:
        assert self.nemesis is not None
        self.nemesis.step()
        self.sampler.step()
        self.check_clients()
        time.sleep(0.1)

    def wait_quiet(self) -> None:
        readers = [c for c in self.clients if c.kind in workload.READER_KINDS]
        started = time.monotonic()
        sizes = [c.size() for c in readers]
        changed = time.monotonic()
        while time.monotonic() - changed < self.settings.quiet:
            if time.monotonic() - started > END_WAIT:
                say(f"the readers were not quiet within {END_WAIT:g} s: reading back anyway")
                break
            self.tick()
            now = [c.size() for c in readers]
            if now != sizes:
                sizes, changed = now, time.monotonic()
        for client in readers:
            client.stop()
        for client in readers:
            client.wait(30.0)

    def final_reads(self) -> None:
        job = workload.final_job(self.layout)
        final = ClientProcess(self.cluster.client_host, job, self.run_dir / "clients", self.t0)
        self.clients.append(final)
        deadline = time.monotonic() + 600.0
        while final.process.poll() is None and time.monotonic() < deadline:
            self.tick()
        final.wait(0.1)

    def stop_brokers(self) -> dict[str, str]:
        self.sampler.sample()
        unclean = {}
        for name in self.cluster.brokers:
            why = self.cluster.stop(name)
            if why is not None:
                unclean[name] = why
        return unclean

    def check(self, unclean: dict[str, str]) -> tuple[dict[str, Any], list[history.Event]]:
        assert self.nemesis is not None
        events = history.merge(history.read(c.out) for c in self.clients)
        limits = {"broker": self.settings.broker_rss_mb, "client": self.settings.client_rss_mb}
        rules = rules_for(self.settings.topology, limits)
        result = checker.check(events, self.nemesis.reports, self.sampler.samples, rules)
        data = report.summary(
            run={
                "topology": self.settings.topology,
                "seed": self.settings.seed,
                "seconds": self.settings.seconds,
                "command": self.settings.command(),
                "started": self.started_wall,
                "elapsed_s": round(time.monotonic() - self.t0, 1),
                "run_dir": str(self.run_dir),
                "namespace_prefix": self.layout.prefix,
                "unclean_stops": unclean,
                "rss_limits_mib": limits,
            },
            result=result,
            faults=self.nemesis.started,
            broker_events=self.nemesis.events,
            reports=self.nemesis.reports,
            samples=self.sampler.samples,
            restarts={n: b.launches for n, b in self.cluster.brokers.items()},
        )
        return data, events

    def keep_data(self) -> None:
        """Copy each broker's data directory (its tmpfs) beside its log, for a failed run."""
        for broker in self.cluster.brokers.values():
            if broker.mounted:
                subprocess.run(
                    ["cp", "-a", str(broker.data_dir), str(broker.directory / "data-at-end")],
                    capture_output=True,
                )

    def kill_clients(self) -> None:
        for client in self.clients:
            client.kill()

    def run(self) -> int:
        """The whole soak; its exit status (0 passed, 1 violations)."""
        try:
            self.cluster.build()
            self.start_brokers()
            # Times are from here: the load's start (the schedule's too).
            self.t0 = self.sampler.t0 = time.monotonic()
            self.sampler.sample()
            self.start_clients()
            self.soak()
            self.heal()
            self.finish_load()
            self.wait_quiet()
            self.final_reads()
            unclean = self.stop_brokers()
            data, events = self.check(unclean)
            report.write(self.run_dir, events, data, self.sampler.samples)
            if not data["passed"]:
                self.keep_data()
        finally:
            # A second Ctrl-C must not cut the cleanup short.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, signal.SIG_IGN)
            self.kill_clients()
            self.cluster.destroy()
            if self.faults_log is not None:
                self.faults_log.close()
        passed = bool(data["passed"])
        if passed and not self.settings.keep:
            report.prune(self.run_dir)
        print(report.text(data), flush=True)
        return 0 if passed else 1


def rules_for(topology: str, limits_mib: dict[str, int]) -> checker.Rules:
    """The checker's rules for a topology, with memory limits in MiB per kind of process."""
    stores = layout(topology, "mps", "10.78.0", "10.78.1").stores()
    return checker.Rules(
        stores,
        {kind: mib * MIB for kind, mib in limits_mib.items()},
        numbered_groups=len(stores) == 1,
        groups_exactly_once=len(stores) == 1,
    )


def recheck(run_dir: Path) -> int:
    """
    Check a kept run directory again (its history, fault log and memory
    samples) with this checker, without running anything: print the
    summary, write it as C{recheck.json}; 0 if it passes, else 1.
    """
    first = json.loads((run_dir / "summary.json").read_text())
    events = history.read(run_dir / "history.jsonl")
    reports = [
        checker.Report(f["time"], f["broker"], f["store"], f["scope"], f["line"])
        for f in map(json.loads, (run_dir / "faults.jsonl").read_text().splitlines())
        if f.get("phase") == "report"
    ]
    samples = report.read_samples(run_dir / "memory.jsonl")
    limits = first.get("rss_limits_mib", {"broker": 512, "client": 256})
    result = checker.check(events, reports, samples, rules_for(first["topology"], limits))
    run = {k: first[k] for k in ("topology", "seed", "seconds", "command") if k in first}
    data = report.summary(
        run={**run, "run_dir": str(run_dir), "rechecked": True},
        result=result,
        faults=first.get("faults", {}),
        broker_events=first.get("broker_events", {}),
        reports=reports,
        samples=samples,
        restarts={n: m.get("starts", 0) for n, m in first["memory"]["brokers"].items()},
    )
    if not samples:
        data["memory"] = first["memory"]
    (run_dir / "recheck.json").write_text(json.dumps(data, indent=1) + "\n")
    print(report.text(data), flush=True)
    return 0 if result.ok else 1


def run(settings: Settings) -> int:
    """Run a soak (see the module); its exit status."""
    claim = slots.claim(settings.topology, settings.slot)
    try:
        with interruptible():
            soak = Soak(settings, claim.names)
            try:
                return soak.run()
            except Interrupted as e:
                print(f"soak: interrupted ({e}); everything it made is removed", file=sys.stderr)
                return 130
    finally:
        claim.release()
