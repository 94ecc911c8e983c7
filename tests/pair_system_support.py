"""
Support for the pair's system tests: L{PairCase}, a test with a primary
and a backup broker (``--pair``) on hosts h1 and h2 of a LAN of network
namespaces and clients on h3, the pair link on a second LAN of its own
(h1 and h2 only) so that it can be cut alone; L{ClientJob}, a client
program run on h3 in the background (L{client_main}: the project's
BlockingClient and BulkClient, each acknowledgement written as a JSON
line); and the checks of what was acknowledged against what a broker
serves afterwards (L{check_letters}, L{check_appends}).

Layout (each test method has its own prefix; addresses are the same in
every test, which is harmless: each test's LANs are apart)::

    LAN PREFIX   10.77.41.0/24: h1 .1 (primary), h2 .2 (backup), h3 .3 (clients)
    LAN PREFIXl  10.77.42.0/24: h1 .1, h2 .2 (the pair link, eth1)

Both brokers bind C{tcp://*:9999} (every address of their host: a
floating address added later is served too) and their pair link on
C{tcp://10.77.42.N:9998}. A broker of a pair is ready when it logs its
state, never probed (a probe's CONNECTION_OPEN is a client request).

Tests: ``tests/system/test_pair_system.py``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.testing.brokerprocess import (
    BrokerProcess,
)
from malamute_pack.testing.netns import Host, Lan, netns_available
from tests import client_job
from tests.support import skip_slow

CLIENT_SUBNET = "10.77.41"
PAIR_SUBNET = "10.77.42"
# Fixed ports are safe here: each host is a namespace of its own, with
# nothing else bound in it (and a floating address needs one port on both).
PORT = 9999
PAIR_PORT = 9998

# What a pair's broker logs (malamute_pack/pair/service.py, replication.py).
ACTIVE = "pair: active; serving clients"
PASSIVE = "pair: passive; catching up from the active"
CAUGHT_UP = "pair: caught up with the active"
IN_SYNC = "pair: the partner is in sync"
TAKING_OVER = "pair: taking over from the partner"
SILENT = "pair: the partner is silent"

# The clients' heartbeat and silence timeout (seconds): a fail-over starts
# within 2 s of the active's death, as the pair's own expiry.
CLIENT_HEARTBEAT = 0.5
CLIENT_TIMEOUT = 2.0
# A reader that checks what was kept, after the faults, waits longer: a
# pair's active refuses clients (503) for as long as its partner seems
# silent, which a loaded machine's stalls can make it for seconds.
VERIFY_TIMEOUT = 15.0

Record = dict[str, Any]


# The client programs (run on h3 by ClientJob).


def _emit(record: Record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _stopped(job: Record, started: float) -> bool:
    """Whether a load job must end: its stop file exists, or its count or lifetime is reached."""
    return os.path.exists(job["stop"]) or time.monotonic() - started > job.get("lifetime", 120.0)


def _send_letters(job: Record) -> None:
    """
    Letters (C{kind} mail: sendto; service: sendfor) to C{to}, subjects
    C{prefix} and a number, one at a time (each waits for its STORED),
    until the stop file appears: a line per letter, with its id, or the
    error, and whether the client moved to another endpoint meanwhile.
    """
    from malamute_pack.client.blocking import BlockingClient
    from malamute_pack.client.errors import ClientError

    client = BlockingClient(
        job["endpoints"],
        job["address"],
        timeout=CLIENT_TIMEOUT,
        heartbeat=CLIENT_HEARTBEAT,
        max_held=100_000,
    )
    send = client.sendto if job["kind"] == "mail" else client.sendfor
    started = time.monotonic()
    count = 0
    while not _stopped(job, started) and count < job.get("count", 10**9):
        subject = f"{job['prefix']}{count:06d}"
        before = client.switches, client.reconnects
        try:
            ident = send(job["to"], subject, [subject.encode()])
            record: Record = {"s": subject, "id": ident}
        except ClientError as e:
            record = {"s": subject, "error": f"{type(e).__name__}: {e}"}
        record["moved"] = (client.switches, client.reconnects) != before
        record["at"] = client.endpoint
        record["t"] = time.monotonic()  # the same clock as the test's (one machine)
        _emit(record)
        count += 1
        if job.get("interval"):
            client.pause(job["interval"])
    client.close()
    _emit({"done": count})


def _append(job: Record) -> None:
    """
    Idempotent appends of C{records} records each to C{stream}, keys
    C{prefix} and a number, until the stop file appears: a line per
    append, with the sequence numbers its records got, or the error.
    """
    from malamute_pack.client.bulk import BulkClient
    from malamute_pack.client.errors import ClientError

    client = BulkClient(job["endpoints"], timeout=3.0, retries=8)
    started = time.monotonic()
    count = 0
    while not _stopped(job, started) and count < job.get("count", 10**9):
        key = f"{job['prefix']}{count:06d}"
        records = [(f"{key}.{j}", [f"{key}.{j}".encode()]) for j in range(job["records"])]
        try:
            got = client.append(job["stream"], key, records)
            record: Record = {"key": key, "first": got.first, "last": got.last}
            record["dup"] = got.duplicate
        except ClientError as e:
            record = {"key": key, "error": f"{type(e).__name__}: {e}"}
        record["at"] = client.endpoint
        record["t"] = time.monotonic()
        _emit(record)
        count += 1
    client.close()
    _emit({"done": count})


def _receive(job: Record) -> None:
    """
    Receive as C{address} (a worker of C{service} if given) until every
    subject of C{expect} came and nothing more for C{quiet} seconds, or
    for C{timeout} seconds: one line with every subject received, in order.
    """
    from malamute_pack.client.blocking import BlockingClient

    client = BlockingClient(
        job["endpoints"], job["address"], timeout=VERIFY_TIMEOUT, heartbeat=CLIENT_HEARTBEAT
    )
    if job.get("service"):
        client.set_worker(job["service"], ".*")
    waiting = set(job["expect"])
    subjects: list[str] = []
    deadline = time.monotonic() + job["timeout"]
    last = time.monotonic()
    while time.monotonic() < deadline:
        delivery = client.recv(timeout=0.1)
        if delivery is not None:
            subjects.append(delivery.subject)
            waiting.discard(delivery.subject)
            last = time.monotonic()
        elif not waiting and time.monotonic() - last >= job["quiet"]:
            break
    client.close()
    _emit({"subjects": subjects, "endpoint": client.endpoint})


def _read(job: Record) -> None:
    """Every record of C{stream} from its first: one line of [sequence, subject] pairs."""
    from malamute_pack.client.bulk import BulkClient, RangeChunk

    with BulkClient(job["endpoints"], timeout=VERIFY_TIMEOUT, retries=8) as client:
        status = client.status(job["stream"])
        rows: list[tuple[int, str]] = []
        if status.last >= status.first:
            for item in client.read_range(job["stream"], status.first, status.last):
                if isinstance(item, RangeChunk):
                    rows += zip(item.seq, item.subject, strict=True)
        _emit({"rows": rows, "first": status.first, "last": status.last})


_JOBS = {"mail": _send_letters, "service": _send_letters, "append": _append}
_JOBS.update(receive=_receive, read=_read)


def client_main() -> None:
    """Run the job given as JSON in C{sys.argv[1]} (its C{kind} says which)."""
    job = json.loads(sys.argv[1])
    _JOBS[job["kind"]](job)


_CLIENT = "from tests.pair_system_support import client_main; client_main()"


class ClientJob(client_job.ClientJob):
    """
    A client program (L{client_main}) on a host, its output in a file: a
    load runs until L{stop}; the others end by themselves (L{records}).
    """

    def __init__(self, host: Host, job: Record, directory: Path, name: str) -> None:
        super().__init__(host, job, directory, name, _CLIENT)

    def acknowledged(self) -> int:
        """How many of its letters or appends were acknowledged so far."""
        return sum(1 for r in self.lines() if "id" in r or "first" in r)


# The checks.


@dataclass
class LetterCheck:
    """Letters acknowledged by STORED against the subjects a receiver got."""

    acknowledged: int
    unknown: int  # sends that raised (no STORED seen): may be delivered or not
    missing: list[str] = field(default_factory=list)
    # Received twice or more though sent once and STORED without a move.
    bad_duplicates: list[str] = field(default_factory=list)
    duplicates: int = 0
    unexpected: list[str] = field(default_factory=list)


def longest_wait(records: Sequence[Record], since: float = 0.0) -> float:
    """The longest time between two answers of a load, the second at or after C{since}."""
    times = sorted(r["t"] for r in records if "t" in r)
    gaps = (b - a for a, b in pairwise(times) if b >= since)
    return max(gaps, default=0.0)


def check_letters(sent: Sequence[Record], received: Sequence[str]) -> LetterCheck:
    """
    Every letter STORED 200 must be received; one may be received twice
    only if its send saw the client move (fail-over or reconnection) or
    raised: it was sent again without a STORED. Nothing else is received.
    """
    letters = [r for r in sent if "s" in r]
    acknowledged = {r["s"] for r in letters if "id" in r}
    may_repeat = {r["s"] for r in letters if r.get("moved") or "error" in r}
    counts = Counter(received)
    return LetterCheck(
        acknowledged=len(acknowledged),
        unknown=sum(1 for r in letters if "error" in r),
        missing=sorted(s for s in acknowledged if s not in counts),
        bad_duplicates=sorted(s for s, n in counts.items() if n > 1 and s not in may_repeat),
        duplicates=sum(n - 1 for n in counts.values() if n > 1),
        unexpected=sorted(s for s in counts if s not in {r["s"] for r in letters}),
    )


@dataclass
class AppendCheck:
    """Appends acknowledged against a stream's records read back."""

    acknowledged: int
    records: int
    # Acknowledged records not at the sequence number they were given.
    missing: list[str] = field(default_factory=list)
    # Sequence numbers acknowledged to two appends.
    reused: list[int] = field(default_factory=list)
    # Keys whose records were written more than once.
    written_twice: list[str] = field(default_factory=list)


def check_appends(appended: Sequence[Record], rows: Sequence[Sequence[Any]]) -> AppendCheck:
    """
    Every acknowledged append's records are read back at the sequence
    numbers it got; no sequence number was given to two appends; no key's
    records were written twice.
    """
    at = {int(seq): str(subject) for seq, subject in rows}
    acked = [r for r in appended if "first" in r]
    missing: list[str] = []
    owners: Counter[int] = Counter()
    for r in acked:
        for j, seq in enumerate(range(r["first"], r["last"] + 1)):
            owners[seq] += 1
            want = f"{r['key']}.{j}"
            if at.get(seq) != want:
                missing.append(f"{want}@{seq} (read {at.get(seq)!r})")
    keys = Counter(subject.rsplit(".", 1)[0] for subject in at.values() if subject.endswith(".0"))
    return AppendCheck(
        acknowledged=len(acked),
        records=len(at),
        missing=missing,
        reused=sorted(seq for seq, n in owners.items() if n > 1),
        written_twice=sorted(k for k, n in keys.items() if n > 1),
    )


class PairCase(SynchronousTestCase):
    """
    A pair (h1 primary, h2 backup) and a client host h3 (see the module),
    made before each test method and destroyed after it; the brokers are
    started by the test (L{start_pair}).

    Slow (skipped with C{MALAMUTE_SKIP_SLOW}); skipped where namespaces
    cannot be made (not root, no C{ip}), saying why.

    @cvar PREFIXES: each test method's namespace prefix (at most 4
        characters after C{mp}; the pair LAN adds C{l}).
    """

    skip = skip_slow
    PREFIXES: ClassVar[dict[str, str]] = {}

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        prefix = self.PREFIXES[self._testMethodName]
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.lan = Lan(prefix, CLIENT_SUBNET, 3)
        self.lan.create()
        self.addCleanup(self.lan.destroy)
        self.pair_lan = Lan(f"{prefix}l", PAIR_SUBNET, 2, joins=self.lan, interface="eth1")
        self.pair_lan.create()
        self.addCleanup(self.pair_lan.destroy)
        self.brokers: list[BrokerProcess] = []
        for index, role in ((1, "primary"), (2, "backup")):
            directory = self.base / f"h{index}"
            broker = BrokerProcess(
                directory,
                bind=f"tcp://*:{PORT}",
                data_dir=directory / "data",
                netns=self.lan.hosts[index - 1].name,
                ready="pair: (active|passive)",
                args=[
                    "--pair", role,
                    "--pair-bind", f"tcp://{PAIR_SUBNET}.{index}:{PAIR_PORT}",
                    "--pair-connect", f"tcp://{PAIR_SUBNET}.{3 - index}:{PAIR_PORT}",
                ],
            )  # fmt: skip
            self.brokers.append(broker)
            self.addCleanup(broker.stop, timeout=20.0)

    # Brokers

    def broker(self, index: int) -> BrokerProcess:
        """Broker C{hINDEX} (1 the primary, 2 the backup)."""
        return self.brokers[index - 1]

    def endpoint(self, index: int) -> str:
        """Where clients reach broker C{hINDEX}."""
        return f"tcp://{CLIENT_SUBNET}.{index}:{PORT}"

    @property
    def both(self) -> list[str]:
        """Both brokers' client endpoints, the primary's first (a fail-over client's)."""
        return [self.endpoint(1), self.endpoint(2)]

    def start_pair(self) -> None:
        """Start both; wait until h1 is active and h2 passive and in sync."""
        for broker in self.brokers:
            broker.launch()
        # Generous: beside the unit suite on two cores, a broker's start
        # was seen to take over 30 s.
        self.wait_logs([(1, ACTIVE), (2, CAUGHT_UP), (1, IN_SYNC)], 90.0, "the pair did not form")

    def logs(self) -> str:
        """Both brokers' log tails, for a failure message."""
        return "\n".join(
            f"----- h{i} log -----\n{broker.log_text(5000)}"
            for i, broker in enumerate(self.brokers, start=1)
        )

    def wait_logs(
        self, expected: Sequence[tuple[int, str] | tuple[int, str, int]], timeout: float, what: str
    ) -> float:
        """
        Wait until, for each C{(index, text[, count])}, broker C{hINDEX}
        has logged C{text} (C{count} times, default once) since its latest
        start; the seconds it took.

        @raise AssertionError: not within C{timeout}, or a broker waited on
            died, quoting the logs.
        """
        started = time.monotonic()
        while True:
            missing = [
                f"h{e[0]} has not logged {e[1]!r} {e[2] if len(e) > 2 else 1} time(s)"
                for e in expected
                if self.broker(e[0]).run_log().count(e[1]) < (e[2] if len(e) > 2 else 1)
            ]
            if not missing:
                return time.monotonic() - started
            dead = sorted({f"h{e[0]}" for e in expected if not self.broker(e[0]).alive()})
            if dead or time.monotonic() - started > timeout:
                raise AssertionError(
                    f"{what}: not within {timeout}s (dead: {dead}):\n"
                    + "\n".join(missing)
                    + "\n"
                    + self.logs()
                )
            time.sleep(0.05)

    # Clients on h3

    def client(self, name: str, **job: Any) -> ClientJob:
        """Start a client program on h3 (killed after the test if still running)."""
        started = ClientJob(self.lan.hosts[2], job, self.base, name)
        self.addCleanup(started.kill)
        return started

    def receive(
        self,
        endpoints: Sequence[str],
        address: str,
        expect: Sequence[str],
        service: str | None = None,
        timeout: float = 30.0,
    ) -> list[str]:
        """
        The subjects a client at C{address} (a worker of C{service}) on h3
        receives until it has every one of C{expect}, then 1 s more (late
        duplicates), or C{timeout}.
        """
        job = self.client(
            f"receive-{address}-{time.monotonic_ns()}",
            kind="receive",
            endpoints=list(endpoints),
            address=address,
            service=service,
            expect=list(expect),
            quiet=1.0,
            timeout=timeout,
        )
        subjects: list[str] = job.records(timeout + 30.0)[-1]["subjects"]
        return subjects

    def read_stream(self, endpoints: Sequence[str], stream: str) -> list[list[Any]]:
        """Every record of C{stream} as [sequence, subject], read by a bulk client on h3."""
        job = self.client(
            f"read-{stream}-{time.monotonic_ns()}",
            kind="read",
            endpoints=list(endpoints),
            stream=stream,
        )
        rows: list[list[Any]] = job.records(60.0)[-1]["rows"]
        return rows

    def wait_acknowledged(self, jobs: Sequence[ClientJob], count: int, timeout: float) -> None:
        """Wait until each of C{jobs} has C{count} more acknowledgements than now."""
        targets = [(job, job.acknowledged() + count) for job in jobs]
        deadline = time.monotonic() + timeout
        for job, target in targets:
            while job.acknowledged() < target:
                if job.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"client {job.name}: {job.acknowledged()} acknowledged, not {target}"
                        f" within {timeout}s: {job.stderr()}\n{self.logs()}"
                    )
                time.sleep(0.05)
