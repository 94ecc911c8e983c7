"""
A setting of the whole Python process that services hold while they run:
the garbage collector's thresholds and frozen objects
(L{malamute_pack.gcservice}), the GIL switch interval
(L{malamute_pack.journal.service}).

Several brokers can run in one process (the tests, a pair's two sides in
one), so a service cannot simply save the setting when it starts and put it
back when it stops: the first to stop would take it from the others. A
L{ProcessSetting} counts its holders instead: the first to hold it saves
what was there, each holder applies its value, and the last to let go puts
back what the first found.

Tests: ``tests/unit/test_process_setting.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class ProcessSetting(Generic[T]):
    """The setting C{read} reads and C{write} writes, held by services."""

    def __init__(self, read: Callable[[], T], write: Callable[[T], None]) -> None:
        self._read = read
        self._write = write
        self._holders = 0
        self._saved: list[T] = []  # what the first holder found, while held

    @property
    def holders(self) -> int:
        """How many hold it now."""
        return self._holders

    def hold(self, value: T) -> None:
        """Apply C{value}; the first holder saves what was there."""
        if self._holders == 0:
            self._saved.append(self._read())
        self._holders += 1
        self._write(value)

    def apply(self, value: T) -> None:
        """Apply C{value} while held (a holder that changed its mind)."""
        if self._holders == 0:
            raise RuntimeError("applied a process setting nobody holds")
        self._write(value)

    def release(self) -> None:
        """Let go; the last holder puts back what the first found."""
        if self._holders == 0:
            raise RuntimeError("released a process setting nobody holds")
        self._holders -= 1
        if self._holders == 0:
            self._write(self._saved.pop())
