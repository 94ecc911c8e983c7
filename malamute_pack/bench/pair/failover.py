"""
The pair benchmark's fail-over part: a pair under a steady load of
acknowledged letters, its active broker killed (SIGKILL) again and again.

The load (L{letter_load}, a process of its own) is one version 2
L{BlockingClient} that knows both endpoints and sends letters one after
the other, each waiting for its STORED; the body of letter C{i} is
C{str(i)}. It remembers every letter acknowledged (STORED 200) and tells
the runner, over a pipe, how many so far (every L{ACK_REPORT} s) and each
time an acknowledgement comes from another broker than the one before (a
L{Switch}: the last STORED 200 from the old broker and the first from the
new one, C{time.monotonic()}, one clock for every process of the host). A
send cut short by the fail-over (L{BrokerUnreachableError}: the client
holds the letter and sends it when a broker answers) is not counted as
acknowledged: whether it was stored is not known to the sender.

Each cycle (L{measure_failover}): wait until letters are acknowledged by
the active, kill it, wait for the partner's takeover and the load's
L{Switch} to it (the fail-over time is C{first_new - last_old}), start
the killed broker again and wait until it has caught up and the active
says it is in sync; the next cycle kills whichever is active then. After
the last one the load stops and a consumer on the final active reads the
mailbox: every acknowledged letter must be there (L{FailoverResult.lost},
goal 0); letters received twice (a letter re-sent after a switch is
stored again under a new id) and letters received that were never
acknowledged are counted too.

Tests: ``tests/system/test_bench_pair.py``.
"""

from __future__ import annotations

import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from malamute_pack.bench.pair.brokers import SYNC, SetupBrokers
from malamute_pack.client import BlockingClient, BrokerUnreachableError, ClientState, MalamuteError

SENDER = "bench-pair-tx"
MAILBOX = "bench-pair-rx"
SUBJECT = "failover"
# Seconds between the load's reports of letters acknowledged so far.
ACK_REPORT = 0.2
# Pipe messages.
READY, GO, ACKS, SWITCH, STOP, REPORT, FAILED = (
    "ready",
    "go",
    "acks",
    "switch",
    "stop",
    "report",
    "failed",
)


class FailoverError(Exception):
    """The fail-over could not be measured (the load failed, a step timed out)."""


@dataclass(frozen=True, slots=True)
class Switch:
    """Acknowledgements moved from broker C{old} to C{new}."""

    old: str
    new: str
    last_old: float
    first_new: float
    acked: int

    @property
    def secs(self) -> float:
        return self.first_new - self.last_old


@dataclass(frozen=True, slots=True)
class LoadReport:
    """
    @ivar sent: letters the load sent (C{0} to C{sent - 1}).
    @ivar acked: the numbers of the letters acknowledged.
    @ivar unknown: sends cut short by the fail-over (held, sent later).
    @ivar refused: sends the broker refused (any STORED but 200).
    @ivar switches: the client's moves to another endpoint.
    """

    sent: int
    acked: tuple[int, ...]
    unknown: int
    refused: int
    switches: int


def letter_load(endpoints: list[str], client_timeout: float, pipe: Connection) -> None:
    """The body of the load process (see the module)."""
    try:
        client = BlockingClient(
            endpoints, SENDER, timeout=client_timeout, heartbeat=client_timeout / 4
        )
        pipe.send((READY, None))
        kind, _ = pipe.recv()
        if kind != GO:
            raise FailoverError(f"runner sent {kind!r} where {GO!r} was due")
        pipe.send((REPORT, _send_letters(client, pipe)))
        client.close()
    except Exception:
        pipe.send((FAILED, traceback.format_exc()))
    finally:
        pipe.close()


def _send_letters(client: BlockingClient, pipe: Connection) -> LoadReport:
    acked: list[int] = []
    unknown = refused = sent = 0
    last_endpoint = ""
    last_ack = 0.0
    next_report = time.monotonic() + ACK_REPORT
    while not pipe.poll():
        number = sent
        sent += 1
        try:
            client.sendto(MAILBOX, SUBJECT, [str(number).encode()])
        except BrokerUnreachableError:
            unknown += 1
            while client.state is ClientState.DISCONNECTED and not pipe.poll():
                client.pause(0.01)
            continue
        except MalamuteError:
            refused += 1
            continue
        now = time.monotonic()
        endpoint = client.endpoint
        acked.append(number)
        if last_endpoint and endpoint != last_endpoint:
            pipe.send((SWITCH, Switch(last_endpoint, endpoint, last_ack, now, len(acked))))
        last_endpoint, last_ack = endpoint, now
        if now >= next_report:
            pipe.send((ACKS, len(acked)))
            next_report = now + ACK_REPORT
    kind, _ = pipe.recv()
    if kind != STOP:
        raise FailoverError(f"runner sent {kind!r} where {STOP!r} was due")
    return LoadReport(sent, tuple(acked), unknown, refused, client.switches)


class LoadProcess:
    """The runner's side of the load process: start, go, follow its messages, stop."""

    def __init__(self, context: BaseContext, endpoints: list[str], client_timeout: float) -> None:
        self.pipe, theirs = context.Pipe()
        self.process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=letter_load,
            args=(endpoints, client_timeout, theirs),
            name="bench-pair-failover-load",
            daemon=True,
        )
        self.process.start()
        theirs.close()
        self.acks = 0
        self.switches: list[Switch] = []
        self.report: LoadReport | None = None

    def _read(self, timeout: float) -> bool:
        """Handle one message if one comes within C{timeout}; whether one came."""
        if not self.pipe.poll(max(0.0, timeout)):
            return False
        try:
            kind, value = self.pipe.recv()
        except EOFError:
            raise FailoverError(f"the load died (exit code {self.process.exitcode})") from None
        if kind == FAILED:
            raise FailoverError(f"the load failed: {value}")
        if kind == ACKS:
            self.acks = value
        elif kind == SWITCH:
            self.switches.append(value)
            self.acks = value.acked
        elif kind == REPORT:
            self.report = value
        elif kind != READY:
            raise FailoverError(f"the load sent {kind!r}")
        return True

    def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Read messages until C{done()}; L{FailoverError} after C{timeout} seconds."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise FailoverError(f"the load did not {what} within {timeout}s")
            self._read(deadline - time.monotonic())

    def start(self, timeout: float) -> None:
        """Wait until the load has connected, then say go."""
        ready = False
        deadline = time.monotonic() + timeout
        while not ready:
            if not self.pipe.poll(max(0.0, deadline - time.monotonic())):
                raise FailoverError(f"the load did not connect within {timeout}s")
            kind, value = self.pipe.recv()
            if kind == FAILED:
                raise FailoverError(f"the load failed: {value}")
            ready = kind == READY
        self.pipe.send((GO, None))

    def stop(self, timeout: float) -> LoadReport:
        self.pipe.send((STOP, None))
        self.wait_for(lambda: self.report is not None, timeout, "report")
        self.process.join(10)
        assert self.report is not None
        return self.report

    def close(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self.pipe.close()


def read_mailbox(endpoints: list[str], idle: float, client_timeout: float) -> Counter[int]:
    """Every letter in the bench mailbox, by number, read until C{idle} seconds pass without one."""
    received: Counter[int] = Counter()
    with BlockingClient(endpoints, MAILBOX, timeout=client_timeout) as client:
        while (delivery := client.recv(timeout=idle)) is not None:
            received[int(delivery.content[0])] += 1
    return received


@dataclass
class FailoverResult:
    """Every kill's figures and what the consumer found at the end."""

    kills: list[dict[str, str]] = field(default_factory=list)
    sent: int = 0
    acked: int = 0
    lost: int = 0
    duplicates: int = 0
    unacked_delivered: int = 0
    unknown: int = 0
    refused: int = 0

    def times(self) -> list[float]:
        return [float(kill["failover_s"]) for kill in self.kills]

    def summary(self) -> dict[str, str]:
        times = self.times()
        return {
            "kills": str(len(times)),
            "median_s": f"{statistics.median(times):.3f}" if times else "-",
            "max_s": f"{max(times):.3f}" if times else "-",
            "sent": str(self.sent),
            "acked": str(self.acked),
            "lost": str(self.lost),
            "duplicates": str(self.duplicates),
            "unacked_delivered": str(self.unacked_delivered),
            "unknown": str(self.unknown),
            "refused": str(self.refused),
        }

    def lines(self) -> list[str]:
        """C{pair_failover kill=... failover_s=...} lines, then the C{pair_failover_summary} one."""
        pairs = [" ".join(f"{k}={v}" for k, v in kill.items()) for kill in self.kills]
        summary = " ".join(f"{k}={v}" for k, v in self.summary().items())
        return [*(f"pair_failover {p}" for p in pairs), f"pair_failover_summary {summary}"]


def check_letters(result: FailoverResult, report: LoadReport, received: Counter[int]) -> None:
    """Fill C{result}'s counts from the load's report and the letters the consumer received."""
    acked = set(report.acked)
    result.sent = report.sent
    result.acked = len(acked)
    result.unknown = report.unknown
    result.refused = report.refused
    result.lost = len(acked - received.keys())
    result.duplicates = sum(count - 1 for count in received.values() if count > 1)
    result.unacked_delivered = len(received.keys() - acked)


def _cycle(
    pair: SetupBrokers, load: LoadProcess, number: int, dwell: float, timeout: float
) -> dict[str, str]:
    """One kill of the active under load, its takeover and the killed one's rejoin; figures."""
    acks = load.acks
    time.sleep(dwell)
    load.wait_for(lambda: load.acks > acks, timeout, "have letters acknowledged")
    seen = len(load.switches)
    survivor = pair.brokers[pair.partner(pair.active)].endpoint

    def switched() -> Switch | None:
        return next((s for s in load.switches[seen:] if s.new == survivor), None)

    killed_at = time.monotonic()
    killed = pair.kill_active()
    pair.took_over(timeout)
    load.wait_for(lambda: switched() is not None, timeout, "fail over")
    switch = switched()
    assert switch is not None
    rejoin_started = time.monotonic()
    pair.rejoin(killed, timeout)
    return {
        "kill": str(number),
        "killed": killed,
        "failover_s": f"{switch.secs:.3f}",
        "kill_to_ack_s": f"{switch.first_new - killed_at:.3f}",
        "rejoin_s": f"{time.monotonic() - rejoin_started:.3f}",
    }


def measure_failover(
    directory: Path,
    kills: int,
    context: BaseContext,
    *,
    replication: str = SYNC,
    heartbeat_ms: int | None = None,
    client_timeout: float = 1.0,
    dwell: float = 1.0,
    timeout: float = 60.0,
    report: Callable[[str], None] = print,
) -> FailoverResult:
    """
    Kill the active of a pair C{kills} times under load (see the module);
    C{report} gets each kill's line as it is measured.

    @param dwell: seconds of load on the active before each kill, and
        after the last rejoin.
    @param timeout: seconds any one step (takeover, rejoin, fail-over)
        may take before the run is given up.
    """
    result = FailoverResult()
    with SetupBrokers(directory / "failover", replication, heartbeat_ms) as pair:
        load = LoadProcess(context, pair.endpoints, client_timeout)
        try:
            load.start(timeout)
            for number in range(1, kills + 1):
                kill = _cycle(pair, load, number, dwell, timeout)
                result.kills.append(kill)
                report("pair_failover " + " ".join(f"{k}={v}" for k, v in kill.items()))
            time.sleep(dwell)
            letters = load.stop(timeout)
        finally:
            load.close()
        received = read_mailbox([pair.active_endpoint], 3.0, max(client_timeout, 5.0))
        check_letters(result, letters, received)
    return result
