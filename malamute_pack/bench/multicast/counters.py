"""
What the hosts of the multicast benchmark count, read around a run:

- L{UdpFilter}: two iptables rules on a receiving host's INPUT, for UDP
  arriving on its C{eth0}: one that only counts (every packet seen), then,
  for a lossy run, one that drops at random with a given probability
  (C{-m statistic --mode random}). Their packet counters, read with
  C{iptables -L INPUT -v -x -n} (L{rule_packets}), give the loss before
  any repair: dropped over seen.
- L{udp_mib}: the UDP counters of a process's network namespace
  (C{/proc/PID/net/snmp}), where C{RcvbufErrors} counts datagrams the
  kernel dropped for a full socket buffer: a loss too.
- L{interface_bytes}: what an interface of a process's namespace sent
  (C{/proc/PID/net/dev}).
- L{cpu_seconds}: a process's CPU time (psutil).

Tests: ``tests/system/test_bench_multicast.py``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from malamute_pack.testing.netns import Host


class CounterError(Exception):
    """An iptables command failed, or a counter could not be read."""


def rule_packets(listing: str) -> list[int]:
    """
    The packet counter of each rule, in order, from the output of
    C{iptables -L CHAIN -v -x -n} (one chain).
    """
    packets = []
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and fields[1].isdigit():
            packets.append(int(fields[0]))
    return packets


@dataclass(frozen=True, slots=True)
class FilterCounts:
    """UDP packets that reached a host's INPUT on its interface, and those dropped."""

    seen: int
    dropped: int


class UdpFilter:
    """
    The counting rule, and the dropping rule if C{probability} is given,
    on C{host}'s INPUT for UDP arriving on its interface (see the module).
    Each method runs C{iptables} in the host's namespace.
    """

    def __init__(self, host: Host, probability: float | None) -> None:
        if probability is not None and not 0 < probability < 1:
            raise ValueError(f"probability {probability}: want more than 0 and less than 1")
        self.host = host
        self.probability = probability
        self.installed = False

    def rules(self) -> list[list[str]]:
        """Each rule's match and target, in the order they go on INPUT."""
        udp = ["-i", self.host.interface, "-p", "udp"]
        rules = [udp]
        if self.probability is not None:
            chance = f"{self.probability:.6f}"
            rules.append([*udp, "-m", "statistic", "--mode", "random", "--probability", chance])
            rules[-1] += ["-j", "DROP"]
        return rules

    def install(self) -> None:
        for rule in self.rules():
            self._iptables("-A", "INPUT", *rule)
        self.installed = True

    def remove(self) -> None:
        """Delete the rules it installed (a no-op if it installed none)."""
        if not self.installed:
            return
        for rule in self.rules():
            self._iptables("-D", "INPUT", *rule)
        self.installed = False

    def counts(self) -> FilterCounts:
        packets = rule_packets(self._iptables("-L", "INPUT", "-v", "-x", "-n"))
        if len(packets) != len(self.rules()):
            raise CounterError(f"{self.host.name}: INPUT has {len(packets)} rules, not ours")
        return FilterCounts(packets[0], packets[1] if self.probability is not None else 0)

    def _iptables(self, *args: str) -> str:
        try:
            done = self.host.run(["iptables", "-w", *args], timeout=30)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise CounterError(f"{self.host.name}: iptables {' '.join(args)}: {e}") from e
        if done.returncode != 0:
            raise CounterError(
                f"{self.host.name}: iptables {' '.join(args)}: {done.stderr.strip()}"
            )
        return done.stdout


def _proc_net(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/net/{name}").read_text()
    except OSError as e:
        raise CounterError(f"cannot read /proc/{pid}/net/{name}: {e}") from e


def parse_snmp(text: str, protocol: str = "Udp") -> dict[str, int]:
    """The counters of C{protocol} in the text of C{/proc/net/snmp} (a header line, then values)."""
    lines = [line.split() for line in text.splitlines() if line.startswith(f"{protocol}:")]
    if len(lines) < 2:
        raise CounterError(f"no {protocol} counters in the snmp text")
    names, values = lines[0][1:], lines[1][1:]
    return {name: int(value) for name, value in zip(names, values, strict=True)}


def udp_mib(pid: int) -> dict[str, int]:
    """The UDP counters of the network namespace of the process C{pid}."""
    return parse_snmp(_proc_net(pid, "snmp"))


def parse_dev_tx(text: str, interface: str) -> int:
    """Bytes sent by C{interface}, from the text of C{/proc/net/dev}."""
    for line in text.splitlines():
        name, colon, rest = line.partition(":")
        if colon and name.strip() == interface:
            # receive: bytes packets errs drop fifo frame compressed multicast; then transmit
            return int(rest.split()[8])
    raise CounterError(f"no interface {interface} in /proc/net/dev")


def interface_bytes(pid: int, interface: str) -> int:
    """Bytes sent so far by C{interface} of the network namespace of the process C{pid}."""
    return parse_dev_tx(_proc_net(pid, "dev"), interface)


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of the process C{pid} so far."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error as e:
        raise CounterError(f"cannot read the CPU time of {pid}: {e}") from e
    return float(times.user + times.system)
