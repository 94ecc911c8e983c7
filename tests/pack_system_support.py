"""
Support for the pack system tests: L{PackCase}, a test that builds a LAN of
network namespaces (L{malamute_pack.testing.netns.Lan}), runs one real broker
per host in a pack (``--pack test``, beacons on C{eth0} or gossip only) and
waits until every broker has seen every other join; and L{AgentProcess},
a client (C{tests/pack_agent.py}) running on one of those hosts, driven by
JSON lines.

Each test method has a LAN of its own (its class's C{LANS} give each
method a namespace prefix and a /24), so that ``trial -j`` may run any two
at once. Everything a test starts is ended by its cleanups, in reverse:
agents killed, brokers stopped (the stop checked: a broker that does not
shut down cleanly fails the test), the LAN destroyed.

Tests: ``tests/system/test_system_pack.py``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from time import monotonic, sleep
from typing import Any, ClassVar

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.testing.brokerprocess import (
    PROJECT_ROOT,
    BrokerProcess,
    checkout_environment,
    python_command,
)
from malamute_pack.testing.netns import Host, Lan, netns_available
from tests.support import skip_slow

# The pack every test's brokers join.
PACK = "test"
# The port h1's zgossip server binds in a gossip-only pack.
GOSSIP_PORT = 5680

Event = dict[str, Any]


def joined(name: str) -> str:
    """What a broker logs when the broker C{name} federates with it."""
    return f"pack {PACK}: broker {name} joined"


def left(name: str) -> str:
    """What a broker logs when the broker C{name} leaves (or is expired)."""
    return f"pack {PACK}: broker {name} left"


class AgentProcess:
    """
    A L{tests.pack_agent} process on a host, connected to an endpoint
    there: L{call} sends a command and returns its answer.
    """

    def __init__(
        self,
        host: Host,
        endpoint: str,
        errors: Path,
        name: str,
        plain: tuple[str, str] | None = None,
    ) -> None:
        """@param plain: the user and password it authenticates with (PLAIN), if any."""
        self.name = name
        self.errors = errors
        credentials = {} if plain is None else {"MALAMUTE_AGENT_PLAIN": ":".join(plain)}
        with errors.open("wb") as err:
            self.process = subprocess.Popen(
                python_command(host.name, "-m", "tests.pack_agent", endpoint),
                cwd=PROJECT_ROOT,
                env=checkout_environment(PYTHONUNBUFFERED="1", **credentials),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self._pending = b""

    def send(self, op: str, **fields: Any) -> None:
        """Send a command without waiting for its answer (see L{answer})."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **fields}).encode() + b"\n")
        self.process.stdin.flush()

    def answer(self, timeout: float) -> Event:
        """
        The next answer within C{timeout} seconds.

        @raise AssertionError: none came in time, or the agent exited (with
            what it wrote on stderr), or the command failed.
        """
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - monotonic()
            if left <= 0:
                raise AssertionError(f"agent {self.name}: no answer within {timeout}s")
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                data = os.read(fd, 1 << 20)
                if not data:
                    raise AssertionError(
                        f"agent {self.name} exited ({self.process.poll()}): {self.stderr()}"
                    )
                self._pending += data
        line, self._pending = self._pending.split(b"\n", 1)
        answer: Event = json.loads(line)
        if not answer.get("ok"):
            raise AssertionError(f"agent {self.name}: {answer.get('error')}")
        return answer

    def call(self, op: str, timeout: float = 30.0, **fields: Any) -> Event:
        """Run a command and return its answer (see L{answer})."""
        self.send(op, **fields)
        return self.answer(timeout)

    def collect(
        self,
        kinds: Sequence[str] = ("stream",),
        count: int | None = None,
        quiet: float | None = None,
        timeout: float = 10.0,
        prefix: str = "",
    ) -> list[Event]:
        """
        What it received of C{kinds}, taken once C{count} of them have a
        subject starting with C{prefix}, or nothing came for C{quiet}
        seconds, or after C{timeout} seconds.
        """
        answer = self.call(
            "collect",
            timeout=timeout + 10.0,
            kinds=list(kinds),
            count=count,
            quiet=quiet,
            timeout_s=timeout,
            prefix=prefix,
        )
        events: list[Event] = answer["events"]
        return events

    def stderr(self) -> str:
        try:
            return self.errors.read_text(errors="replace")[-3000:] or "(nothing)"
        except OSError:
            return "(no stderr)"

    def kill(self) -> None:
        """SIGKILL it by its pid and reap it."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()


class PackCase(SynchronousTestCase):
    """
    A test with a pack of C{size} brokers, C{h1} to C{hN}, one per host of
    a LAN, federated before the test method runs.

    Slow (skipped with C{MALAMUTE_SKIP_SLOW}); skipped where namespaces
    cannot be made (not root, no C{ip}), saying why.

    @cvar LANS: each test method's namespace prefix and subnet.
    @cvar size: the number of hosts and brokers.
    @cvar gossip: beacons off: h1 serves zgossip, the others connect to it,
        every broker with C{--peer-endpoint tcp://ITS-ADDRESS:*}.
    @cvar expired_ms: ZRE's expiry of a silent peer, if not the default
        (30 s); given in a config file with evasive at a third of it.
    @cvar plain: the user and password the brokers' readiness probe
        opens with, for brokers that require PLAIN (given a password file
        in L{pack_args}).
    """

    skip = skip_slow
    LANS: ClassVar[dict[str, tuple[str, str]]] = {}
    size: ClassVar[int] = 3
    gossip: ClassVar[bool] = False
    expired_ms: ClassVar[int | None] = None
    plain: ClassVar[tuple[str, str] | None] = None

    def setUp(self) -> None:
        reason = netns_available()
        if reason is not None:
            raise SkipTest(reason)
        prefix, subnet = self.LANS[self._testMethodName]
        self.base = Path(self.mktemp()).resolve()
        self.base.mkdir(parents=True)
        self.lan = Lan(prefix, subnet, self.size)
        self.lan.create()
        self.addCleanup(self.lan.destroy)
        self.config = self._config()
        self.brokers: list[BrokerProcess] = []
        for index, host in enumerate(self.lan.hosts, start=1):
            directory = self.base / f"h{index}"
            broker = BrokerProcess(
                directory,
                data_dir=directory / "data",
                netns=host.name,
                args=self.pack_args(index),
                plain=self.plain,
            )
            self.brokers.append(broker)
            self.addCleanup(broker.stop, timeout=20.0)
        started = monotonic()
        for broker in self.brokers:
            broker.start()
        self.wait_federated()
        self.setup_seconds = monotonic() - started

    def _config(self) -> Path | None:
        if self.expired_ms is None:
            return None
        path = self.base / "malamute.cfg"
        path.write_text(
            "malamute\n"
            "    pack\n"
            f"        evasive = {max(1, self.expired_ms // 3)}\n"
            f"        expired = {self.expired_ms}\n"
        )
        return path

    @property
    def gossip_endpoint(self) -> str:
        return f"tcp://{self.lan.hosts[0].address}:{GOSSIP_PORT}"

    def pack_args(self, index: int) -> list[str]:
        """The pack's arguments of broker C{hINDEX}."""
        args = ["--pack", PACK, "--broker-name", f"h{index}"]
        if self.gossip:
            host = self.lan.hosts[index - 1]
            args += ["--peer-endpoint", f"tcp://{host.address}:*"]
            option = "--gossip-bind" if index == 1 else "--gossip-connect"
            args += [option, self.gossip_endpoint]
        else:
            args += ["--beacon", "eth0"]
        if self.config is not None:
            args += ["--config", str(self.config)]
        return args

    def broker(self, index: int) -> BrokerProcess:
        """Broker C{hINDEX} (from 1)."""
        return self.brokers[index - 1]

    def agent(self, index: int, name: str, plain: tuple[str, str] | None = None) -> AgentProcess:
        """
        A client agent on host C{hINDEX}, connected to its broker (as the
        PLAIN user C{plain}, if given); killed after the test.
        """
        agent = AgentProcess(
            self.lan.hosts[index - 1],
            self.broker(index).endpoint,
            self.base / f"agent-{name}.stderr",
            name,
            plain,
        )
        self.addCleanup(agent.kill)
        return agent

    # Waiting on the brokers' logs

    def logs(self) -> str:
        """Every broker's log tail, for a failure message."""
        return "\n".join(
            f"----- h{i} log -----\n{broker.log_text(4000)}"
            for i, broker in enumerate(self.brokers, start=1)
        )

    def wait_logs(
        self, expected: Sequence[tuple[int, str, int]], timeout: float, what: str
    ) -> float:
        """
        Wait until, for each C{(index, text, count)}, broker C{hINDEX} has
        logged C{text} at least C{count} times since its latest start; the
        seconds it took.

        @raise AssertionError: not within C{timeout}, saying what is missing
            and quoting the logs.
        """
        started = monotonic()
        deadline = started + timeout
        while True:
            missing = [
                f"h{index} has not logged {text!r} {count} time(s)"
                for index, text, count in expected
                if self.broker(index).run_log().count(text) < count
            ]
            if not missing:
                return monotonic() - started
            dead = [f"h{i}" for i, b in enumerate(self.brokers, 1) if b.process and not b.alive()]
            if dead or monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not within {timeout}s (dead: {dead}):\n"
                    + "\n".join(missing)
                    + "\n"
                    + self.logs()
                )
            sleep(0.05)

    def wait_federated(self, timeout: float = 30.0) -> float:
        """Wait until every running broker has seen every other running one join."""
        running = [i for i, b in enumerate(self.brokers, start=1) if b.alive()]
        expected = [(i, joined(f"h{j}"), 1) for i in running for j in running if i != j]
        return self.wait_logs(expected, timeout, "the pack did not federate")

    def workers_and_asker(
        self, asker_address: str, service: str = "work", delay: float = 0.02
    ) -> tuple[list[AgentProcess], AgentProcess]:
        """
        Version 2 workers of C{service} on h2 and h3 (each holds a request
        C{delay} seconds, then DONE), and a version 2 requester on h1, once
        h1 knows both offers (each worker served a warm-up request).
        """
        workers: list[AgentProcess] = []
        for index in (2, 3):
            worker = self.agent(index, f"worker{index}")
            worker.call("open", version=2, address=f"worker-h{index}")
            worker.call("offer", service=service, pattern=".*")
            worker.call("serve", reply=False, done=True, delay=delay)
            workers.append(worker)
        asker = self.agent(1, "asker")
        asker.call("open", version=2, address=asker_address)
        warm = [f"warm-{i}" for i in range(10)]
        asker.call("post", kind="service", address=service, subjects=warm, wait="all")
        self.wait_until(
            lambda: all(w.call("collect", kinds=[], timeout_s=0)["served"] > 0 for w in workers),
            15.0,
            "both workers serve",
        )
        return workers, asker

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = monotonic() + timeout
        while not check():
            if monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout}s\n{self.logs()}")
            sleep(0.05)

    # Streams

    def open_route(
        self, writer: AgentProcess, readers: Sequence[AgentProcess], prefix: str = "probe-"
    ) -> int:
        """
        Make sure the readers' interest has reached the writer's broker:
        the writer sends probes (subjects C{prefix} and a number) until
        each reader has received one; the number of probes sent. (Per
        writer, order is kept: whatever the writer sends next reaches every
        reader after its probe. Probes sent after a reader's first may
        still reach it: count by subject.)
        """
        waiting = list(readers)
        sent = 0
        deadline = monotonic() + 20.0
        while waiting:
            if monotonic() > deadline:
                names = [r.name for r in waiting]
                raise AssertionError(f"no probe reached {names} in 20s\n{self.logs()}")
            writer.call("send", prefix=prefix, count=1, start=sent)
            sent += 1
            for reader in list(waiting):
                if reader.collect(["stream"], count=1, timeout=0.1, prefix=prefix):
                    waiting.remove(reader)
        return sent
