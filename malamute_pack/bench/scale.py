"""
The ``scale`` scenario: stream 1:1 while many idle clients are connected
and subscribed, and what those clients cost the broker in memory.

Clients (10,000 by default) are spread over a few swarm processes
(L{SWARMS}), each with one ZeroMQ context whose socket limit and whose
file-descriptor limit (L{raise_fd_limit}) are raised to fit. A swarm opens
all its DEALER sockets and sends every CONNECTION_OPEN (each with an
address of its own, C{scale-N}) before it collects the OKs with one poller,
then likewise sends every STREAM_READ before collecting those OKs: never
one round trip at a time across thousands of sockets. The subscriptions
(100,000 by default, as even as they divide over the clients) mix every
pattern kind our broker knows (L{subscription}) over a few streams, the
bench stream among them, and none matches the bench subject, so no idle
client gets a delivery it never reads. Idle clients send nothing while
they wait, unless told to ping (a broker that expires silent clients:
the C broker, or any external one): then each pings once a
C{ping_interval}, spread over it.

One play (L{measure}), against one broker whose pid is known:

1. stream_1to1 with C{n} messages, no idle clients ("before");
2. the broker's RSS (psutil): the base;
3. the clients connect and open: RSS again (per client: the growth over
   the clients);
4. they subscribe: RSS again (per subscription: that growth over the
   subscriptions);
5. stream_1to1 again with them all idle and connected ("with");
6. they close (each CONNECTION_CLOSE answered) and stream_1to1 runs a
   third time ("after").

The throughput ratio is "with" over the mean of "before" and "after", the
runs on either side of it, so that drift of a shared machine over the
play cancels out rather than counting for or against the clients.

Its line: ``scenario=scale [broker=] [journal=] clients= subscriptions= n=
rss_base_mib= rss_per_client_kib= rss_per_subscription_b=
with_msgs_per_s= without_msgs_per_s= ratio= lost= refused= connect_secs=
subscribe_secs= rss_subscribed_mib= rss_closed_mib= before_msgs_per_s=
after_msgs_per_s=`` (lost: over the three stream runs; refused: OPENs and
READs the broker answered with an error).

A broker of ours refuses clients past its C{max-clients} limit (10,000 by
default) and patterns past C{max-subscriptions} per client (1,000):
L{broker_config} is the config file that lets the bench's own broker hold
the clients and the bench's roles besides.

Tests: ``tests/system/test_bench_scale.py``.
"""

from __future__ import annotations

import contextlib
import math
import resource
import statistics
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from time import monotonic

import psutil
import zmq

from malamute_pack.bench import load
from malamute_pack.bench.scenarios import (
    SCALE,
    SCENARIOS,
    STREAM,
    BenchError,
    Result,
    heading,
    line_of,
    run,
)
from malamute_pack.broker.limits import Limits
from malamute_pack.protocol import mlm

DEFAULT_CLIENTS = 10_000
DEFAULT_SUBSCRIPTIONS = 100_000
# Processes the idle clients are spread over.
SWARMS = 4
# Streams the subscriptions are spread over: the bench stream among them.
STREAMS = (STREAM, "scale-a", "scale-b", "scale-c")
# Seconds a swarm waits for every answer of one phase (10,000 clients may take a while).
PHASE_TIMEOUT = 300.0
# Clients besides the idle ones: the stream roles, the readiness probe.
CLIENT_MARGIN = 64
# File descriptors a socket of a swarm takes: its connection and its mailbox.
FDS_PER_CLIENT = 2

# The runner's commands to a swarm, which answers each with (DONE, Phase).
OPEN, SUBSCRIBE, CLOSE, STOP, DONE = "open", "subscribe", "close", "stop", "done"


def subscription(client: int, slot: int) -> mlm.StreamRead:
    """
    The C{slot}th subscription of idle client C{client}: a pattern of a
    kind picked in turn (a v1 regular expression, C{prefix:}, C{topic:},
    C{mqtt:}, C{nats:}, C{fields:}) on a stream picked in turn, each one
    distinct and none matching the bench subject C{"bench"}.
    """
    tag = f"c{client}s{slot}"
    patterns = (
        f"^{tag}\\.x$",
        f"prefix:{tag}.",
        f"topic:{tag}.*.x",
        f"mqtt:{tag}/+/x",
        f"nats:{tag}.>",
        f"fields:{tag}=1",
    )
    return mlm.StreamRead(STREAMS[slot % len(STREAMS)], patterns[(client + slot) % len(patterns)])


def spread(total: int, parts: int) -> list[int]:
    """C{total} split into C{parts} shares as even as whole numbers allow, larger first."""
    share, extra = divmod(total, parts)
    return [share + (1 if i < extra else 0) for i in range(parts)]


def broker_config(clients: int, subscriptions: int) -> str:
    """
    A config file (ZPL) for a broker of ours that holds C{clients} idle
    clients with C{subscriptions} in all besides the bench's own roles: its
    limits raised where their defaults are too low, never lowered.
    """
    defaults = Limits()
    per_client = math.ceil(subscriptions / clients) if clients else 0
    max_clients = max(defaults.max_clients, clients + CLIENT_MARGIN)
    max_subscriptions = max(defaults.max_subscriptions, per_client)
    return (
        "malamute\n"
        "    limits\n"
        f"        max-clients = {max_clients}\n"
        f"        max-subscriptions = {max_subscriptions}\n"
    )


def raise_fd_limit(wanted: int) -> int:
    """
    Raise this process's soft limit of open files to C{wanted} (its
    children inherit it): up to the hard limit, and the hard limit too
    where this process may (root). The soft limit it ends with.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
            soft, hard = wanted, wanted
    if soft != resource.RLIM_INFINITY and soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


@dataclass(frozen=True, slots=True)
class Phase:
    """
    What one phase of a swarm got back: answers OK, answers ERROR (the
    first one's reason), and how many it waited for in vain.
    """

    ok: int = 0
    refused: int = 0
    reason: str = ""
    missing: int = 0

    def __add__(self, other: Phase) -> Phase:
        return Phase(
            self.ok + other.ok,
            self.refused + other.refused,
            self.reason or other.reason,
            self.missing + other.missing,
        )


def collect(sockets: Sequence[zmq.Socket[bytes]], each: int, timeout: float) -> Phase:
    """
    Wait for C{each} answers (OK or ERROR) on every one of C{sockets}, with
    one poller, for C{timeout} seconds at most; PONGs are skipped.
    """
    poller = zmq.Poller()
    waiting: dict[zmq.Socket[bytes], int] = {}
    for sock in sockets:
        if each:
            poller.register(sock, zmq.POLLIN)
            waiting[sock] = each
    ok = refused = 0
    reason = ""
    deadline = monotonic() + timeout
    while waiting and (left := deadline - monotonic()) > 0:
        for sock, _ in poller.poll(int(min(left, 1.0) * 1000) + 1):
            while sock in waiting:
                try:
                    reply = mlm.decode(sock.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                if isinstance(reply, mlm.Ok):
                    ok += 1
                elif isinstance(reply, mlm.Error):
                    refused += 1
                    reason = reason or f"{reply.status_code} {reply.status_reason}"
                else:
                    continue
                waiting[sock] -= 1
                if not waiting[sock]:
                    del waiting[sock]
                    poller.unregister(sock)
    return Phase(ok, refused, reason, sum(waiting.values()))


class Swarm:
    """
    The idle clients of one swarm process: C{count} DEALER sockets, the
    first one's client number C{first}, in a context of their own.
    """

    def __init__(self, endpoint: str, first: int, count: int, reads: Sequence[int]) -> None:
        """
        @param reads: how many subscriptions each of the C{count} clients makes.
        """
        self.endpoint = endpoint
        self.first = first
        self.reads = list(reads)
        self.context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.context.set(zmq.MAX_SOCKETS, count + CLIENT_MARGIN)
        self.sockets: list[zmq.Socket[bytes]] = []
        self._ping = mlm.encode(mlm.ConnectionPing())
        self._next_ping = 0

    def open(self) -> Phase:
        """Connect every socket, send every CONNECTION_OPEN, then collect the OKs."""
        for i in range(len(self.reads)):
            sock = self.context.socket(zmq.DEALER)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.endpoint)
            self.sockets.append(sock)
            address = f"scale-{self.first + i}"
            sock.send_multipart(mlm.encode(mlm.ConnectionOpen(address=address)))
        return collect(self.sockets, 1, PHASE_TIMEOUT)

    def subscribe(self) -> Phase:
        """Send every client's STREAM_READs, then collect their OKs."""
        for i, (sock, reads) in enumerate(zip(self.sockets, self.reads, strict=True)):
            for slot in range(reads):
                sock.send_multipart(mlm.encode(subscription(self.first + i, slot)))
        sent = set(self.reads)
        if len(sent) == 1:
            return collect(self.sockets, sent.pop(), PHASE_TIMEOUT)
        # Uneven shares: collect the clients with each share apart.
        phase = Phase()
        for share in sorted(sent):
            socks = [s for s, r in zip(self.sockets, self.reads, strict=True) if r == share]
            phase += collect(socks, share, PHASE_TIMEOUT)
        return phase

    def close(self) -> Phase:
        """Send every CONNECTION_CLOSE, collect the OKs, then close the sockets."""
        close = mlm.encode(mlm.ConnectionClose())
        for sock in self.sockets:
            sock.send_multipart(close)
        phase = collect(self.sockets, 1, PHASE_TIMEOUT)
        for sock in self.sockets:
            sock.close(linger=0)
        self.sockets = []
        return phase

    def ping_some(self, slices: int) -> None:
        """Ping the next one of C{slices} slices of the clients and drop what they got."""
        if not self.sockets:
            return
        size = math.ceil(len(self.sockets) / slices)
        start = self._next_ping * size
        for sock in self.sockets[start : start + size]:
            with contextlib.suppress(zmq.Again):
                sock.send_multipart(self._ping, zmq.NOBLOCK)
            while sock.poll(0):
                sock.recv_multipart()
        self._next_ping = (self._next_ping + 1) % slices

    def end(self) -> None:
        for sock in self.sockets:
            sock.close(linger=0)
        self.context.term()


# A pinging swarm pings a tenth of its clients every tenth of its interval.
PING_SLICES = 10


def swarm_main(
    endpoint: str,
    first: int,
    reads: Sequence[int],
    ping_interval: float | None,
    pipe: Connection,
) -> None:
    """
    The body of a swarm process: raise the fd limit, say READY, then run
    each command of the runner (L{OPEN}, L{SUBSCRIBE}, L{CLOSE}) and answer
    it with (L{DONE}, L{Phase}), pinging its clients between commands if
    C{ping_interval} is given, until L{STOP}.
    """
    swarm = None
    try:
        raise_fd_limit(len(reads) * FDS_PER_CLIENT + 256)
        swarm = Swarm(endpoint, first, len(reads), reads)
        pipe.send((load.READY, None))
        phases = {OPEN: swarm.open, SUBSCRIBE: swarm.subscribe, CLOSE: swarm.close}
        while True:
            if ping_interval is None:
                kind, _ = pipe.recv()
            else:
                while not pipe.poll(ping_interval / PING_SLICES):
                    swarm.ping_some(PING_SLICES)
                kind, _ = pipe.recv()
            if kind == STOP:
                break
            pipe.send((DONE, phases[kind]()))
    except Exception:
        pipe.send((load.FAILED, f"swarm of client {first}: {traceback.format_exc()}"))
    finally:
        if swarm is not None:
            swarm.end()
        pipe.close()


@dataclass(frozen=True, slots=True)
class ScaleResult:
    """
    One play of the scale scenario.

    @ivar rss: the broker's RSS in bytes: base, after OPEN, after the
        subscriptions, after the clients closed.
    @ivar before, within, after: the stream_1to1 runs, before the clients
        came, while they were there, after they left.
    @ivar phases: what the clients got back: opening, subscribing, closing.
    @ivar connect_secs, subscribe_secs: from the first OPEN (READ) sent to
        the last answer.
    """

    clients: int
    subscriptions: int
    n: int
    rss: tuple[int, int, int, int]
    before: Result
    within: Result
    after: Result
    phases: tuple[Phase, Phase, Phase]
    connect_secs: float
    subscribe_secs: float
    journal: bool | None = None
    broker: str | None = None

    def figures(self) -> dict[str, str]:
        """Its figures by name, formatted, in the order they print."""
        base, opened, subscribed, closed = self.rss
        mib = 1024 * 1024

        def rate(result: Result) -> float:
            return float(result.figures()["msgs_per_s"])

        without = statistics.fmean((rate(self.before), rate(self.after)))
        runs = (self.before, self.within, self.after)
        per_client = (opened - base) / self.clients / 1024 if self.clients else 0.0
        per_read = (subscribed - opened) / self.subscriptions if self.subscriptions else 0.0
        return heading(SCALE, self.broker, self.journal) | {
            "clients": str(self.clients),
            "subscriptions": str(self.subscriptions),
            "n": str(self.n),
            "rss_base_mib": f"{base / mib:.1f}",
            "rss_per_client_kib": f"{per_client:.2f}",
            "rss_per_subscription_b": f"{per_read:.0f}",
            "with_msgs_per_s": f"{rate(self.within):.0f}",
            "without_msgs_per_s": f"{without:.0f}",
            "ratio": f"{rate(self.within) / without:.2f}" if without else "0",
            "lost": str(sum(int(r.figures()["lost"]) for r in runs)),
            "refused": str(sum(p.refused for p in self.phases[:2])),
            "connect_secs": f"{self.connect_secs:.2f}",
            "subscribe_secs": f"{self.subscribe_secs:.2f}",
            "rss_subscribed_mib": f"{subscribed / mib:.1f}",
            "rss_closed_mib": f"{closed / mib:.1f}",
            "before_msgs_per_s": f"{rate(self.before):.0f}",
            "after_msgs_per_s": f"{rate(self.after):.0f}",
        }

    def line(self) -> str:
        return line_of(self.figures())


class Swarms:
    """The runner's side of the swarm processes: start them, command them all, stop them."""

    def __init__(
        self,
        endpoint: str,
        clients: int,
        subscriptions: int,
        context: BaseContext,
        ping_interval: float | None,
    ) -> None:
        self.pipes: list[Connection] = []
        self.processes: list[BaseProcess] = []
        reads = spread(subscriptions, clients) if clients else []
        first = 0
        for count in spread(clients, min(SWARMS, clients)) if clients else []:
            ours, theirs = context.Pipe()
            process = context.Process(  # type: ignore[attr-defined]
                target=swarm_main,
                args=(endpoint, first, reads[first : first + count], ping_interval, theirs),
                name=f"bench-scale-swarm-{first}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self.pipes.append(ours)
            self.processes.append(process)
            first += count
        self._answers(load.READY)

    def _answers(self, expected: str) -> list[object]:
        values: dict[int, object] = {}
        index = {id(pipe): i for i, pipe in enumerate(self.pipes)}
        while len(values) < len(self.pipes):
            waiting = [p for i, p in enumerate(self.pipes) if i not in values]
            for ready in wait(waiting, timeout=1.0):
                i = index[id(ready)]
                try:
                    kind, value = self.pipes[i].recv()
                except EOFError:
                    code = self.processes[i].exitcode
                    raise BenchError(f"a swarm died (exit code {code})") from None
                if kind != expected:
                    raise BenchError(f"a swarm sent {kind} where {expected} was due: {value}")
                values[i] = value
        return [values[i] for i in range(len(self.pipes))]

    def command(self, kind: str) -> tuple[Phase, float]:
        """Have every swarm run phase C{kind}; what they got in all, and the seconds it took."""
        started = monotonic()
        for pipe in self.pipes:
            pipe.send((kind, None))
        total = Phase()
        for value in self._answers(DONE):
            assert isinstance(value, Phase)
            total += value
        return total, monotonic() - started

    def stop(self) -> None:
        """Tell every swarm to stop and reap it (terminated if it does not)."""
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send((STOP, None))
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in self.pipes:
            pipe.close()


def measure(
    endpoint: str,
    pid: int,
    context: BaseContext,
    *,
    clients: int = DEFAULT_CLIENTS,
    subscriptions: int = DEFAULT_SUBSCRIPTIONS,
    n: int = SCENARIOS[SCALE].default_n,
    ping_interval: float | None = None,
    journal: bool | None = None,
    broker: str | None = None,
) -> ScaleResult:
    """
    Play the scale scenario (see the module) against the broker at
    C{endpoint} whose process is C{pid}.

    @param ping_interval: seconds between the pings of each idle client,
        for a broker that expires silent ones; C{None}: they never ping.
    @raise BenchError: a role or a swarm failed, or the broker did not
        answer every OPEN or READ (refusals are counted, not raised).
    """
    process = psutil.Process(pid)

    def rss() -> int:
        return int(process.memory_info().rss)

    stream = SCENARIOS["stream_1to1"]
    job = load.Job(n)
    swarms = Swarms(endpoint, clients, subscriptions, context, ping_interval)
    try:
        before = run(stream, endpoint, job, context, journal, broker)
        base = rss()
        opened, connect_secs = swarms.command(OPEN)
        _check(opened, "CONNECTION_OPEN")
        rss_opened = rss()
        subscribed, subscribe_secs = swarms.command(SUBSCRIBE)
        _check(subscribed, "STREAM_READ")
        rss_subscribed = rss()
        within = run(stream, endpoint, job, context, journal, broker)
        closed, _ = swarms.command(CLOSE)
        _check(closed, "CONNECTION_CLOSE")
        rss_closed = rss()
        after = run(stream, endpoint, job, context, journal, broker)
    finally:
        swarms.stop()
    return ScaleResult(
        clients,
        subscriptions,
        n,
        (base, rss_opened, rss_subscribed, rss_closed),
        before,
        within,
        after,
        (opened, subscribed, closed),
        connect_secs,
        subscribe_secs,
        journal,
        broker,
    )


def _check(phase: Phase, what: str) -> None:
    if phase.missing:
        raise BenchError(
            f"{phase.missing} {what}s unanswered after {PHASE_TIMEOUT:.0f}s "
            f"({phase.ok} OK, {phase.refused} refused{': ' + phase.reason if phase.reason else ''})"
        )
