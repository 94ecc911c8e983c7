"""
Hosts on one machine, for system tests and the benchmark: a L{Lan} is N
network namespaces (the hosts) on one /24, each with loopback up and a veth
C{eth0} whose other end is a port of a Linux bridge. The bridge and those
ports live in a namespace of their own, so nothing is added to, or sent on,
the root namespace's interfaces: a UDP broadcast (a ZRE beacon) or a
multicast packet from one host reaches the others through the bridge and
never the machine's real network.

Layout for C{Lan("mpt1", "10.77.21", 3)}::

    namespace mpt1br:  bridge br0, ports mpt1v1 mpt1v2 mpt1v3
    namespace mpt1h1:  lo, eth0 10.77.21.1/24 brd 10.77.21.255
    namespace mpt1h2:  lo, eth0 10.77.21.2/24 ...

Each host also routes multicast (224.0.0.0/4) out of its C{eth0}, so a
multicast sender needs no interface option.

A second Lan can join the hosts of a first (C{Lan("mpt2", "10.77.22", 2,
joins=first, interface="eth1")}): it makes only its bridge's namespace and
gives each of the first C{size} hosts another veth (C{eth1}) on its bridge,
for traffic kept apart from the first Lan's (a pair's link). L{Lan.unplug}
and L{Lan.plug} set a host's bridge port down and up again: that host is
cut off this Lan only (a partition), its interface and addresses kept.

A run killed half way leaves namespaces behind: L{Lan.create} first deletes
every namespace that its prefix names, and L{Lan.destroy} deletes them all
again (deleting a namespace deletes its veths, both ends, and the bridge).
Namespace names are matched exactly (C{mpt1h3}, never C{mpt10h3}), so a Lan
never removes another's. Processes still running in a deleted namespace
keep it alive but unnamed, cut off from any new Lan.

Everything here needs root and the C{ip} command (iproute2):
L{netns_available} says why not, for a test to skip with.

Tests: ``tests/system/test_testing_netns.py``; a joined Lan and unplugged ports in
``tests/system/test_pair_system.py``.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

# Linux's IFNAMSIZ, less the terminating NUL.
IFNAME_MAX = 15

# Every name a Lan makes starts with its prefix, and every prefix with this
# (the project's rule for what a test may create on a shared machine).
PREFIX_START = "mp"
_PREFIX = re.compile(r"^mp[a-z0-9]{0,4}$")

# The name of the bridge (in the bridge's namespace) and of each host's veth.
BRIDGE = "br0"
HOST_INTERFACE = "eth0"


class NetnsError(Exception):
    """An C{ip} command that builds a Lan failed."""


def netns_command(name: str, argv: Sequence[str]) -> list[str]:
    """
    C{argv} run inside the network namespace C{name}. C{ip netns exec}
    execs C{argv} (it does not fork), so the process started has the pid
    of the command itself: signals sent to it reach the command.
    """
    return ["ip", "netns", "exec", name, *argv]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


@functools.cache
def netns_available() -> str | None:
    """
    None if this process can build a L{Lan}, else why not: not root, no
    C{ip} command, or the kernel refuses a namespace or a bridge in it.
    (Checked once per process.)
    """
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need the ip command (iproute2)"
    name = f"mpchk{os.getpid()}"
    try:
        made = _ip("netns", "add", name, check=False)
        if made.returncode != 0:
            return f"ip netns add fails: {made.stderr.strip()}"
        bridge = _ip("-n", name, "link", "add", BRIDGE, "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"cannot make a bridge in a namespace: {bridge.stderr.strip()}"
        return None
    finally:
        _ip("netns", "delete", name, check=False)


def namespaces() -> list[str]:
    """The names of every named network namespace (C{ip netns list})."""
    listed = _ip("netns", "list", check=False)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


class Host:
    """
    One host of a L{Lan}: a network namespace with one address.

    @ivar name: the namespace's name.
    @ivar address: its IPv4 address on the Lan.
    @ivar interface: its veth's name inside the namespace.
    """

    def __init__(self, name: str, address: str, interface: str = HOST_INTERFACE) -> None:
        self.name = name
        self.address = address
        self.interface = interface

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address!r})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """C{argv} run on this host."""
        return netns_command(self.name, argv)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """
        Run C{argv} on this host and wait for it: C{subprocess.run} with
        C{kwargs}, its output captured as text unless told otherwise.
        """
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        done: subprocess.CompletedProcess[str] = subprocess.run(self.command(argv), **kwargs)
        return done

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        """Start C{argv} on this host: C{subprocess.Popen} with C{kwargs}, in text mode."""
        kwargs.setdefault("text", True)
        process: subprocess.Popen[str] = subprocess.Popen(self.command(argv), **kwargs)
        return process


class Lan:
    """
    C{size} hosts on the /24 C{subnet}, joined by a bridge (see the module).

    @ivar prefix: what every name it makes starts with.
    @ivar subnet: the first three octets of its addresses (C{"10.77.21"}).
    @ivar hosts: its hosts, C{f"{prefix}h{i}"} (a joining Lan: the joined
        Lan's hosts' names) with address C{f"{subnet}.{i}"} for i from 1 to
        C{size}.
    @ivar bridge_namespace: the namespace of the bridge.
    @ivar joins: the Lan whose hosts this one joins, or None (it makes its own).
    """

    def __init__(
        self,
        prefix: str,
        subnet: str,
        size: int,
        *,
        joins: Lan | None = None,
        interface: str = HOST_INTERFACE,
    ) -> None:
        """
        @param prefix: 2 to 6 lower-case letters and digits starting with
            C{mp}, and no other Lan's prefix.
        @param joins: another Lan whose first C{size} hosts this one joins
            (see the module), with C{interface}, instead of making hosts.
        @param interface: the name of each host's veth on this Lan.
        @raise ValueError: for a bad prefix or subnet, or a size not in 1..254
            (for a joining Lan, more hosts than C{joins} has, or an
            interface its hosts already have).
        """
        if not _PREFIX.match(prefix):
            raise ValueError(
                f"prefix {prefix!r}: want {PREFIX_START} and at most 4 more letters or digits"
            )
        try:
            network = ipaddress.IPv4Network(f"{subnet}.0/24")
        except ValueError as e:
            raise ValueError(f"subnet {subnet!r}: want three octets, as 10.77.21") from e
        if not 1 <= size <= 254:
            raise ValueError(f"size {size}: want 1 to 254 hosts")
        if joins is not None and size > len(joins.hosts):
            raise ValueError(f"size {size}: the Lan joined has {len(joins.hosts)} hosts")
        if joins is not None and interface == joins.interface:
            raise ValueError(f"interface {interface!r}: the joined Lan's hosts have it already")
        self.prefix = prefix
        self.subnet = subnet
        self.network = network
        self.joins = joins
        self.interface: str = interface
        self.bridge_namespace = f"{prefix}br"
        names: list[str] = (
            [f"{prefix}h{i}" for i in range(1, size + 1)]
            if joins is None
            else [host.name for host in joins.hosts[:size]]
        )
        self.hosts: list[Host] = [
            Host(name, f"{subnet}.{i}", interface) for i, name in enumerate(names, start=1)
        ]
        # A joining Lan owns its bridge's namespace only: the hosts are the other's.
        owned = "br|h[0-9]+" if joins is None else "br"
        self._names = re.compile(rf"^{re.escape(prefix)}(?:{owned})$")

    @property
    def broadcast(self) -> str:
        """The Lan's broadcast address (each host's C{eth0} has it)."""
        return str(self.network.broadcast_address)

    def port(self, index: int) -> str:
        """The name of the bridge port of host C{index} (from 1), in the bridge's namespace."""
        return f"{self.prefix}v{index}"

    def names(self) -> list[str]:
        """Every interface and namespace name it makes (each within IFNAMSIZ)."""
        return [
            self.bridge_namespace,
            BRIDGE,
            *(host.name for host in self.hosts),
            *(self.port(i) for i in range(1, len(self.hosts) + 1)),
            self.interface,
        ]

    def existing(self) -> list[str]:
        """The namespaces that exist now and that this Lan's prefix names."""
        return [name for name in namespaces() if self._names.match(name)]

    def create(self) -> None:
        """
        Make the namespaces, the bridge and the veths, after deleting any
        left by an earlier run with the same prefix; on failure, delete
        what it made and raise.

        @raise NetnsError: an C{ip} command failed (with its message).
        """
        self.destroy()
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise

    def _build(self) -> None:
        bridge_ns = self.bridge_namespace
        _ip("netns", "add", bridge_ns)
        _ip("-n", bridge_ns, "link", "set", "lo", "up")
        _ip("-n", bridge_ns, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", bridge_ns, "link", "set", BRIDGE, "up")
        prefix_length = str(self.network.prefixlen)
        for index, host in enumerate(self.hosts, start=1):
            port = self.port(index)
            if self.joins is None:
                _ip("netns", "add", host.name)
            # Made in the bridge's namespace with its peer born in the host's:
            # neither end ever exists in the root namespace.
            _ip(
                "-n", bridge_ns, "link", "add", port, "type", "veth",
                "peer", "name", host.interface, "netns", host.name,
            )  # fmt: skip
            _ip("-n", bridge_ns, "link", "set", port, "master", BRIDGE)
            _ip("-n", bridge_ns, "link", "set", port, "up")
            if self.joins is None:
                _ip("-n", host.name, "link", "set", "lo", "up")
            _ip(
                "-n", host.name, "address", "add", f"{host.address}/{prefix_length}",
                "broadcast", self.broadcast, "dev", host.interface,
            )  # fmt: skip
            _ip("-n", host.name, "link", "set", host.interface, "up")
            if self.joins is None:
                _ip("-n", host.name, "route", "add", "224.0.0.0/4", "dev", host.interface)

    def unplug(self, index: int) -> None:
        """
        Set host C{index}'s (from 1) bridge port down: it is cut off this
        Lan (its packets and those for it are lost) until L{plug}.

        @raise NetnsError: the C{ip} command failed.
        """
        _ip("-n", self.bridge_namespace, "link", "set", self.port(index), "down")

    def plug(self, index: int) -> None:
        """Set host C{index}'s bridge port up again (after L{unplug})."""
        _ip("-n", self.bridge_namespace, "link", "set", self.port(index), "up")

    def destroy(self) -> None:
        """
        Delete every namespace its prefix names, with their veths and the
        bridge (a joining Lan: its bridge's namespace, whose ports take the
        hosts' veths with them); whatever is already gone is skipped, and
        this never raises for it.
        """
        for name in self.existing():
            _ip("netns", "delete", name, check=False)

    def __enter__(self) -> Lan:
        self.create()
        return self

    def __exit__(self, *error: object) -> None:
        self.destroy()
