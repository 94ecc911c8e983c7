"""
The broker under test as a real process: ``twistd --nodaemon malamute`` on a
private IPC endpoint, with a long heartbeat timeout so that load processes
need not ping, with its journal (in a data directory of its own) or with
``--no-journal``, and optionally under twistd's own cProfile runner.

Why twistd's profiler and not ``python -m cProfile``: after a clean shutdown
on SIGTERM, twistd (and ``twist``) re-raise the signal with the default
handler so that the exit status says how the process ended; that kills the
interpreter before ``python -m cProfile`` could write its file. twistd's
``--profile`` runs just ``reactor.run`` under cProfile and dumps the
statistics as soon as it returns, before the signal is re-raised.

So a clean stop is: SIGTERM, exit status -SIGTERM (or 0), "Main loop
terminated." in the log and, when profiling, a profile file.

Tests: ``tests/test_bench.py``.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from pathlib import Path
from time import monotonic

import malamute_pack
from malamute_pack.bench.load import Link, LoadError
from malamute_pack.protocol import mlm

# The directory that holds the malamute_pack package and twisted/plugins.
PROJECT_ROOT = Path(malamute_pack.__file__).resolve().parent.parent

# Long enough that no load process is expired for silence during a run.
TIMEOUT_MS = 600_000

# Each broker of one harness gets an endpoint of its own.
_serial = itertools.count(1)


class BrokerError(Exception):
    """The broker did not start, or did not exit cleanly."""


class BrokerProcess:
    """
    @ivar endpoint: where it listens.
    @ivar data_dir: its working directory: its log, and its journal under
        C{data/}.
    @ivar profile: where cProfile writes its statistics, if it runs under it.
    @ivar journal: whether it journals (else it runs with C{--no-journal}).
    """

    def __init__(self, data_dir: Path, profile: Path | None = None, journal: bool = True) -> None:
        self.endpoint = f"ipc://@/malamute-bench-{os.getpid()}-{next(_serial)}"
        self.data_dir = data_dir
        self.profile = profile
        self.journal = journal
        self.log = data_dir / "broker.log"
        self._process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        profiler = (
            [f"--profile={self.profile}", "--profiler=cprofile", "--savestats"]
            if self.profile
            else []
        )
        return [
            sys.executable,
            "-c",
            "from twisted.scripts.twistd import run; run()",
            "--nodaemon",
            "--pidfile=",
            f"--logfile={self.log}",
            *profiler,
            "malamute",
            f"--endpoint={self.endpoint}",
            f"--data-dir={self.data_dir / 'data'}",
            f"--timeout={TIMEOUT_MS}",
            *([] if self.journal else ["--no-journal"]),
        ]

    def start(self, timeout: float = 30.0) -> None:
        """Start it and wait until it answers CONNECTION_OPEN."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p
        )
        self._process = subprocess.Popen(
            self.command(), cwd=self.data_dir, env=env, stdin=subprocess.DEVNULL
        )
        probe = Link(self.endpoint, ping_interval=timeout)
        try:
            deadline = monotonic() + timeout
            while True:
                if self._process.poll() is not None:
                    code = self._process.returncode
                    raise BrokerError(f"broker exited with {code}: {self._log()}")
                try:
                    probe.command(mlm.ConnectionOpen(), timeout=0.5)
                    break
                except LoadError:
                    if monotonic() > deadline:
                        raise BrokerError(f"broker silent for {timeout}s: {self._log()}") from None
            probe.close()
        finally:
            if not probe.socket.closed:
                probe.socket.close(linger=0)
                probe.context.term()

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM it; L{BrokerError} unless it shuts down cleanly (see the module)."""
        process = self._process
        if process is None:
            return
        self._process = None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
                raise BrokerError(f"broker ignored SIGTERM for {timeout}s") from None
        if process.returncode not in (0, -signal.SIGTERM):
            raise BrokerError(f"broker exited with {process.returncode}: {self._log()}")
        if "Main loop terminated." not in self._log():
            raise BrokerError(f"broker was killed, not shut down: {self._log()}")
        if self.profile is not None and not (
            self.profile.exists() and self.profile.stat().st_size > 0
        ):
            raise BrokerError(f"broker shut down but wrote no profile to {self.profile}")

    def _log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:] or "(empty log)"
        except OSError:
            return "(no log)"

