"""
System tests of the multicast bridges (``docs/multicast.md``): real
brokers (``twistd malamute``, and ``twistd malamute-bridge`` for a proxy)
on the hosts of a LAN of network namespaces, joined over PGM (``epgm://``)
or NORM, with real clients (the project's BlockingClient) writing and
reading over TCP on those hosts. What the bridges promise, checked end to
end: every reader of a receiving broker, whatever its pattern kind, gets
exactly the records it matches, once, in order, content intact; a receiver
cut off the LAN for longer than PGM can repair, or restarted after a
kill -9, repairs the rest from the origin's journal over TCP; PGM repairs
random loss by itself; a proxy re-broadcasts a broker's stream across the
source's restart; NORM carries a short stream; and a broker whose libzmq
has no PGM (PyPI's pyzmq wheel) refuses a PGM bridge in one clear line.

Layout (each test method has its own namespace prefix)::

    LAN PREFIX  10.77.61.0/24: h1 .1, h2 .2, h3 .3; groups 239.192.61.x

Every broker binds C{tcp://10.77.61.N:9999}: a fixed port is safe, each
host being a namespace with nothing else bound in it, and an address with
a known port is what a broker names as its repair endpoint.

Needs root and iproute2 (skipped otherwise), and is slow
(C{MALAMUTE_SKIP_SLOW=1} skips it). The client programs run in the
namespaces are in this module (L{client_main}).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, ClassVar

import zmq
from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.matching import parse_pattern
from malamute_pack.testing.brokerprocess import (
    PROJECT_ROOT,
    BrokerError,
    BrokerProcess,
    checkout_environment,
    fresh_ipc_endpoint,
    open_connection,
    terminate,
    twistd_command,
)
from malamute_pack.testing.netns import Host, Lan, netns_available
from tests.client_job import ClientJob
from tests.support import skip_slow

SUBNET = "10.77.61"
PORT = 9999
STREAM = "ticks"
# Every pattern kind a reader may use (docs/protocol.md): a v1 regular
# expression, then each scheme.
PATTERNS = (
    r"^gold\.",
    r"regex:\.usd(\.spot)?$",
    "prefix:silver.",
    "topic:*.zur.#",
    "mqtt:sensors/+/temperature",
    "nats:copper.>",
    "fields:currency=USD;urgent",
)
ALL = ""  # the empty pattern: every subject
NOTICE = "$gap"  # the subject of a receiver's loss notice

# What the brokers log (malamute_pack/multicast/service.py, inbound.py, proxy.py).
PUBLISHING = r"multicast bridge: stream '\w+' \(.*\) published on"
RECEIVING = r"multicast bridge: \S+ received into stream"
REPAIR_FROM = re.compile(r"lost records after (\d+): repair from (\S+)")
REPAIRED = re.compile(r"repaired up to (\d+)")
PROXY_READING = r"multicast proxy: reading"

Record = dict[str, Any]


# What the producer writes: record i has a subject and content made from i
# alone, so that every process knows what record i must be.

_METALS = ("gold", "silver", "copper")
_CITIES = ("lon", "nyc", "zur")
_CURRENCIES = ("usd", "eur", "chf")
_ROOMS = ("hall", "lab", "roof")


def subject(i: int) -> str:
    """Record C{i}'s subject: dotted words, MQTT levels or fields, for every pattern kind."""
    rng = random.Random(i)
    metal, city, currency = rng.choice(_METALS), rng.choice(_CITIES), rng.choice(_CURRENCIES)
    family = i % 4
    if family == 0:
        return f"{metal}.{city}.{currency}"
    if family == 1:
        return f"{metal}.{city}.{currency}.spot"
    if family == 2:
        level = rng.choice(("temperature", "humidity", "temperature/max"))
        return f"sensors/{rng.choice(_ROOMS)}/{level}"
    urgent = ";urgent" if rng.random() < 0.5 else ""
    return f"currency={currency.upper()};market={rng.choice(('forex', 'metals'))}{urgent}"


def content(i: int) -> list[bytes]:
    """Record C{i}'s frames: its number, up to 400 random bytes, and now and then an empty frame."""
    rng = random.Random(-1 - i)
    frames = [str(i).encode(), rng.randbytes(rng.randrange(0, 400))]
    if i % 5 == 0:
        frames.append(b"")
    return frames


def expected(pattern: str, indexes: Sequence[int]) -> list[int]:
    """The records of C{indexes} whose subjects C{pattern} matches, in order."""
    compiled = parse_pattern(pattern)
    return [i for i in indexes if compiled.matches(subject(i))]


def differences(got: Sequence[int], want: Sequence[int]) -> str | None:
    """None if C{got} is C{want}; else what differs, briefly."""
    if list(got) == list(want):
        return None
    counts = Counter(got)
    wanted = set(want)
    missing = [i for i in want if i not in counts]
    twice = sorted(i for i, n in counts.items() if n > 1)
    unexpected = sorted(i for i in counts if i not in wanted)
    disorder = next((k for k, (a, b) in enumerate(pairwise(got)) if b <= a), None)
    return (
        f"{len(got)} received, {len(want)} expected: {len(missing)} missing {missing[:10]},"
        f" {len(twice)} more than once {twice[:10]}, {len(unexpected)} unexpected"
        f" {unexpected[:10]}, first out of order after position {disorder}"
    )


# The client programs (run in a namespace by Job).


def _emit(record: Record) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _produce(job: Record) -> None:
    """
    Write records C{first} to C{first + count - 1} to C{STREAM}, C{rate}
    per second (0: as fast as it can), reporting every 100; with C{linger},
    then wait for the stop file (what the client holds while its broker is
    away goes once it is back); then close (which waits for the broker's
    OK: every record sent before it is in).
    """
    from malamute_pack.client.blocking import BlockingClient

    client = BlockingClient(
        job["endpoint"], "producer", timeout=2.0, heartbeat=0.5, max_held=100_000
    )
    client.set_producer(STREAM)
    started = time.monotonic()
    rate = float(job["rate"])
    for n, i in enumerate(range(job["first"], job["first"] + job["count"])):
        if rate:
            ahead = started + n / rate - time.monotonic()
            if ahead > 0:
                client.pause(ahead)
        client.send(subject(i), content(i))
        if (n + 1) % 100 == 0:
            _emit({"sent": n + 1})
    if job.get("linger"):
        _emit({"written": job["count"]})
        while not os.path.exists(job["stop"]):
            client.pause(0.1)
    client.close()
    _emit({"done": job["count"], "dropped": client.dropped})


def _read(job: Record) -> None:
    """
    A client per pattern of C{patterns}, reading C{STREAM} from C{whence}
    (latest or earliest), until each has its count of C{expect} (None: no
    count) and nothing came for C{quiet} seconds, or the stop file exists
    and nothing came for C{quiet} seconds, or C{timeout} passes. One line
    per client: the record numbers received in order, those whose subject
    or content was not record i's, the loss notices, and whether the local
    sequence numbers only went up.
    """
    from malamute_pack.client.blocking import BlockingClient
    from malamute_pack.protocol import mlm

    whence = mlm.EARLIEST if job["whence"] == "earliest" else mlm.LATEST
    patterns: list[str] = job["patterns"]
    clients = []
    for k, pattern in enumerate(patterns):
        client = BlockingClient(job["endpoint"], f"reader-{k}", timeout=5.0)
        client.set_consumer(STREAM, pattern, whence)
        clients.append(client)
    _emit({"ready": True})
    indexes: list[list[int]] = [[] for _ in patterns]
    bad: list[list[int]] = [[] for _ in patterns]
    notices: list[list[Any]] = [[] for _ in patterns]
    sequences: list[list[int]] = [[] for _ in patterns]
    expect: list[int] | None = job.get("expect")
    deadline = time.monotonic() + job["timeout"]
    last = time.monotonic()
    while time.monotonic() < deadline:
        for k, client in enumerate(clients):
            while (delivery := client.recv(timeout=0.002)) is not None:
                last = time.monotonic()
                sequences[k].append(delivery.sequence or 0)
                if delivery.subject == NOTICE:
                    notices[k].append(json.loads(delivery.content[0]))
                    continue
                i = int(delivery.content[0])
                indexes[k].append(i)
                if delivery.subject != subject(i) or list(delivery.content) != content(i):
                    bad[k].append(i)
        quiet = time.monotonic() - last >= job["quiet"]
        complete = expect is not None and all(
            len(got) >= n for got, n in zip(indexes, expect, strict=True)
        )
        if quiet and (complete or expect is None or os.path.exists(job["stop"])):
            break
    for client in clients:
        client.close()
    _emit(
        {
            "readers": [
                {
                    "pattern": pattern,
                    "indexes": indexes[k],
                    "bad": bad[k],
                    "notices": notices[k],
                    "ascending": all(a < b for a, b in pairwise(sequences[k])),
                }
                for k, pattern in enumerate(patterns)
            ]
        }
    )


_JOBS = {"produce": _produce, "read": _read}


def client_main() -> None:
    """Run the job given as JSON in C{sys.argv[1]} (its C{kind} says which)."""
    job = json.loads(sys.argv[1])
    _JOBS[job["kind"]](job)


_CLIENT = "from tests.system.test_multicast_system import client_main; client_main()"


class Job(ClientJob):
    """A client program (L{client_main}) on a host, its output in a file."""

    def __init__(self, host: Host, job: Record, directory: Path, name: str) -> None:
        super().__init__(host, job, directory, name, _CLIENT)

    def result(self, timeout: float) -> Record:
        """
        Its last line, once it exited.

        @raise AssertionError: it did not exit in time (it is killed) or failed.
        """
        return self.records(timeout)[-1]


class BridgeProcess:
    """
    C{twistd malamute-bridge} (a bridge with no broker) on a host, its
    output in a log file; stopped and killed by its pid.
    """

    def __init__(self, host: Host, directory: Path, args: Sequence[str]) -> None:
        self.host = host
        self.directory = directory
        self.args = list(args)
        self.log = directory / "bridge.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        command = twistd_command("--nodaemon", "--pidfile=", "malamute-bridge", *self.args)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.host.command(command),
                cwd=self.directory,
                env=checkout_environment(PYTHONUNBUFFERED="1"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_log(self, pattern: str, timeout: float = 30.0) -> None:
        """
        Wait until its log matches C{pattern}.

        @raise AssertionError: it exited first or C{timeout} passed.
        """
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log_text()):
            exited = self.process is None or self.process.poll() is not None
            if exited or time.monotonic() > deadline:
                raise AssertionError(
                    f"the bridge did not log {pattern!r} within {timeout}s:\n{self.log_text()}"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM it and reap it; SIGKILL it if it does not end in C{timeout} seconds."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            code = terminate(process, timeout, "the bridge")
        except BrokerError as e:
            raise AssertionError(f"{e}:\n{self.log_text()}") from None
        if code not in (0, -signal.SIGTERM):
            raise AssertionError(f"the bridge exited with {code}:\n{self.log_text()}")


class MulticastCase(SynchronousTestCase):
    """
    Three hosts (see the module), made before each test method and
    destroyed after it; the test starts the brokers and clients it needs.

    Slow (skipped with C{MALAMUTE_SKIP_SLOW}); skipped where namespaces
    cannot be made (not root, no C{ip}), saying why.

    @cvar PREFIXES: each test method's namespace prefix.
    """

    skip = skip_slow
    PREFIXES: ClassVar[dict[str, str]] = {}

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.lan = Lan(self.PREFIXES[self._testMethodName], SUBNET, 3)
        self.lan.create()
        self.addCleanup(self.lan.destroy)
        self.brokers: dict[str, BrokerProcess] = {}

    # Brokers

    def endpoint(self, index: int) -> str:
        """Where clients reach a broker on host C{hINDEX}."""
        return f"tcp://{SUBNET}.{index}:{PORT}"

    def host(self, index: int) -> Host:
        return self.lan.hosts[index - 1]

    def broker(
        self, name: str, index: int, args: Sequence[str], ready: str | None = None
    ) -> BrokerProcess:
        """
        A broker on host C{hINDEX}, not started yet; ready when its log
        matches C{ready} (else once it answers a probe); stopped after the
        test, checking that it shuts down cleanly.
        """
        directory = self.base / name
        broker = BrokerProcess(
            directory,
            bind=self.endpoint(index),
            data_dir=directory / "data",
            netns=self.host(index).name,
            ready=ready,
            args=args,
        )
        self.brokers[name] = broker
        self.addCleanup(broker.stop, timeout=20.0)
        return broker

    def start_all(self, *brokers: BrokerProcess) -> None:
        """Launch them together; wait until each logs that it is ready."""
        for broker in brokers:
            broker.launch()
        for broker in brokers:
            assert broker.ready is not None
            broker.wait_log(broker.ready, timeout=30.0)

    def logs(self) -> str:
        """Every broker's log tail, for a failure message."""
        return "\n".join(
            f"----- {name} log -----\n{broker.log_text(4000)}"
            for name, broker in self.brokers.items()
        )

    # Clients

    def client(self, index: int, name: str, **job: Any) -> Job:
        """Start a client program on host C{hINDEX} (killed after the test if still running)."""
        started = Job(self.host(index), job, self.base, name)
        self.addCleanup(started.kill)
        return started

    def produce(
        self, index: int, count: int, rate: float, first: int = 0, linger: bool = False
    ) -> Job:
        """
        A producer on host C{hINDEX} writing records C{first}... to the
        broker there; with C{linger}, it closes only once told to (L{Job.stop}).
        """
        return self.client(
            index,
            f"producer-{first}",
            kind="produce",
            endpoint=self.endpoint(index),
            first=first,
            count=count,
            rate=rate,
            linger=linger,
        )

    def readers(
        self,
        index: int,
        patterns: Sequence[str],
        expect: Sequence[int] | None,
        whence: str = "latest",
        timeout: float = 90.0,
    ) -> Job:
        """
        Readers on host C{hINDEX}, one per pattern, of the broker there,
        subscribed when this returns.
        """
        job = self.client(
            index,
            f"readers-h{index}-{time.monotonic_ns()}",
            kind="read",
            endpoint=self.endpoint(index),
            patterns=list(patterns),
            expect=None if expect is None else list(expect),
            whence=whence,
            quiet=1.0,
            timeout=timeout,
        )
        job.wait("ready", timeout=30.0)
        return job

    def finish(self, readers: Job, patience: float = 30.0) -> list[Record]:
        """
        What each reader received: it ends by itself once each has its
        count; after C{patience} seconds it is told to end once quiet.
        """
        try:
            readers.process.wait(patience)
        except subprocess.TimeoutExpired:
            readers.stop()
        found: list[Record] = readers.result(60.0)["readers"]
        return found

    def read_all(self, index: int, count: int | None = None, timeout: float = 60.0) -> Record:
        """The stream of the broker on host C{hINDEX}, from its first record."""
        job = self.readers(
            index, [ALL], None if count is None else [count], "earliest", timeout=timeout
        )
        found: Record = self.finish(job, timeout)[0]
        return found

    # Checks

    def assertReceived(self, found: Record, want: Sequence[int], what: str) -> None:
        """
        One reader received exactly the records C{want} (numbers), once, in
        order, each with its subject and content, and no loss notice.
        """
        pattern = found["pattern"]
        self.assertEqual(found["notices"], [], f"{what} {pattern!r}: loss notices\n{self.logs()}")
        problem = differences(found["indexes"], want)
        self.assertIsNone(problem, f"{what} {pattern!r}: {problem}\n{self.logs()}")
        self.assertEqual(found["bad"], [], f"{what} {pattern!r}: subject or content changed")
        self.assertTrue(found["ascending"], f"{what} {pattern!r}: local sequence went back")

    def assertAllReceived(self, readers: Sequence[Record], count: int, what: str) -> None:
        """Each reader received the records 0 to C{count - 1} its pattern matches."""
        for found in readers:
            self.assertReceived(found, expected(found["pattern"], range(count)), what)

    def assertRepaired(self, broker: BrokerProcess, origin: str) -> tuple[int, int]:
        """
        The broker's log since its latest start says a repair from
        C{origin} began, and later that one ended; the origin sequence
        numbers it began after and ended at.
        """
        log = broker.run_log()
        began = REPAIR_FROM.search(log)
        self.assertIsNotNone(began, f"no repair began:\n{log[-4000:]}")
        assert began is not None
        self.assertEqual(began.group(2), origin)
        ended = REPAIRED.search(log, began.end())
        self.assertIsNotNone(ended, f"the repair did not end:\n{log[-4000:]}")
        assert ended is not None
        return int(began.group(1)), int(ended.group(1))


def pgm(group: int, port: int) -> str:
    """A PGM-over-UDP URL on the hosts' eth0, group 239.192.61.C{group}."""
    return f"epgm://eth0;239.192.61.{group}:{port}"


class PgmTests(MulticastCase):
    """A broker bridges a stream out over PGM; two others bridge it in."""

    PREFIXES: ClassVar[dict[str, str]] = {
        "test_endToEnd": "mps1",
        "test_outageRepairedFromJournal": "mps2",
        "test_randomLossRepairedByPgm": "mps3",
        "test_receiverRestart": "mps4",
    }
    URL = pgm(1, 5555)

    def three(self, *options: str) -> tuple[BrokerProcess, ...]:
        """
        Broker A on h1 publishing C{STREAM} on L{URL}, B on h2 and C on h3
        receiving it into theirs, all with the bridge C{options}, all ready.
        """
        a = self.broker("A", 1, ["--bridge-out", f"{STREAM}={self.URL}", *options], PUBLISHING)
        b = self.broker("B", 2, ["--bridge-in", f"{self.URL}={STREAM}", *options], RECEIVING)
        c = self.broker("C", 3, ["--bridge-in", f"{self.URL}={STREAM}", *options], RECEIVING)
        self.start_all(b, c, a)
        return a, b, c

    def test_endToEnd(self) -> None:
        """
        3,000 records of varied subjects written over TCP to A reach B and
        C over PGM: on each, a reader per pattern kind (regular expression,
        regex:, prefix:, topic:, mqtt:, nats:, fields:) subscribed before
        the stream gets exactly the records its pattern matches, once, in
        order, subject and content frames intact, and no loss notice.
        """
        count = 3000
        self.three()
        want = [len(expected(p, range(count))) for p in PATTERNS]
        readers = [self.readers(index, PATTERNS, want) for index in (2, 3)]
        started = time.monotonic()
        self.produce(1, count, rate=0).result(60.0)
        written = time.monotonic() - started
        for index, job in zip((2, 3), readers, strict=True):
            self.assertAllReceived(self.finish(job), count, f"h{index}")
        print(
            f"\n{count} records written in {written:.1f}s; per pattern on B and C: {want};"
            f" all received {time.monotonic() - started:.1f}s after the first"
        )

    def test_outageRepairedFromJournal(self) -> None:
        """
        h3 is cut off the LAN for 3 s in the middle of a 3,000-record
        stream (500 a second), longer than PGM can repair: C logs a repair
        from A's TCP endpoint, then that it is repaired, and C's readers
        (every record; one prefix) still get every record once, in order,
        with no loss notice; B's reader gets every record too.

        PGM keeps for repairs what its rate sends in its recovery interval
        (libzmq sizes the window as rate x interval): at the default rate,
        1 s holds this whole stream and PGM repairs the outage itself. At
        4 Mbit/s (the stream needs under 2) 1 s holds about a second of it.
        """
        count = 3000
        self.three("--bridge-recovery", "1000", "--bridge-rate", "4000")
        patterns = [ALL, "prefix:gold."]
        on_b = self.readers(2, [ALL], [count])
        on_c = self.readers(3, patterns, [len(expected(p, range(count))) for p in patterns])
        producer = self.produce(1, count, rate=500)
        producer.wait("sent", 600)
        self.lan.unplug(3)
        time.sleep(3.0)
        self.lan.plug(3)
        producer.result(60.0)
        self.assertAllReceived(self.finish(on_c), count, "h3 after the outage")
        self.assertAllReceived(self.finish(on_b), count, "h2")
        after, upto = self.assertRepaired(self.brokers["C"], self.endpoint(1))
        print(f"\nh3 cut off for 3 s: {after + 1} to {upto} repaired from A's journal")

    def test_randomLossRepairedByPgm(self) -> None:
        """
        h3 drops 5% of the UDP packets it receives (iptables): C's readers
        (every record; one topic) still get every record of a 3,000-record
        stream once, in order, with no loss notice. The loss starts once C
        heard the stream's first record: a receiver's promise starts at the
        first record it hears (docs/multicast.md), so a lost first packet
        would be no loss to it.
        """
        count = 3000
        self.three()
        patterns = [ALL, "topic:*.lon.#"]
        on_c = self.readers(3, patterns, [len(expected(p, range(count))) for p in patterns])
        self.produce(1, 1, rate=0).result(60.0)
        self.assertReceived(self.read_all(3, 1), [0], "h3 before the loss")
        drop = ["iptables", "-A", "INPUT", "-p", "udp", "-m", "statistic"]
        drop += ["--mode", "random", "--probability", "0.05", "-j", "DROP"]
        self.host(3).run(drop, check=True)
        self.produce(1, count - 1, rate=1000, first=1).result(60.0)
        self.assertAllReceived(self.finish(on_c), count, "h3 with 5% loss")
        counted = self.host(3).run(["iptables", "-L", "INPUT", "-v", "-n", "-x"], check=True)
        repairs = len(REPAIR_FROM.findall(self.brokers["C"].run_log()))
        dropped = counted.stdout.splitlines()[-1].split()[0]
        print(f"\n5% loss at h3: {dropped} packets dropped, {repairs} repairs from the journal")

    def test_receiverRestart(self) -> None:
        """
        C is SIGKILLed a third of the way through a 3,000-record stream
        (500 a second) and restarted on the same data directory while the
        stream goes on: afterwards C's stream, read from its first record,
        holds every record once, in order, content intact, with no loss
        notice, and its log shows the repair from A.
        """
        count = 3000
        _, _, c = self.three()
        producer = self.produce(1, count, rate=500)
        producer.wait("sent", 1000)
        c.kill()
        c.start(timeout=30.0)
        producer.result(60.0)
        self.assertReceived(self.read_all(3, count), list(range(count)), "h3 restarted")
        after, upto = self.assertRepaired(c, self.endpoint(1))
        print(f"\nC restarted mid-stream: {after + 1} to {upto} repaired from A's journal")


class ProxyTests(MulticastCase):
    """A bridge with no broker re-broadcasts a stream it reads from a broker over TCP."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_sourceRestarts": "mps5"}
    URL = pgm(2, 5556)

    def test_sourceRestarts(self) -> None:
        """
        Source S on h1 (a plain broker), ``twistd malamute-bridge
        --bridge-source`` S on h2 publishing over PGM, receiver R on h3. S
        is stopped (SIGTERM) a third of the way through a 3,000-record
        stream (500 a second) and started again on the same data directory
        and endpoint while the producer goes on writing: R's stream, read
        from its first record, is S's stream, every record once, in order,
        content intact, records written after S's restart included.
        (What the producer sent while S was away may never reach S: its
        stream sends are fire-and-forget. R is checked against S.)
        """
        count = 3000
        source = self.broker("S", 1, [])
        source.start(timeout=30.0)
        receiver = self.broker("R", 3, ["--bridge-in", f"{self.URL}={STREAM}"], RECEIVING)
        self.start_all(receiver)
        bridge = BridgeProcess(
            self.host(2),
            self.base / "bridge",
            ["--bridge-source", self.endpoint(1), "--bridge-out", f"{STREAM}={self.URL}"],
        )
        self.addCleanup(bridge.stop)
        bridge.start()
        bridge.wait_log(PROXY_READING)
        time.sleep(0.5)  # its STREAM_READ, sent after that line, has been answered
        producer = self.produce(1, count, rate=500, linger=True)
        producer.wait("sent", 1000)
        stopped = int(producer.lines()[-1].get("sent", 0))
        began = time.monotonic()
        source.stop()
        down = time.monotonic() - began
        source.start(timeout=30.0)
        restarted = time.monotonic() - began
        producer.wait("written", timeout=60.0)
        # What the producer held while S was away goes once its connection
        # is back (heartbeat 0.5 s, timeout 2 s): wait for its last record.
        deadline = time.monotonic() + 60.0
        while count - 1 not in self.read_all(1)["indexes"] and time.monotonic() < deadline:
            time.sleep(0.5)
        producer.stop()
        producer.result(30.0)
        at_source = self.read_all(1)["indexes"]
        self.assertIn(count - 1, at_source, "the producer's last record is not in S")
        self.assertTrue(any(i > stopped for i in at_source), "nothing written since S's restart")
        found = self.read_all(3, len(at_source))
        self.assertReceived(found, at_source, "R through the proxy")
        print(
            f"\nS stopped after about {stopped} records (stopping took {down:.1f}s, back"
            f" {restarted:.1f}s after the SIGTERM): {len(at_source)} records in S, all in R"
            " through the proxy"
        )


class NormTests(MulticastCase):
    """A stream bridged over NORM."""

    PREFIXES: ClassVar[dict[str, str]] = {"test_shortStream": "mps6"}
    URL = "norm://eth0;239.192.61.3:5557"

    def test_shortStream(self) -> None:
        """
        500 records written to A on h1 reach B on h2 over NORM: B's reader
        gets every one once, in order, content intact. (libzmq 4.3.4's NORM
        stalls after 1,488 messages and repairs no loss: hence a short
        stream, and no loss.)
        """
        count = 500
        a = self.broker("A", 1, ["--bridge-out", f"{STREAM}={self.URL}"], PUBLISHING)
        b = self.broker("B", 2, ["--bridge-in", f"{self.URL}={STREAM}"], RECEIVING)
        self.start_all(b, a)
        reader = self.readers(2, [ALL], [count])
        self.produce(1, count, rate=1000).result(60.0)
        self.assertAllReceived(self.finish(reader), count, "h2 over NORM")


class RefusalTests(SynchronousTestCase):
    """A broker whose libzmq has no PGM (PyPI's pyzmq wheel) and a PGM bridge."""

    skip = skip_slow

    def test_refusedWithoutPgm(self) -> None:
        """
        With PyPI's binary pyzmq wheel (of this pyzmq's version) first on
        its path, a broker given an epgm:// bridge exits non-zero within
        seconds, with no traceback and one line that names PGM and the fix
        (building pyzmq with --no-binary pyzmq); a broker with only a
        tcp:// bridge starts with that same pyzmq, and stops cleanly.
        """
        base = Path(self.mktemp()).resolve()
        wheel = base / "pyzmq"
        install = [sys.executable, "-m", "pip", "install", "--only-binary=:all:", "--no-deps"]
        install += ["--target", str(wheel), f"pyzmq=={zmq.__version__}"]
        pip = subprocess.run(install, capture_output=True, text=True, timeout=300)
        if pip.returncode != 0:
            tail = (pip.stderr.strip() or pip.stdout.strip()).splitlines()[-1:]
            raise SkipTest(f"pip cannot download PyPI's pyzmq {zmq.__version__} wheel: {tail}")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(wheel), str(PROJECT_ROOT)]))
        env["PYTHONUNBUFFERED"] = "1"
        probe = "import zmq; print(zmq.has('pgm'), zmq.__file__)"
        has = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        pgm_there, where = has.stdout.split()
        self.assertTrue(where.startswith(str(wheel)), f"zmq imported from {where}")
        if pgm_there == "True":
            raise SkipTest("PyPI's pyzmq wheel has PGM now: nothing to refuse")

        started = time.monotonic()
        refused = subprocess.run(
            self.command(base / "refused", "x=epgm://eth0;239.192.61.9:5555"),
            cwd=base,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        took = time.monotonic() - started
        output = refused.stdout + refused.stderr
        self.assertNotEqual(refused.returncode, 0, output)
        self.assertLess(took, 20.0)
        self.assertNotIn("Traceback", output)
        naming = [line for line in output.splitlines() if "PGM" in line]
        self.assertEqual(len(naming), 1, output)
        self.assertIn("--no-binary pyzmq", naming[0])

        directory = base / "tcp"
        directory.mkdir()
        log = directory / "broker.log"
        with log.open("wb") as out:
            endpoint = fresh_ipc_endpoint("refusal")
            broker = subprocess.Popen(
                self.command(directory / "data", "x=tcp://127.0.0.1:*", endpoint),
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(self._reap, broker)
        deadline = time.monotonic() + 30.0

        def check() -> None:
            if broker.poll() is not None or time.monotonic() > deadline:
                self.fail(f"the broker with a tcp:// bridge did not start:\n{log.read_text()}")

        while "published on tcp://127.0.0.1:" not in log.read_text(errors="replace"):
            check()
            time.sleep(0.05)
        # Its answer says the reactor runs, its SIGTERM handler in place.
        open_connection(endpoint, check=check)
        broker.send_signal(signal.SIGTERM)
        self.assertIn(broker.wait(20.0), (0, -signal.SIGTERM))
        self.assertIn("Main loop terminated.", log.read_text(errors="replace"))
        print(f"\nrefused in {took:.1f}s: {naming[0]}")

    def command(self, data: Path, bridge: str, endpoint: str | None = None) -> list[str]:
        """
        A broker's command line: its data in C{data}, C{--bridge-out
        bridge}, bound to C{endpoint} (a fresh one by default).
        """
        return twistd_command(
            "--nodaemon", "--pidfile=", "malamute", "-d", str(data),
            "-e", endpoint or fresh_ipc_endpoint("refusal"), "--bridge-out", bridge,
        )  # fmt: skip

    def _reap(self, process: subprocess.Popen[bytes]) -> None:
        """Kill it by its pid if it still runs; reap it."""
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        process.wait()
