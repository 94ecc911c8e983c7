"""
The pack benchmark's brokers, each in its host's network namespace: their
C{twistd malamute} pack arguments (L{pack_arguments}: an open pack, or a
CURVE one with the keys of L{malamute_pack.bench.pack.keys}), many started
at once (L{BrokerProcess.launch}), all stopped and checked (L{stop_all},
L{running}), and their logs followed (L{follow}) and their warnings
gathered (L{notable_lines}: the same line from several brokers once).

Tests: ``tests/system/test_bench_pack.py``.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress

from malamute_pack.bench.pack.common import BEACON, PackBenchError
from malamute_pack.bench.pack.keys import PackKeys
from malamute_pack.bench.pack.logs import DiscoveryWatch, LogFollower, notable
from malamute_pack.testing.brokerprocess import BrokerError, BrokerProcess
from malamute_pack.testing.netns import Host

GOSSIP_PORT = 5680
# Seconds between two reads of the brokers' logs while discovery runs.
POLL = 0.01


def pack_arguments(
    mode: str,
    pack: str,
    host: Host,
    first: Host,
    keys: PackKeys | None = None,
    beacon_port: int | None = None,
) -> list[str]:
    """
    The C{twistd malamute} arguments of the broker on C{host} in a pack
    found by C{mode}: beacons on C{eth0} (on C{beacon_port}, if not the
    default), or gossip served by C{first}'s broker (bound on its address,
    port L{GOSSIP_PORT}) that the others connect to, each with its peer
    endpoint on its host's address.

    With C{keys} the pack is CURVE: every broker is given the pack-keys
    directory (C{--pack-keys}) and its host's secret certificate
    (C{--pack-secret}), and a gossip client the server's public key after
    its endpoint (C{ENDPOINT|KEY}).
    """
    arguments = ["--pack", pack, "--broker-name", host.name]
    if mode == BEACON:
        arguments += ["--beacon", host.interface]
        if beacon_port is not None:
            arguments += ["--beacon-port", str(beacon_port)]
    else:
        gossip = f"tcp://{first.address}:{GOSSIP_PORT}"
        if host is first:
            arguments += ["--gossip-bind", gossip]
        else:
            server = gossip if keys is None else f"{gossip}|{keys.public[first.name]}"
            arguments += ["--gossip-connect", server]
        arguments += ["--peer-endpoint", f"tcp://{host.address}:*"]
    if keys is not None:
        arguments += [
            "--pack-keys",
            str(keys.directory),
            "--pack-secret",
            str(keys.secrets[host.name]),
        ]
    return arguments


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


# The time stamp a log line starts with.
_STAMP = re.compile(r"^\S+T\S+ ")


def notable_lines(brokers: Mapping[str, BrokerProcess]) -> list[str]:
    """
    The warnings, errors and tracebacks the brokers logged, their time
    stamps taken off, in the order first logged: C{NAME: LINE}, or
    C{NAME and K others: LINE} for a line that K + 1 brokers logged (an
    open pack's warning, logged by each of its brokers).
    """
    seen: dict[str, list[str]] = {}
    for name, broker in brokers.items():
        for line in broker.run_log().splitlines():
            if notable(line):
                names = seen.setdefault(_STAMP.sub("", line), [])
                if name not in names:
                    names.append(name)
    lines = []
    for line, names in seen.items():
        others = len(names) - 1
        who = names[0] if not others else f"{names[0]} and {others} other{'s' * (others > 1)}"
        lines.append(f"{who}: {line}")
    return lines


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
