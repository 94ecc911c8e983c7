"""
Is this host's broker the active one of its pair? For a floating address's
manager (keepalived's ``track_script``, a load balancer's health check),
without being a client: a client's request to a passive broker whose
partner is silent would make it take over, which is the one thing a check
must not do.

The pair service writes its state to ``<data-dir>/pair-state`` (JSON:
state, role, pid) at every transition (L{write_state}).
``python -m malamute_pack.pair.check DATA-DIR`` prints the state and exits
0 only when it is ``active`` and written by the process that holds the
data directory's lock and is alive (a broker killed with ``-9`` leaves
its last state behind: its pid is gone).

Tests: ``tests/unit/test_pair_check.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from malamute_pack.datadir import DataDirLock

STATE_FILE: Final = "pair-state"


def write_state(data_dir: Path, state: str, role: str) -> None:
    """Record C{state} for the check (atomically: a reader sees the old or the new)."""
    path = data_dir / STATE_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"state": state, "role": role, "pid": os.getpid()}))
    temporary.replace(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def current_state(data_dir: Path) -> str:
    """
    The state of the broker of C{data_dir}: ``active``, ``passive``,
    ``starting``, or ``down`` (no broker holds the directory, or the one
    that wrote the state is gone).
    """
    try:
        recorded = json.loads((data_dir / STATE_FILE).read_text())
        state, pid = str(recorded["state"]), int(recorded["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "down"
    holder = DataDirLock(data_dir).holder()
    if holder is None or holder.pid != pid or not _alive(pid):
        return "down"
    return state


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m malamute_pack.pair.check DATA-DIR", file=sys.stderr)
        return 2
    state = current_state(Path(args[0]))
    print(state)
    return 0 if state == "active" else 1


if __name__ == "__main__":
    sys.exit(main())
