"""
The pack benchmark's third part: what each broker of a formed pack sends
its peers while a client process on every host (L{state_main}) connects
clients with addresses (the directory), then has each read a (stream,
pattern) of its own (the interests) (L{measure_traffic}). A host's figure
is its C{eth0} tx counters (L{tx_counters}, from C{/proc/PID/net/dev} of
its broker) over the phase, less the idle rate measured just before;
L{TrafficResult} holds them for one pack (open or CURVE) and makes their
table and the median broker's figures.

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from malamute_pack.bench.pack.common import CLIENT_ENDPOINT, OPEN, PackBenchError
from malamute_pack.bench.pack.figures import show, table
from malamute_pack.protocol import mlm
from malamute_pack.testing.brokerprocess import BrokerProcess, checkout_environment, python_command
from malamute_pack.testing.netns import Host

# Seconds after the last client's "done" before a traffic phase's counters are read.
TRAFFIC_TAIL = 1.0


@dataclass
class TrafficRow:
    """What one host sent for one phase, its idle rate taken off."""

    host: str
    idle_bytes_per_s: float
    directory_bytes: float = 0.0
    directory_packets: float = 0.0
    interest_bytes: float = 0.0
    interest_packets: float = 0.0


@dataclass
class TrafficResult:
    mode: str
    brokers: int
    entries: int
    window_secs: float
    security: str = OPEN
    rows: list[TrafficRow] = field(default_factory=list)

    def per_entry(self, value: float) -> float:
        return value / self.entries if self.entries else 0.0

    def per_entry_peer(self, value: float) -> float:
        peers = self.brokers - 1
        return value / (self.entries * peers) if self.entries and peers else 0.0

    def lines(self) -> list[str]:
        headers = [
            "host",
            "idle_B/s",
            "dir_B",
            "dir_pkts",
            "dir_B/entry",
            "dir_B/entry/peer",
            "int_B",
            "int_pkts",
            "int_B/entry",
            "int_B/entry/peer",
        ]

        def cells(label: str, r: TrafficRow) -> list[str]:
            return [
                label,
                show(r.idle_bytes_per_s),
                show(r.directory_bytes),
                show(r.directory_packets),
                show(self.per_entry(r.directory_bytes)),
                show(self.per_entry_peer(r.directory_bytes), 1),
                show(r.interest_bytes),
                show(r.interest_packets),
                show(self.per_entry(r.interest_bytes)),
                show(self.per_entry_peer(r.interest_bytes), 1),
            ]

        rows = [cells(r.host, r) for r in self.rows]
        middle = self.median_row()
        if middle is not None:
            rows.append(cells("median", middle))
        return table(headers, rows)

    def figures(self) -> dict[str, float]:
        """The median broker's idle B/s, and B per entry for the directory and the interests."""
        middle = self.median_row()
        if middle is None:
            return {}
        return {
            "idle B/s": middle.idle_bytes_per_s,
            "directory B/entry": self.per_entry(middle.directory_bytes),
            "interest B/entry": self.per_entry(middle.interest_bytes),
        }

    def median_row(self) -> TrafficRow | None:
        """Each figure's median over the hosts (None without hosts)."""
        if not self.rows:
            return None

        def mid(attribute: str) -> float:
            return float(statistics.median(getattr(r, attribute) for r in self.rows))

        return TrafficRow(
            "median",
            mid("idle_bytes_per_s"),
            mid("directory_bytes"),
            mid("directory_packets"),
            mid("interest_bytes"),
            mid("interest_packets"),
        )


def parse_net_dev(text: str, interface: str) -> tuple[int, int]:
    """The (tx bytes, tx packets) of C{interface} in a C{/proc/net/dev} text."""
    for line in text.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == interface:
            fields = counters.split()
            return int(fields[8]), int(fields[9])
    raise PackBenchError(f"no interface {interface} in /proc/net/dev")


def tx_counters(broker: BrokerProcess, interface: str) -> tuple[float, int, int]:
    """(now, tx bytes, tx packets) of C{interface} in the broker's network namespace."""
    text = Path(f"/proc/{broker.pid}/net/dev").read_text()
    now = time.monotonic()
    sent, packets = parse_net_dev(text, interface)
    return now, sent, packets


_STATE_MAIN = "from malamute_pack.bench.pack.traffic import state_main; state_main()"
ADDRESSES, READERS = "addresses", "readers"


def _commands(sockets: Sequence[zmq.Socket[bytes]], messages: Sequence[mlm.Message]) -> None:
    """Send each socket its message, then wait for every OK (an ERROR exits)."""
    for socket, message in zip(sockets, messages, strict=True):
        socket.send_multipart(mlm.encode(message))
    for socket, message in zip(sockets, messages, strict=True):
        while True:
            if not socket.poll(30_000):
                sys.exit(f"no answer to {mlm.MESSAGE_NAMES[message.ID]}")
            reply = mlm.decode(socket.recv_multipart())
            if isinstance(reply, mlm.Error):
                sys.exit(f"{message} refused: {reply.status_code} {reply.status_reason}")
            if isinstance(reply, mlm.Ok):
                break


def state_main() -> None:
    """
    The traffic phase's client process on one host: C{argv} is the broker's
    endpoint, the host's name and the number of entries. Says "loaded",
    then for each line on stdin: C{addresses} opens that many clients, each
    with an address of its own; C{readers} has each read a (stream,
    pattern) of its own; it says "done COMMAND" once the broker has
    answered every one. It holds its clients until stdin closes.
    """
    endpoint, host, entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sockets: list[zmq.Socket[bytes]] = []
    print("loaded", flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == ADDRESSES:
            for _ in range(entries):
                socket = context.socket(zmq.DEALER)
                socket.setsockopt(zmq.LINGER, 0)
                socket.connect(endpoint)
                sockets.append(socket)
            opens = [mlm.ConnectionOpen(address=f"{host}-a{j}") for j in range(entries)]
            _commands(sockets, opens)
        elif command == READERS:
            reads = [mlm.StreamRead(f"s-{host}", f"^p{j}$") for j in range(entries)]
            _commands(sockets, reads)
        else:
            sys.exit(f"unknown command {command!r}")
        print(f"done {command}", flush=True)
    for socket in sockets:
        socket.close(linger=0)
    context.term()


def _expect(clients: Mapping[str, subprocess.Popen[str]], expected: str) -> None:
    for name, client in clients.items():
        assert client.stdout is not None
        said = client.stdout.readline().strip()
        if said != expected:
            raise PackBenchError(f"client on {name} said {said!r}, not {expected!r}")


def measure_traffic(
    options: argparse.Namespace,
    mode: str,
    hosts: Sequence[Host],
    brokers: Mapping[str, BrokerProcess],
    security: str = OPEN,
) -> TrafficResult:
    """
    What each broker of a C{security} pack sends its peers for its
    clients' addresses, then their readers.
    """
    result = TrafficResult(mode, len(hosts), options.entries, options.traffic_secs, security)
    interface = hosts[0].interface
    clients = {
        host.name: subprocess.Popen(
            python_command(
                host.name, "-c", _STATE_MAIN, CLIENT_ENDPOINT, host.name, str(options.entries)
            ),
            env=checkout_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for host in hosts
    }
    try:
        _expect(clients, "loaded")
        # The last joins' resynchronisations are over before the idle baseline.
        time.sleep(TRAFFIC_TAIL)
        before = {name: tx_counters(b, interface) for name, b in brokers.items()}
        time.sleep(options.traffic_secs)
        after = {name: tx_counters(b, interface) for name, b in brokers.items()}
        rates = {}
        for name in brokers:
            (then, sent, packets), (now, sent_now, packets_now) = before[name], after[name]
            rates[name] = ((sent_now - sent) / (now - then), (packets_now - packets) / (now - then))
        rows = {name: TrafficRow(name, rates[name][0]) for name in brokers}
        for phase in (ADDRESSES, READERS):
            start = {name: tx_counters(b, interface) for name, b in brokers.items()}
            began = time.monotonic()
            for client in clients.values():
                assert client.stdin is not None
                client.stdin.write(f"{phase}\n")
                client.stdin.flush()
            _expect(clients, f"done {phase}")
            end = max(began + options.traffic_secs, time.monotonic() + TRAFFIC_TAIL)
            time.sleep(max(0.0, end - time.monotonic()))
            stop = {name: tx_counters(b, interface) for name, b in brokers.items()}
            for name in brokers:
                secs = stop[name][0] - start[name][0]
                extra_bytes = stop[name][1] - start[name][1] - rates[name][0] * secs
                extra_packets = stop[name][2] - start[name][2] - rates[name][1] * secs
                row = rows[name]
                if phase == ADDRESSES:
                    row.directory_bytes, row.directory_packets = extra_bytes, extra_packets
                else:
                    row.interest_bytes, row.interest_packets = extra_bytes, extra_packets
        result.rows = list(rows.values())
    finally:
        for client in clients.values():
            if client.stdin is not None:
                client.stdin.close()
        for client in clients.values():
            try:
                client.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(client.pid, signal.SIGKILL)
                client.wait()
            if client.stdout is not None:
                client.stdout.close()
    return result
