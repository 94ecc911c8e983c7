"""
Names for a soak that no other soak running on the machine uses: a
namespace prefix (C{mps}, a letter for the topology, a slot character:
C{mpspa}, the pair link's LAN C{mpspal}) and two subnets of 10.78/16 (the
LAN's and the pair link's; nothing else on the machine uses 10.78).

A run claims a slot by holding an exclusive C{flock} on a file named for
it (in C{/run/malamute-soak}, or the temporary directory): the lock goes
with the process, however it ends, so a slot left by a killed run is free
again, and namespaces of its prefix that are still there are that run's
leftovers (L{malamute_pack.testing.netns.Lan.create} deletes them).

Tests: ``tests/unit/test_soak_nemesis.py``.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

# The slot characters, and each topology's letter and subnet block.
SLOTS: Final = "0123456789abcdefghijklmnopqrstuvwxyz"
LETTERS: Final = {"pack3": "k", "pair": "p", "pair-in-pack": "q"}
_BLOCK: Final = {"pack3": 0, "pair": 72, "pair-in-pack": 144}


@dataclass(frozen=True, slots=True)
class Names:
    """A run's namespace prefix and subnets (three octets each)."""

    prefix: str
    subnet: str
    pair_subnet: str


def names(topology: str, slot: int) -> Names:
    """The names of slot C{slot} (0 to 35) of C{topology}."""
    if not 0 <= slot < len(SLOTS):
        raise ValueError(f"slot {slot}: want 0 to {len(SLOTS) - 1}")
    third = _BLOCK[topology] + 2 * slot
    return Names(f"mps{LETTERS[topology]}{SLOTS[slot]}", f"10.78.{third}", f"10.78.{third + 1}")


def lock_directory() -> Path:
    run = Path("/run")
    base = run if os.access(run, os.W_OK) else Path(tempfile.gettempdir())
    path = base / "malamute-soak"
    path.mkdir(exist_ok=True)
    return path


class Claim:
    """A slot held by this process (L{claim}); L{release} gives it back."""

    def __init__(self, topology: str, slot: int, lock: IO[bytes]) -> None:
        self.topology = topology
        self.slot = slot
        self.names = names(topology, slot)
        self._lock = lock

    def release(self) -> None:
        if not self._lock.closed:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()


def claim(topology: str, slot: int | None = None, directory: Path | None = None) -> Claim:
    """
    Hold slot C{slot} of C{topology}, or the first free one.

    @raise RuntimeError: that slot (or every slot) is held by another run.
    """
    directory = directory or lock_directory()
    wanted = range(len(SLOTS)) if slot is None else [slot]
    for n in wanted:
        names(topology, n)  # checks the slot
        lock = (directory / f"{LETTERS[topology]}{SLOTS[n]}.lock").open("ab")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            continue
        return Claim(topology, n, lock)
    held = "every slot" if slot is None else f"slot {slot}"
    raise RuntimeError(f"{held} of topology {topology} is held by another soak running now")
