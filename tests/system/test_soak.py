"""
The short soak (``scripts/soak``, ``python -m soak``; issue 37): real brokers
in network namespaces under random faults drawn from a fixed seed, with
clients that append, send letters and requests and consume as durable
readers and group members, checked afterwards. One test per topology, each
about 20 seconds of load, so that ``trial -j`` runs them side by side (each
claims a slot of its own: its own namespaces and subnets). A test passes
when the soak ran, found no violation outside L{KNOWN_OPEN} (open defects,
printed when found), and its summary shows operations of every kind
acknowledged and faults of several kinds done.

Needs root, iproute2 and iptables (skipped otherwise, saying why); slow
(C{MALAMUTE_SKIP_SLOW=1} skips it). Long soaks are run by hand
(``scripts/soak --minutes 30``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from malamute_pack.testing.brokerprocess import PROJECT_ROOT, checkout_environment
from malamute_pack.testing.netns import netns_available
from tests.support import skip_slow

# Seconds of load and faults per topology, the mean seconds between faults,
# and the readers' quiet before the reads back (past the soak's group lease,
# soak.topology.GROUP_LEASE_S, so that what a stuck member held is handed on).
SECONDS = 20
INTERVAL = 3
QUIET = 12

# Violations of promises the long soaks still break, open defects (issue 37's
# closing note): a group's records delivered again when a member joins as
# another acknowledges them (one store); in a pack, records of a broker
# started afresh or restarted that a group or a consumer elsewhere misses,
# and a record a peer forwards again written twice in a copy. These short
# soaks report them without failing; every other kind (nothing acknowledged
# lost, no number given twice, no damaged record served, positions that
# never move back, memory bounded) fails the test.
# In the pack3 soak also (about one CI run in two, around a refused journal
# or a full disk): letters and requests handed across the pack and lost, and
# a group's records out of order across changes of its home (issue 37's
# closing note). Printed when found, not failing, until fixed.
PACK3_OPEN = frozenset({"lost-letter", "lost-request", "group-order"})

KNOWN_OPEN = frozenset(
    {
        "acknowledged-twice",
        "redelivered-acknowledged",
        "group-missed",
        "consumer-missed",
        "append-written-twice",
    }
)


class ShortSoakTests(SynchronousTestCase):
    """The short soak of each topology, with a fixed seed."""

    skip = skip_slow

    def setUp(self) -> None:
        reason = netns_available()
        if reason is None and shutil.which("iptables") is None:
            reason = "the soak needs the iptables command"
        if reason is not None:
            raise SkipTest(reason)

    def soak(
        self, topology: str, seed: int, also_open: frozenset[str] = frozenset()
    ) -> dict[str, Any]:
        """
        Run the soak; its summary, once it passed (its output is in the
        failure message otherwise, with the run directory it kept).
        """
        out = Path(self.mktemp()).resolve()
        done = subprocess.run(
            [
                sys.executable, "-m", "soak", "--topology", topology, "--seed", str(seed),
                "--seconds", str(SECONDS), "--fault-interval", str(INTERVAL), "--quiet", str(QUIET),
                "--out", str(out),
            ],
            cwd=PROJECT_ROOT,
            env=checkout_environment(),
            capture_output=True,
            text=True,
            timeout=900,
        )  # fmt: skip
        output = f"{done.stdout}\n{done.stderr}"
        self.assertIn(done.returncode, (0, 1), f"the soak could not run:\n{output}")
        [summary_file] = out.glob("*/summary.json")
        summary: dict[str, Any] = json.loads(summary_file.read_text())
        found = summary["violations"]["by_kind"]
        broken = sorted(kind for kind in found if kind not in KNOWN_OPEN | also_open)
        self.assertEqual(broken, [], f"the soak found violations:\n{output}")
        if found:
            # Known open (KNOWN_OPEN): shown, for whoever reads the log.
            print(f"\nknown open violations: {found}\n{output}")
        acknowledged = summary["acknowledged"]
        for kind in ("appends", "letters", "requests", "reader commits", "member commits"):
            self.assertGreater(acknowledged[kind], 0, f"no {kind} acknowledged:\n{output}")
        self.assertGreaterEqual(len(summary["faults"]), 3, f"few kinds of fault:\n{output}")
        for broker in summary["memory"]["brokers"].values():
            self.assertIn("end_mib", broker, output)
        return summary

    def test_pair(self) -> None:
        """
        A pair (primary, backup, the pair link apart) with its clients on a
        third host: nothing acknowledged is lost, no number is given twice,
        consumers and the group keep their promises, under 20 s of faults.
        """
        self.soak("pair", 11)

    def test_pack3(self) -> None:
        """
        Three brokers in a CURVE pack with clients on a fourth host, letters,
        requests and group members crossing between them: no violation
        under 20 s of faults, but the open defects of KNOWN_OPEN and
        PACK3_OPEN (letters and requests lost across the pack, group order
        across home changes: printed).
        """
        self.soak("pack3", 12, PACK3_OPEN)

    def test_pairInPack(self) -> None:
        """
        A pair and a third broker in one pack: no violation under 20 s of
        faults.
        """
        self.soak("pair-in-pack", 13)
