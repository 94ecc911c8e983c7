"""
C{scripts/broker} (the README's way to run a broker) runs in the directory
it is started from: relative paths given to it (C{-d}, C{-p}) and the
default C{./malamute-data} are there, not in the checkout. It runs
C{scripts/bootstrap} first, which does nothing once C{.venv} is ready.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import PROJECT_ROOT, fresh_ipc_endpoint
from tests.support import skip_slow

SCRIPT = PROJECT_ROOT / "scripts" / "broker"


class BrokerScriptTests(SynchronousTestCase):
    skip = skip_slow

    def run_until_bound(self, directory: Path, *args: str) -> str:
        """Run C{scripts/broker args} in C{directory} until it has bound, then stop it; its log."""
        log = directory / "broker.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(SCRIPT), *args],
                cwd=directory,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.addCleanup(_kill, process)
        deadline = time.monotonic() + 120  # bootstrap may have work to do first
        while "Malamute broker bound to" not in log.read_text(errors="replace"):
            if process.poll() is not None or time.monotonic() > deadline:
                self.fail(f"scripts/broker did not bind:\n{log.read_text(errors='replace')}")
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
        return log.read_text(errors="replace")

    def test_relativePaths(self) -> None:
        """-d and -p name paths in the caller's directory."""
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        (directory / "pw").write_text("user = secret\n")
        name = f"script-data-{time.monotonic_ns()}"
        endpoint = fresh_ipc_endpoint("script")
        self.run_until_bound(directory, "-e", f"plain:{endpoint}", "-p", "pw", "-d", name)
        self.assertTrue((directory / name / "journal.sqlite").exists())
        self.assertFalse((PROJECT_ROOT / name).exists())

    def test_defaultDataDir(self) -> None:
        """With no -d, the data is in ./malamute-data of the caller's directory."""
        directory = Path(self.mktemp()).resolve()
        directory.mkdir()
        log = self.run_until_bound(directory, "-e", fresh_ipc_endpoint("script"))
        self.assertTrue((directory / "malamute-data" / "journal.sqlite").exists())
        self.assertIn(f"data directory {directory / 'malamute-data'} locked", log)


def _kill(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
