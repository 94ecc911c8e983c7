"""
The pack benchmark's brokers, each in its host's network namespace: their
C{twistd malamute} pack arguments (L{pack_arguments}), many started at once
(L{BrokerProcess.launch}), all stopped and checked (L{stop_all}, L{running}), and their
logs followed (L{follow}, L{notable_lines}).

Tests: ``tests/test_bench_pack.py``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress

from malamute_pack.bench.brokerprocess import BrokerError, BrokerProcess
from malamute_pack.bench.netns import Host
from malamute_pack.bench.pack.common import BEACON, PackBenchError
from malamute_pack.bench.pack.logs import DiscoveryWatch, LogFollower, notable

GOSSIP_PORT = 5680
# Seconds between two reads of the brokers' logs while discovery runs.
POLL = 0.01


def pack_arguments(mode: str, pack: str, host: Host, first: Host) -> list[str]:
    """
    The C{twistd malamute} arguments of the broker on C{host} in a pack
    found by C{mode}: beacons on C{eth0}, or gossip served by C{first}'s
    broker (bound on its address, port L{GOSSIP_PORT}) that the others
    connect to, each with its peer endpoint on its host's address.
    """
    arguments = ["--pack", pack, "--broker-name", host.name]
    if mode == BEACON:
        return [*arguments, "--beacon", host.interface]
    gossip = f"tcp://{first.address}:{GOSSIP_PORT}"
    discovery = ["--gossip-bind" if host is first else "--gossip-connect", gossip]
    return [*arguments, *discovery, "--peer-endpoint", f"tcp://{host.address}:*"]


def stop_all(brokers: Sequence[BrokerProcess], timeout: float = 60.0) -> None:
    """
    SIGTERM every running broker at once, then reap each and check it shut
    down cleanly (L{BrokerProcess.stop}).

    @raise BrokerError: one did not (after every one is stopped).
    """
    for broker in brokers:
        if broker.process is not None and broker.process.poll() is None:
            broker.process.send_signal(signal.SIGTERM)
    errors = []
    for broker in brokers:
        if broker.process is not None:
            with suppress(subprocess.TimeoutExpired):
                broker.process.wait(timeout)
        try:
            broker.stop(timeout=1.0)
        except BrokerError as e:
            errors.append(f"{broker.directory.name}: {e}")
    if errors:
        raise BrokerError("\n".join(errors))


@contextmanager
def running(brokers: Sequence[BrokerProcess]) -> Iterator[None]:
    """Stop the brokers (checked) when the block ends; kill them if it raised."""
    try:
        yield
    except BaseException:
        for broker in brokers:
            broker.kill()
        raise
    stop_all(brokers)


def notable_lines(brokers: Mapping[str, BrokerProcess]) -> list[str]:
    """The warnings, errors and tracebacks each broker logged, as C{NAME: LINE}."""
    return [
        f"{name}: {line}"
        for name, broker in brokers.items()
        for line in broker.run_log().splitlines()
        if notable(line)
    ]


def follow(
    brokers: Mapping[str, BrokerProcess],
    watch: DiscoveryWatch,
    until: Callable[[], bool],
    timeout: float,
) -> None:
    """
    Feed C{watch} the brokers' log lines, stamped when read, until C{until()}
    or C{timeout} seconds; L{PackBenchError} if a broker exits meanwhile.
    """
    followers = {name: LogFollower(broker.log) for name, broker in brokers.items()}
    deadline = time.monotonic() + timeout
    while True:
        now = time.monotonic()
        for name, follower in followers.items():
            for line in follower.new_lines():
                watch.feed(name, line, now)
        if until() or now > deadline:
            return
        for name, broker in brokers.items():
            if not broker.alive():
                raise PackBenchError(f"broker {name} exited:\n{broker.log_text()}")
        time.sleep(POLL)
