"""
The brokers of the pair benchmark (L{malamute_pack.bench.pair}): one setup
is a single broker with its journal or a primary/backup pair
(L{SetupBrokers}), each broker a real ``twistd malamute`` process
(L{BrokerProcess}) with its client endpoint on C{tcp://127.0.0.1:*}.
A L{CURVE} setup is a sync pair whose link is CURVE (C{--pair-key}): each
broker's key pair is made in its data directory before it starts (where a
broker makes it on its first start), and each is given the other's public
certificate.

The pair link needs each broker to know its partner's endpoint before
either starts, so it cannot bind a C{*} port; it uses two abstract ipc
names made fresh for the pair (L{link_endpoints}), which need no port.
A broker of a pair is never probed (a probe's CONNECTION_OPEN is a client
request to its Binary Star): it is started when its log says the pair
service runs, and the setup waits for the log lines that say the pair
formed (the primary active, the partner in sync).

For the fail-over runs the setup knows which broker is active, kills it
(SIGKILL), waits for the survivor's takeover and restarts the killed one,
which rejoins as passive and catches up.

Tests: ``tests/system/test_bench_pair.py``.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from malamute_pack.testing.brokerprocess import ANY_TCP_PORT, BrokerError, BrokerProcess, Started
from malamute_pack.transport.curve import server_secret

SINGLE, SYNC, ASYNC = "single", "sync", "async"
# The setups measured, in the order each round plays them.
MODES = (SINGLE, SYNC, ASYNC)
# A sync pair with a CURVE link (--pair-key), measured against SYNC (--curve).
CURVE = "curve"
CURVE_MODES = (SYNC, CURVE)
PRIMARY, BACKUP = "primary", "backup"

# The brokers' heartbeat timeout for clients: no load process of a run is
# expired for silence (as in the single-broker benchmark).
BROKER_TIMEOUT_MS = 600_000

# Log lines of a pair broker (malamute_pack/pair/service.py, replication.py).
STARTED = r"pair: (primary|backup), replication"
ACTIVE = "pair: active; serving clients"
IN_SYNC = "pair: the partner is in sync"
CAUGHT_UP = "pair: caught up with the active"

# How often a wait for a log line reads the log again.
_POLL = 0.02


def link_endpoints() -> tuple[str, str]:
    """Fresh abstract ipc names for a pair link: the primary's, the backup's."""
    tag = secrets.token_hex(4)
    return (f"ipc://@/malamute-bench-pair-{tag}-a", f"ipc://@/malamute-bench-pair-{tag}-b")


def pair_arguments(
    role: str, bind: str, connect: str, replication: str, heartbeat_ms: int | None = None
) -> list[str]:
    """The C{twistd malamute} options of one broker of a pair."""
    heartbeat = [] if heartbeat_ms is None else ["--pair-heartbeat", str(heartbeat_ms)]
    return [
        "--pair",
        role,
        "--pair-bind",
        bind,
        "--pair-connect",
        connect,
        "--pair-replication",
        replication,
        *heartbeat,
    ]


def wait_count(broker: BrokerProcess, text: str, count: int, timeout: float) -> None:
    """
    Wait until C{text} occurs at least C{count} times in the log of
    C{broker}'s latest run.

    @raise BrokerError: if the broker exits first or C{timeout} passes.
    """
    deadline = time.monotonic() + timeout
    while broker.run_log().count(text) < count:
        if not broker.alive():
            raise BrokerError(f"broker exited before it logged {text!r}:\n{broker.log_text()}")
        if time.monotonic() > deadline:
            raise BrokerError(f"broker did not log {text!r} in time:\n{broker.log_text()}")
        time.sleep(_POLL)


class SetupBrokers(Started):
    """
    The broker(s) of one setup: L{SINGLE}, or a pair replicating L{SYNC}
    or L{ASYNC}, or L{CURVE} (a sync pair with a CURVE link). A context
    manager: started on entry, stopped (cleanly, checked) on exit, killed
    if the block raised.

    @ivar mode: which setup it is.
    @ivar brokers: its brokers by name (C{single}, or C{primary} and C{backup}).
    @ivar active: the name of the broker that serves clients.
    """

    def __init__(self, directory: Path, mode: str, heartbeat_ms: int | None = None) -> None:
        if mode not in (*MODES, CURVE):
            raise ValueError(f"no setup {mode!r}: want one of {', '.join((*MODES, CURVE))}")
        self.mode = mode
        self.brokers: dict[str, BrokerProcess] = {}
        if mode == SINGLE:
            self.brokers[SINGLE] = BrokerProcess(
                directory / SINGLE, bind=ANY_TCP_PORT, timeout_ms=BROKER_TIMEOUT_MS
            )
            self.active = SINGLE
            return
        ends = dict(zip((PRIMARY, BACKUP), link_endpoints(), strict=True))
        replication = SYNC if mode == CURVE else mode
        for role, partner in ((PRIMARY, BACKUP), (BACKUP, PRIMARY)):
            self.brokers[role] = BrokerProcess(
                directory / role,
                bind=ANY_TCP_PORT,
                timeout_ms=BROKER_TIMEOUT_MS,
                ready=STARTED,
                args=pair_arguments(role, ends[role], ends[partner], replication, heartbeat_ms),
            )
        if mode == CURVE:
            # Each broker's key pair where it would make its own, made now:
            # each needs the other's public certificate to start.
            public = {role: server_secret(b.data_dir)[1] for role, b in self.brokers.items()}
            for role, broker in self.brokers.items():
                broker.args = (*broker.args, "--pair-key", str(public[self.partner(role)]))
        self.active = PRIMARY

    @property
    def is_pair(self) -> bool:
        return self.mode != SINGLE

    @property
    def endpoints(self) -> list[str]:
        """Every broker's client endpoint, the primary's first."""
        return [broker.endpoint for broker in self.brokers.values()]

    @property
    def active_endpoint(self) -> str:
        return self.brokers[self.active].endpoint

    def partner(self, name: str) -> str:
        """The other broker of the pair."""
        return BACKUP if name == PRIMARY else PRIMARY

    def start(self, timeout: float = 60.0) -> None:
        """
        Start the broker, or the pair: the primary, then the backup, then
        wait until the primary is active and its partner in sync.
        """
        for broker in self.brokers.values():
            broker.start(timeout)
        if self.is_pair:
            primary = self.brokers[PRIMARY]
            wait_count(primary, ACTIVE, 1, timeout)
            wait_count(primary, IN_SYNC, 1, timeout)

    def kill_active(self) -> str:
        """SIGKILL the active broker; its name (L{active} stays its name until L{took_over})."""
        if not self.is_pair:
            raise BrokerError("a single broker has no partner to take over")
        self.brokers[self.active].kill()
        return self.active

    def took_over(self, timeout: float) -> None:
        """Wait until the partner of the killed active says it is active, and note it."""
        survivor = self.partner(self.active)
        wait_count(self.brokers[survivor], ACTIVE, 1, timeout)
        self.active = survivor

    def rejoin(self, name: str, timeout: float) -> None:
        """
        Start the broker C{name} again and wait until it has caught up with
        the active and the active says it is in sync.
        """
        active = self.brokers[self.active]
        in_sync = active.run_log().count(IN_SYNC)
        broker = self.brokers[name]
        broker.start(timeout)
        wait_count(broker, CAUGHT_UP, 1, timeout)
        wait_count(active, IN_SYNC, in_sync + 1, timeout)

    def stop(self) -> None:
        """Stop every running broker, the passive first; L{BrokerError} unless all stop clean."""
        errors = []
        order = sorted(self.brokers, key=lambda name: name == self.active)
        for name in order:
            try:
                self.brokers[name].stop()
            except BrokerError as e:
                errors.append(f"{name}: {e}")
        if errors:
            raise BrokerError("; ".join(errors))

    def kill(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
