"""
A client program run as a process on a host of a network namespace Lan,
for the system tests: it is handed its job as JSON, writes one JSON line
per thing it did, and ends by itself or when its stop file appears.

Tests: used by ``tests/system/test_pair_system.py`` (through
``tests/pair_system_support.py``) and ``tests/system/test_multicast_system.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment, python_command
from malamute_pack.testing.netns import Host

Record = dict[str, Any]


class ClientJob:
    """
    A client program on a host, its output in a file.

    @ivar program: the Python code that runs it (C{python -c}), given the
        job (with its C{stop} file) as its first argument.
    """

    def __init__(self, host: Host, job: Record, directory: Path, name: str, program: str) -> None:
        self.name = name
        self.output = directory / f"{name}.out"
        self.errors = directory / f"{name}.err"
        self.stop_file = directory / f"{name}.stop"
        job = {**job, "stop": str(self.stop_file)}
        with self.output.open("wb") as out, self.errors.open("wb") as err:
            self.process = subprocess.Popen(
                python_command(host.name, "-c", program, json.dumps(job)),
                cwd=PROJECT_ROOT,
                env=checkout_environment(PYTHONUNBUFFERED="1"),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def lines(self) -> list[Record]:
        """What it wrote so far (a line being written is left for later)."""
        text = self.output.read_text(errors="replace")
        return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]

    def wait(self, key: str, least: int = 0, timeout: float = 30.0) -> None:
        """
        Wait until it wrote a line with C{key} whose value is at least C{least}.

        @raise AssertionError: it exited first or C{timeout} passed.
        """
        deadline = time.monotonic() + timeout
        while not any(line.get(key, -1) >= least for line in self.lines()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"client {self.name} wrote no {key} >= {least} within {timeout}s"
                    f" (exit {self.process.poll()}): {self.stderr()}"
                )
            time.sleep(0.02)

    def stop(self) -> None:
        """Tell it to end (a load after what is under way, a reader once nothing comes)."""
        self.stop_file.touch()

    def records(self, timeout: float) -> list[Record]:
        """
        Every line, once it exited.

        @raise AssertionError: it did not exit in time (it is killed) or failed.
        """
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"client {self.name} did not end within {timeout}s: {self.stderr()}"
            ) from None
        if self.process.returncode != 0:
            raise AssertionError(
                f"client {self.name} exited with {self.process.returncode}: {self.stderr()}"
            )
        return self.lines()

    def stderr(self) -> str:
        try:
            return self.errors.read_text(errors="replace")[-3000:] or "(nothing on stderr)"
        except OSError:
            return "(no stderr)"

    def kill(self) -> None:
        """SIGKILL it by its pid and reap it (a no-op once it exited)."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
