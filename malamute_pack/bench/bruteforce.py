"""
``python -m malamute_pack.bench bruteforce``: a brute force of PLAIN
passwords against a broker of ours, what it costs the broker, and how fast
the right user still gets in from the same address.

It starts a broker (L{malamute_pack.testing.brokerprocess}) with a password
file, on ``tcp://127.0.0.1:*``, without a journal, with its management
API on loopback. An attacker process then tries C{--attempts} wrong
passwords for one user from 127.0.0.1, C{--concurrency} at a time, as an
attacker would: each attempt a new ZeroMQ socket with PLAIN credentials
(libzmq does not try again after a refusal), its outcome read from the
socket's monitor. Meanwhile this process logs in as that very user with
the right password, with the project's client
(L{malamute_pack.client.BlockingClient}), again and again until the attack
ends, timing each login (to the broker's OK to CONNECTION_OPEN). The
broker's CPU time (psutil) is read before and after the attack, and
before it, while idle for C{--idle} seconds; its resident memory before
the attack and at its most during it (sampled between the right user's
logins). Afterwards its C{/metrics}
say what its ZAP handler counted. One line::

    bruteforce attempts=N concurrency=C refused= accepted= other= lost= secs=
    attempts_per_s= refusal_wait_p50_ms= refusal_wait_max_ms= right_logins=
    right_refused= right_p50_ms= right_max_ms= broker_cpu_s=
    broker_cpu_share= broker_cpu_ms_per_attempt= idle_cpu_share=
    broker_rss_mb= broker_rss_growth_mb= zap_refused= zap_throttled=
    zap_hurried=

C{broker_cpu_share} is the broker's CPU seconds over the attack's wall
time (from the first attempt to the last refusal): a share of one core.
The attack's wall time includes the throttle's delays, during which the
broker waits; C{broker_cpu_ms_per_attempt} is the cost per attempt
whatever the pace. Measured figures, printed, never asserted here
(``docs/security.md`` quotes them).

Tests: ``tests/system/test_system_bruteforce.py``.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Final

import psutil
import zmq
from prometheus_client.parser import text_string_to_metric_families
from zmq.utils.monitor import recv_monitor_message

from malamute_pack.bench.multicast.counters import cpu_seconds
from malamute_pack.client import BlockingClient, BrokerUnreachableError
from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerProcess

USER: Final = "alice"
PASSWORD: Final = "wonderland"
HTTP: Final = "tcp:0:interface=127.0.0.1"
# An attempt with no outcome after this long is counted as lost.
ATTEMPT_TIMEOUT: Final = 15.0
# How long the right user waits between two of its logins.
LOGIN_PAUSE: Final = 0.1
# How long after the attack is launched the right user first logs in.
LEAD: Final = 0.2
_HANDSHAKE_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@dataclass
class Outcomes:
    """What the attacker's attempts came to."""

    refused: int = 0
    accepted: int = 0
    other: int = 0
    lost: int = 0
    # Seconds from the first attempt to the last outcome.
    secs: float = 0.0
    # Seconds from each refused attempt's connect to its refusal.
    waits: list[float] = field(default_factory=list)


def attack(endpoint: str, attempts: int, concurrency: int, conn: Connection) -> None:
    """
    The attacker's process: says "ready", waits for "go", tries
    C{attempts} wrong passwords for L{USER}, C{concurrency} sockets at a
    time, says "launched" once the first ones are out, and sends its
    L{Outcomes}.
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    # Three sockets an attempt (its DEALER, its monitor's PAIR and libzmq's
    # end of it), and closed ones count until libzmq's reaper has them.
    context.set(zmq.MAX_SOCKETS, context.get(zmq.SOCKET_LIMIT))
    poller = zmq.Poller()
    # monitor: (its DEALER, when that connected)
    live: dict[zmq.Socket[bytes], tuple[zmq.Socket[bytes], float]] = {}
    outcomes = Outcomes()
    opened = 0

    def open_one() -> None:
        nonlocal opened
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt_string(zmq.PLAIN_USERNAME, USER)
        dealer.setsockopt_string(zmq.PLAIN_PASSWORD, f"guess-{opened}")
        monitor = dealer.get_monitor_socket(_HANDSHAKE_EVENTS)
        dealer.connect(endpoint)
        live[monitor] = (dealer, time.monotonic())
        poller.register(monitor, zmq.POLLIN)
        opened += 1

    def close(monitor: zmq.Socket[bytes]) -> None:
        dealer, _ = live.pop(monitor)
        poller.unregister(monitor)
        dealer.disable_monitor()
        monitor.close(linger=0)
        dealer.close(linger=0)

    conn.send("ready")
    conn.recv()
    started = time.monotonic()
    while opened < min(attempts, concurrency):
        open_one()
    conn.send("launched")
    while live:
        for monitor, _ in poller.poll(100):
            event = recv_monitor_message(monitor)
            now = time.monotonic()
            kind, value = event["event"], event["value"]
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH and value == 400:
                outcomes.refused += 1
                outcomes.waits.append(now - live[monitor][1])
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                outcomes.accepted += 1
            else:
                outcomes.other += 1
            close(monitor)
            if opened < attempts:
                open_one()
        now = time.monotonic()
        for monitor, (_, at) in list(live.items()):
            if now - at > ATTEMPT_TIMEOUT:
                outcomes.lost += 1
                close(monitor)
                if opened < attempts:
                    open_one()
    outcomes.secs = time.monotonic() - started
    conn.send(outcomes)
    context.term()


@dataclass
class Result:
    """One brute force's figures (see the module for the line)."""

    attempts: int
    concurrency: int
    outcomes: Outcomes
    broker_cpu_s: float
    idle_cpu_share: float | None
    # Seconds each of the right user's logins took, and how many were refused.
    logins: list[float]
    logins_refused: int
    # The broker's malamute_zap_* counters of the clients' domain, after the attack.
    zap: dict[str, float]
    # The broker's resident memory before the attack, and the most seen during it.
    rss: tuple[int, int]

    @property
    def cpu_share(self) -> float:
        """The broker's CPU over the attack's wall time: a share of one core."""
        return self.broker_cpu_s / self.outcomes.secs if self.outcomes.secs else 0.0

    def line(self) -> str:
        o = self.outcomes
        waits = sorted(o.waits) or [0.0]
        logins = self.logins or [0.0]
        idle = "-" if self.idle_cpu_share is None else f"{self.idle_cpu_share:.3f}"
        figures = {
            "attempts": self.attempts,
            "concurrency": self.concurrency,
            "refused": o.refused,
            "accepted": o.accepted,
            "other": o.other,
            "lost": o.lost,
            "secs": f"{o.secs:.2f}",
            "attempts_per_s": f"{self.attempts / o.secs:.0f}" if o.secs else "0",
            "refusal_wait_p50_ms": f"{statistics.median(waits) * 1000:.0f}",
            "refusal_wait_max_ms": f"{waits[-1] * 1000:.0f}",
            "right_logins": len(self.logins),
            "right_refused": self.logins_refused,
            "right_p50_ms": f"{statistics.median(logins) * 1000:.1f}",
            "right_max_ms": f"{max(logins) * 1000:.1f}",
            "broker_cpu_s": f"{self.broker_cpu_s:.3f}",
            "broker_cpu_share": f"{self.cpu_share:.3f}",
            "broker_cpu_ms_per_attempt": f"{self.broker_cpu_s * 1000 / self.attempts:.3f}",
            "idle_cpu_share": idle,
            "broker_rss_mb": f"{self.rss[0] / 2**20:.1f}",
            "broker_rss_growth_mb": f"{(self.rss[1] - self.rss[0]) / 2**20:.1f}",
        }
        for name in ("refused", "throttled", "hurried"):
            figures[f"zap_{name}"] = f"{self.zap.get(name, 0):.0f}"
        return "bruteforce " + " ".join(f"{k}={v}" for k, v in figures.items())


def zap_metrics(url: str) -> dict[str, float]:
    """The clients' domain's C{malamute_zap_*_total} counters at the management API C{url}."""
    request = urllib.request.Request(f"{url}metrics")
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if (
                name.startswith("malamute_zap_")
                and name.endswith("_total")
                and sample.labels.get("domain") == "client"
            ):
                found[name[len("malamute_zap_") : -len("_total")]] = sample.value
    return found


def right_logins(
    endpoint: str, until: Connection, attacker: BaseProcess, between: Callable[[], object]
) -> tuple[list[float], int]:
    """
    Log in as L{USER} with the right password again and again until
    C{until} has something to read, calling C{between} after each login;
    each login's seconds, and the number refused.

    @raise RuntimeError: if the C{attacker} exits first.
    """
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    times: list[float] = []
    refused = 0
    try:
        while not until.poll(0):
            started = time.monotonic()
            try:
                client = BlockingClient(endpoint, "", plain=(USER, PASSWORD), context=context)
            except BrokerUnreachableError:  # its AuthenticationRefusedError included
                refused += 1
            else:
                times.append(time.monotonic() - started)
                client.close()
            between()
            if not until.poll(LOGIN_PAUSE) and not attacker.is_alive():
                raise RuntimeError(f"the attacker exited (status {attacker.exitcode}) early")
    finally:
        context.term()
    return times, refused


def heard(conn: Connection, process: BaseProcess, word: str, timeout: float = 30.0) -> None:
    """
    Wait for C{process} to say C{word} on C{conn}.

    @raise RuntimeError: if it exits, or says nothing within C{timeout} seconds.
    """
    deadline = time.monotonic() + timeout
    while not conn.poll(0.1):
        if not process.is_alive():
            raise RuntimeError(f"the attacker exited (status {process.exitcode}): see its stderr")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the attacker did not say {word!r} within {timeout}s")
    said = conn.recv()
    if said != word:
        raise RuntimeError(f"the attacker said {said!r}, not {word!r}")


def run(directory: Path, attempts: int, concurrency: int, idle: float) -> Result:
    """Start a broker in C{directory}, brute-force it, stop it: the figures."""
    passwords = directory / "passwords"
    passwords.write_text(f"{USER} = {PASSWORD}\n")
    broker = BrokerProcess(
        directory / "broker",
        bind=ANY_TCP_PORT,
        journal=False,
        args=("--passwords", str(passwords), "--http", HTTP),
        plain=(USER, PASSWORD),
    )
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    broker.start()
    try:
        url = broker.http_url
        idle_share = None
        if idle > 0:
            before = cpu_seconds(broker.pid)
            time.sleep(idle)
            idle_share = (cpu_seconds(broker.pid) - before) / idle
        attacker = spawn.Process(
            target=attack, args=(broker.endpoint, attempts, concurrency, theirs), daemon=True
        )
        attacker.start()
        try:
            heard(ours, attacker, "ready")
            process = psutil.Process(broker.pid)
            rss_before = rss_peak = process.memory_info().rss

            def sample() -> None:
                nonlocal rss_peak
                rss_peak = max(rss_peak, process.memory_info().rss)

            cpu_before = cpu_seconds(broker.pid)
            ours.send("go")
            heard(ours, attacker, "launched")
            time.sleep(LEAD)
            times, refused = right_logins(broker.endpoint, ours, attacker, sample)
            outcomes: Outcomes = ours.recv()
            cpu = cpu_seconds(broker.pid) - cpu_before
            attacker.join(10)
        finally:
            if attacker.is_alive():
                attacker.terminate()
                attacker.join(5)
        zap = zap_metrics(url)
    finally:
        broker.stop()
        ours.close()
        theirs.close()
    rss = (rss_before, rss_peak)
    return Result(attempts, concurrency, outcomes, cpu, idle_share, times, refused, zap, rss)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m malamute_pack.bench bruteforce",
        description="Brute-force PLAIN passwords against a broker of ours while the right"
        " user logs in from the same address; the broker's CPU.",
    )
    parser.add_argument(
        "--attempts", type=int, default=1000, metavar="N", help="wrong passwords (default 1000)"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1000,
        metavar="C",
        help="attempts in flight at once (default 1000)",
    )
    parser.add_argument(
        "--idle",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds the idle broker's CPU is measured first (default 1; 0: not)",
    )
    args = parser.parse_args(argv)
    if args.attempts < 1 or args.concurrency < 1:
        parser.error("--attempts and --concurrency must be at least 1")
    with tempfile.TemporaryDirectory(prefix="malamute-bruteforce-") as directory:
        result = run(Path(directory), args.attempts, args.concurrency, args.idle)
    print(result.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
