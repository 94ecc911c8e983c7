"""
A broker process is lean: started on its defaults (with its journal), it
has loaded none of the Spark extra's heavy libraries (pandas, numpy,
pyarrow), which this environment has installed
(L{malamute_pack.blocked_imports}). Its resident memory once it serves is
printed for the record (about 55 MiB here; 137 MiB with those libraries),
not asserted: a figure, not a behaviour.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.testing.brokerprocess import BrokerProcess

# What a broker process must not load: the Spark extra's heavy libraries.
HEAVY_MODULES = ("pandas", "numpy", "pyarrow")

MIB = 1024 * 1024

# A file of one of the heavy libraries mapped into a process: each loads
# compiled extensions (.so) as it is imported.
_HEAVY_FILE = re.compile(rf"/({'|'.join(HEAVY_MODULES)})(\.libs)?/")


def heavy_files(pid: int) -> set[str]:
    """The files of the heavy libraries process C{pid} has mapped."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    paths = {line.split(maxsplit=5)[5] for line in maps if len(line.split(maxsplit=5)) == 6}
    return {path for path in paths if _HEAVY_FILE.search(path)}


def resident_bytes(pid: int) -> int:
    """The resident memory of process C{pid} (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"/proc/{pid}/status has no VmRSS")


class BrokerFootprintTests(SynchronousTestCase):
    def test_noHeavyLibraries(self) -> None:
        """
        A started broker has mapped no file of pandas, numpy or pyarrow
        (installed here, as they are wherever the Spark extra is).
        """
        installed = [name for name in HEAVY_MODULES if importlib.util.find_spec(name)]
        self.assertEqual(installed, list(HEAVY_MODULES), "the Spark extra is not installed")
        with BrokerProcess(Path(self.mktemp())) as broker:
            heavy = heavy_files(broker.pid)
            rss = resident_bytes(broker.pid)
        print(f"\nbroker resident memory at start: {rss / MIB:.1f} MiB")
        self.assertEqual(heavy, set())
