"""
Helpers shared by the test modules: skipping slow system tests and locating
the shared reference material.

Slow system tests (real broker processes, kill -9 runs, tmpfs mounts) run in
CI and are skipped locally with ``MALAMUTE_SKIP_SLOW=1``.

Tests: this module is exercised by every test module that imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("MALAMUTE_SHARED", Path(__file__).resolve().parents[2] / "shared"))

# Set as a test class's or method's ``skip`` attribute.
skip_slow: str | None = (
    "slow system test skipped: MALAMUTE_SKIP_SLOW is set"
    if os.environ.get("MALAMUTE_SKIP_SLOW")
    else None
)
