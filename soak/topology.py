"""
The brokers of a soak, in network namespaces, for each topology:

- C{pair}: a primary (h1) and a backup (h2) (``--pair``), the pair link
  on a LAN of its own (h1 and h2 only); clients on h3 with both endpoints.
  One store, C{pair}.
- C{pack3}: three brokers (h1, h2, h3) in a CURVE pack (``--pack-keys``,
  beacons on the LAN); clients on h4, each with one broker's endpoint.
  Three stores, C{h1}, C{h2}, C{h3}.
- C{pair-in-pack}: a pair (h1 primary, h2 backup, pair link apart, one
  pack member named C{pair}) and a third broker h3, all in one CURVE pack;
  clients on h4. Two stores, C{pair} and C{h3}.

Every broker binds C{tcp://*:9999} in its host (a namespace of its own:
a fixed port is safe) and has its data directory on a tmpfs of its own
(so that a fault can fill its disk), mounted under the run directory.
L{Layout} is the pure description (names, addresses, stores); L{Cluster}
makes it (L{malamute_pack.testing.netns.Lan},
L{malamute_pack.testing.brokerprocess.BrokerProcess}) and destroys all of
it again, whatever happened (L{Cluster.destroy}).

Tests: ``tests/system/test_soak.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psutil

from malamute_pack.testing.brokerprocess import BrokerError, BrokerProcess
from malamute_pack.testing.netns import Host, Lan
from malamute_pack.transport.curve import write_certificates
from soak.checker import ALONE, PAIR

TOPOLOGIES: Final = ("pack3", "pair", "pair-in-pack")
PORT: Final = 9999
PAIR_PORT: Final = 9998
PACK: Final = "soak"
# The LAN of a pair's own link (its brokers' hosts h1 and h2), apart from the clients' LAN.
PAIR_LAN: Final = "pairlink"
# What the brokers log (malamute_pack/pair/service.py, pack/federation.py,
# journal/service.py, transport/router.py).
ACTIVE: Final = "pair: active; serving clients"
PASSIVE: Final = "pair: passive; catching up from the active"
CAUGHT_UP: Final = "pair: caught up with the active"
IN_SYNC: Final = "pair: the partner is in sync"
BOUND: Final = "Malamute broker bound to"
CANNOT_START: Final = "the broker cannot start"
# The pack's expiry of a silent peer (ms), shorter than ZRE's 30 s, and
# the brokers' expiry of a silent client (ms): a soak's faults last seconds.
PACK_EXPIRED_MS: Final = 6000
CLIENT_TIMEOUT_MS: Final = 3000


# Seconds a group member may hold a record without acknowledging it
# (malamute/limits/group-lease): shorter than the default 30, so that what a
# member stuck behind a fault held goes to another before the soak's quiet
# end (the quiet must be longer: soak.run.QUIET), and longer than the
# nemesis's longest pause (8 s): a broker stopped that long expires every
# lease on resuming (leases count time the broker did not run).
GROUP_LEASE_S: Final = 10


@dataclass(frozen=True, slots=True)
class BrokerSpec:
    """
    One broker: its name (its host's), its host's index on the LAN (from
    1), its store, and its pair role (None for a broker alone).
    """

    name: str
    host: int
    store: str
    role: str | None = None

    @property
    def partner(self) -> str | None:
        """The other broker of its pair (h1 and h2 are a pair's), if it is in one."""
        if self.role is None:
            return None
        return "h2" if self.role == "primary" else "h1"


@dataclass(frozen=True, slots=True)
class Layout:
    """
    A topology's hosts and brokers (see the module): the namespace prefix
    (the pair link's LAN adds C{l}), the LAN's and the pair link's subnets
    (three octets), the brokers, and the clients' host.
    """

    topology: str
    prefix: str
    subnet: str
    pair_subnet: str
    brokers: tuple[BrokerSpec, ...]
    client_host: int
    pack: bool

    @property
    def hosts(self) -> int:
        return self.client_host

    @property
    def paired(self) -> bool:
        return any(b.role is not None for b in self.brokers)

    def broker(self, name: str) -> BrokerSpec:
        return next(b for b in self.brokers if b.name == name)

    def partners(self) -> dict[str, str]:
        """Each paired broker's partner, by name."""
        return {b.name: b.partner for b in self.brokers if b.partner is not None}

    def address(self, host: int) -> str:
        return f"{self.subnet}.{host}"

    def host_addresses(self, host: int) -> list[str]:
        """Every address of a host: on the LAN and, for a pair's, on the pair link."""
        addresses = [self.address(host)]
        if self.paired and host in (1, 2):
            addresses.append(f"{self.pair_subnet}.{host}")
        return addresses

    def stores(self) -> dict[str, str]:
        """Each store's kind (L{PAIR} or L{ALONE})."""
        return {b.store: PAIR if b.role is not None else ALONE for b in self.brokers}

    def store_brokers(self, store: str) -> list[BrokerSpec]:
        return [b for b in self.brokers if b.store == store]

    def endpoints(self, store: str) -> list[str]:
        """A store's client endpoints (a pair's: the primary's first)."""
        ordered = sorted(self.store_brokers(store), key=lambda b: b.role != "primary")
        return [f"tcp://{self.address(b.host)}:{PORT}" for b in ordered]

    def links(self) -> list[tuple[str, str]]:
        """Every two hosts that talk (by host name: h1...): the ones a cut can separate."""
        names = [f"h{i}" for i in range(1, self.hosts + 1)]
        return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]

    def lans(self) -> dict[str, list[str]]:
        """The LANs a host can be unplugged from: C{lan} (every host), C{pairlink} (h1, h2)."""
        lans = {"lan": [f"h{i}" for i in range(1, self.hosts + 1)]}
        if self.paired:
            lans[PAIR_LAN] = ["h1", "h2"]
        return lans


def layout(topology: str, prefix: str, subnet: str, pair_subnet: str) -> Layout:
    """The layout of C{topology} with these names (see L{soak.slots})."""
    brokers: tuple[BrokerSpec, ...]
    if topology == "pair":
        brokers = (BrokerSpec("h1", 1, "pair", "primary"), BrokerSpec("h2", 2, "pair", "backup"))
        return Layout(topology, prefix, subnet, pair_subnet, brokers, 3, pack=False)
    if topology == "pack3":
        brokers = tuple(BrokerSpec(f"h{i}", i, f"h{i}") for i in (1, 2, 3))
        return Layout(topology, prefix, subnet, pair_subnet, brokers, 4, pack=True)
    if topology == "pair-in-pack":
        brokers = (
            BrokerSpec("h1", 1, "pair", "primary"),
            BrokerSpec("h2", 2, "pair", "backup"),
            BrokerSpec("h3", 3, "h3"),
        )
        return Layout(topology, prefix, subnet, pair_subnet, brokers, 4, pack=True)
    raise ValueError(f"unknown topology {topology!r}: one of {', '.join(TOPOLOGIES)}")


@dataclass
class Broker:
    """A running broker of the cluster: its spec, process helper and tmpfs."""

    spec: BrokerSpec
    process: BrokerProcess
    directory: Path
    data_dir: Path
    mounted: bool = False
    launches: int = 0
    # The pids it ran as, in order (its memory is reported per start).
    pids: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def journal_files(self) -> list[Path]:
        """Its journal's files that exist: the database and its write-ahead log."""
        names = ("journal.sqlite", "journal.sqlite-wal")
        return [self.data_dir / n for n in names if (self.data_dir / n).exists()]


class Cluster:
    """
    A layout made real under C{run_dir}: the LANs, a tmpfs per broker, the
    pack's keys, and a L{BrokerProcess} per broker (not started: L{launch}).
    L{destroy} undoes it all (brokers killed, mounts unmounted, namespaces
    deleted), and is safe to call at any point, more than once.
    """

    def __init__(self, spec: Layout, run_dir: Path, disk_mb: int) -> None:
        self.layout = spec
        self.run_dir = run_dir
        self.disk_mb = disk_mb
        self.lan = Lan(spec.prefix, spec.subnet, spec.hosts)
        self.pair_lan: Lan | None = (
            Lan(f"{spec.prefix}l", spec.pair_subnet, 2, joins=self.lan, interface="eth1")
            if spec.paired
            else None
        )
        self.brokers: dict[str, Broker] = {}
        self._cuts: dict[tuple[str, str], list[list[str]]] = {}
        self._unplugged: set[tuple[str, str]] = set()
        self._built = False

    # Making and destroying

    def build(self) -> None:
        """Make the LANs, the tmpfs mounts, the keys and the brokers' helpers."""
        self._built = True
        self.lan.create()
        if self.pair_lan is not None:
            self.pair_lan.create()
        keys = self.run_dir / "keys"
        pack_keys = self.run_dir / "pack-keys"
        config = self.run_dir / "malamute.cfg"
        config.write_text(
            "malamute\n"
            "    pack\n"
            f"        evasive = {PACK_EXPIRED_MS // 3}\n"
            f"        expired = {PACK_EXPIRED_MS}\n"
            "    limits\n"
            f"        group-lease = {GROUP_LEASE_S}\n"
        )
        if self.layout.pack:
            for spec in self.layout.brokers:
                write_certificates(keys, spec.name)
            pack_keys.mkdir(parents=True, exist_ok=True)
            for spec in self.layout.brokers:
                shutil.copy(keys / f"{spec.name}.key", pack_keys)
        for spec in self.layout.brokers:
            directory = self.run_dir / spec.name
            data_dir = directory / "data"
            data_dir.mkdir(parents=True, exist_ok=True)
            broker = Broker(
                spec, self._process(spec, directory, data_dir, config), directory, data_dir
            )
            self.brokers[spec.name] = broker
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={self.disk_mb}m", "tmpfs", str(data_dir)],
                capture_output=True,
                text=True,
            )
            if mounted.returncode != 0:
                raise OSError(f"cannot mount a tmpfs on {data_dir}: {mounted.stderr.strip()}")
            broker.mounted = True

    def _process(
        self, spec: BrokerSpec, directory: Path, data_dir: Path, config: Path
    ) -> BrokerProcess:
        args = ["--config", str(config), "--timeout", str(CLIENT_TIMEOUT_MS)]
        if spec.role is not None:
            index = spec.host
            other = 3 - index
            ps = self.layout.pair_subnet
            args += [
                "--pair", spec.role,
                "--pair-bind", f"tcp://{ps}.{index}:{PAIR_PORT}",
                "--pair-connect", f"tcp://{ps}.{other}:{PAIR_PORT}",
            ]  # fmt: skip
        if self.layout.pack:
            keys = self.run_dir / "keys"
            pack_name = "pair" if spec.role is not None else spec.name
            args += [
                "--pack", PACK, "--broker-name", pack_name, "--beacon", "eth0",
                "--pack-keys", str(self.run_dir / "pack-keys"),
                "--pack-secret", str(keys / f"{spec.name}.key_secret"),
            ]  # fmt: skip
        return BrokerProcess(
            directory,
            bind=f"tcp://*:{PORT}",
            data_dir=data_dir,
            netns=self.host(spec.host).name,
            args=args,
            log=directory / "broker.log",
            ready=BOUND,
        )

    def destroy(self) -> None:
        """Kill every broker, unmount every tmpfs, delete the namespaces (never raises)."""
        for broker in self.brokers.values():
            with contextlib.suppress(Exception):
                self.resume(broker.name)
            with contextlib.suppress(Exception):
                broker.process.kill()
        for broker in self.brokers.values():
            if broker.mounted:
                done = subprocess.run(["umount", str(broker.data_dir)], capture_output=True)
                if done.returncode != 0:
                    subprocess.run(["umount", "-l", str(broker.data_dir)], capture_output=True)
                broker.mounted = False
        if self._built:
            for lan in (self.pair_lan, self.lan):
                if lan is not None:
                    with contextlib.suppress(Exception):
                        lan.destroy()

    def __enter__(self) -> Cluster:
        try:
            self.build()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *error: object) -> None:
        self.destroy()

    # Hosts

    def host(self, index: int) -> Host:
        return self.lan.hosts[index - 1]

    def host_named(self, name: str) -> int:
        return int(name[1:])

    @property
    def client_host(self) -> Host:
        return self.host(self.layout.client_host)

    # Brokers

    def launch(self, name: str) -> None:
        """Start broker C{name} without waiting (a no-op if it runs)."""
        broker = self.brokers[name]
        if broker.process.alive():
            return
        broker.process.launch()
        broker.launches += 1
        broker.pids.append(broker.process.pid)

    def alive(self, name: str) -> bool:
        return self.brokers[name].process.alive()

    def exit_code(self, name: str) -> int | None:
        process = self.brokers[name].process.process
        return None if process is None else process.poll()

    def forget_exit(self, name: str) -> None:
        """Reap a broker that exited by itself (its helper then counts it as stopped)."""
        self.brokers[name].process.kill()

    def kill(self, name: str) -> None:
        """SIGKILL it and reap it (a no-op if it is not running)."""
        self.brokers[name].process.kill()

    def stop(self, name: str, timeout: float = 20.0) -> str | None:
        """SIGTERM and reap; None if it shut down cleanly, else why not (it was killed)."""
        self.resume(name)
        try:
            self.brokers[name].process.stop(timeout)
        except BrokerError as e:
            return str(e).splitlines()[0]
        return None

    def pause(self, name: str) -> bool:
        """SIGSTOP; whether it was running to be paused."""
        return self._signal(name, signal.SIGSTOP)

    def resume(self, name: str) -> bool:
        return self._signal(name, signal.SIGCONT)

    def _signal(self, name: str, signum: int) -> bool:
        process = self.brokers[name].process
        if not process.alive():
            return False
        try:
            os.kill(process.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def run_log(self, name: str) -> str:
        return self.brokers[name].process.run_log()

    def rss(self, name: str) -> int | None:
        """Broker C{name}'s resident memory in bytes, if it runs."""
        process = self.brokers[name].process
        if not process.alive():
            return None
        return process_rss(process.pid)

    # The network

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts C{a} and C{b} (iptables inside both namespaces)."""
        key = (a, b)
        if key in self._cuts:
            return
        rules: list[list[str]] = []
        for here, there in ((a, b), (b, a)):
            for address in self.layout.host_addresses(self.host_named(there)):
                rules.append([here, "INPUT", "-s", address, "-j", "DROP"])
                rules.append([here, "OUTPUT", "-d", address, "-j", "DROP"])
        for rule in rules:
            self._iptables(rule[0], "-I", rule[1:])
        self._cuts[key] = rules

    def heal(self, a: str, b: str) -> None:
        for rule in self._cuts.pop((a, b), []):
            self._iptables(rule[0], "-D", rule[1:], check=False)

    def _iptables(self, host: str, action: str, rule: Sequence[str], check: bool = True) -> None:
        chain, spec = rule[0], list(rule[1:])
        argv = ["iptables", "-w", action, chain, *spec]
        done = self.host(self.host_named(host)).run(argv)
        if check and done.returncode != 0:
            raise OSError(f"{' '.join(argv)} in {host}: {done.stderr.strip()}")

    def unplug(self, lan: str, host: str) -> None:
        """Cut host C{host} off LAN C{lan} (C{lan} or C{pairlink}): its bridge port down."""
        self._lan(lan).unplug(self.host_named(host))
        self._unplugged.add((lan, host))

    def plug(self, lan: str, host: str) -> None:
        self._lan(lan).plug(self.host_named(host))
        self._unplugged.discard((lan, host))

    def _lan(self, name: str) -> Lan:
        if name == PAIR_LAN:
            if self.pair_lan is None:
                raise ValueError("no pair link in this topology")
            return self.pair_lan
        return self.lan

    def heal_all(self) -> None:
        """Every cut healed, every port plugged."""
        for a, b in list(self._cuts):
            self.heal(a, b)
        for lan, host in list(self._unplugged):
            self.plug(lan, host)

    # Disks

    def fill(self, name: str) -> tuple[Path, int]:
        """Fill broker C{name}'s data disk with a file until it is full; the file and its size."""
        broker = self.brokers[name]
        path = broker.data_dir / f"soak-fill-{time.monotonic_ns()}"
        written = 0
        block = b"\0" * (1 << 20)
        with contextlib.suppress(OSError), path.open("wb") as out:
            size = len(block)
            while size >= 512:
                try:
                    out.write(block[:size])
                    out.flush()
                    written += size
                except OSError:
                    size //= 4
        return path, written

    def wipe(self, name: str) -> list[str]:
        """
        Start broker C{name} afresh (as an operator would after it refused
        its damaged journal): its journal files and marker moved aside
        into its run directory; what was moved.
        """
        broker = self.brokers[name]
        aside = broker.directory / f"refused-{time.monotonic_ns()}"
        aside.mkdir()
        moved = []
        for path in sorted(broker.data_dir.glob("journal*")):
            if path.is_file():
                shutil.move(str(path), aside / path.name)
                moved.append(path.name)
        return moved


def process_rss(pid: int) -> int | None:
    """The resident memory of process C{pid} in bytes, or None if it is gone."""
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except (psutil.Error, OSError):
        return None
