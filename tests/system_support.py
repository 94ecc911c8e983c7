"""
Support for slow system tests: the broker as a real ``twistd malamute``
process (started, SIGKILLed, restarted on the same data dir, stopped) whose
stdout is captured to a file, and raw blocking DEALER peers that speak the
protocol through the codec (deliberately not the project's client library).

Tests: used by ``tests/test_system_durability.py``.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
from pathlib import Path
from time import monotonic

import zmq

from malamute_pack.protocol import mlm

# The checkout: the directory holding malamute_pack and twisted/plugins.
ROOT = Path(__file__).resolve().parents[1]
TWISTD = ROOT / ".venv" / "bin" / "twistd"

_names = itertools.count()


def fresh_endpoint(label: str) -> str:
    """An ipc endpoint in the abstract namespace that no other test uses."""
    return f"ipc://@/malamute-system-{label}-{os.getpid()}-{next(_names)}"


class BrokerProcess:
    """
    A ``twistd --nodaemon malamute`` process. Every start appends to the
    same log file (its stdout and stderr), so a restart's log follows the
    killed run's.

    @ivar process: the running process, or None.
    """

    def __init__(
        self, endpoint: str, data_dir: Path, log: Path, timeout_ms: int | None = None
    ) -> None:
        self.endpoint = endpoint
        self.data_dir = data_dir
        self.log = log
        self.timeout_ms = timeout_ms
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        timeout = [f"--timeout={self.timeout_ms}"] if self.timeout_ms is not None else []
        return [
            str(TWISTD),
            "--nodaemon",
            "--pidfile=",
            "malamute",
            f"--endpoint={self.endpoint}",
            f"--data-dir={self.data_dir}",
            *timeout,
        ]

    def start(self) -> None:
        """Start it without waiting for it to serve (see L{wait_ready})."""
        assert self.process is None or self.process.poll() is not None, "already running"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_ready(self, context: zmq.Context[zmq.Socket[bytes]], timeout: float = 20.0) -> None:
        """
        Wait until the broker answers CONNECTION_OPEN, from a throwaway
        peer: an OPEN sent before the broker bound is answered late, and
        that stray OK must not reach a test's own peers.
        """
        deadline = monotonic() + timeout
        probe = Peer(context, self.endpoint)
        try:
            while True:
                if not self.alive():
                    raise AssertionError(f"broker exited before serving:\n{self.log_text()}")
                if probe.command(mlm.ConnectionOpen(), 0.5) == mlm.Ok():
                    return
                if monotonic() > deadline:
                    raise AssertionError(f"broker silent for {timeout}s:\n{self.log_text()}")
        finally:
            probe.close()

    def kill(self) -> None:
        """SIGKILL it (by its pid) and reap it."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM it and reap it (SIGKILL after C{timeout}); its exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def log_text(self, tail: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-tail:] or "(empty log)"
        except OSError:
            return "(no log)"


class Peer:
    """A raw DEALER connected to the broker: encoded sends, decoded receives."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], endpoint: str) -> None:
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        # Room for everything a load run pipelines while the broker is down.
        self.socket.setsockopt(zmq.SNDHWM, 100_000)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        self.socket.connect(endpoint)

    def send(self, message: mlm.Message) -> None:
        self.socket.send_multipart(mlm.encode(message))

    def receive(self, timeout: float) -> mlm.Message | None:
        """The next message within C{timeout} seconds, or None."""
        if not self.socket.poll(int(timeout * 1000)):
            return None
        return mlm.decode(self.socket.recv_multipart())

    def receive_ready(self) -> list[mlm.Message]:
        """Every message already waiting, without blocking."""
        found: list[mlm.Message] = []
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return found
            found.append(mlm.decode(frames))

    def command(self, message: mlm.Message, timeout: float = 5.0) -> mlm.Message | None:
        self.send(message)
        return self.receive(timeout)

    def expect(self, cls: type[mlm.Message], timeout: float = 5.0) -> mlm.Message:
        """The next message that is a C{cls}, skipping others; fails after C{timeout}."""
        deadline = monotonic() + timeout
        skipped: list[mlm.Message] = []
        while True:
            message = self.receive(max(0.0, deadline - monotonic()))
            if message is None:
                raise AssertionError(f"no {cls.__name__} within {timeout}s; got {skipped}")
            if isinstance(message, cls):
                return message
            skipped.append(message)

    def close(self) -> None:
        self.socket.close(linger=0)
