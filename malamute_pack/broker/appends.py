"""
The keys of idempotent appends (STREAM_APPEND, ``docs/protocol.md`` "Bulk
reads and idempotent appends"): which (stream, key) pairs the broker has
written, with the sequence numbers their records got, and which are being
written now, with the parties waiting for their outcome.

A writer that sends the same key again (a Spark task retried, a streaming
query restarted from its checkpoint) is answered with the first append's
sequence numbers instead of writing the records twice. The broker remembers
at most C{limit} keys, in all streams: the oldest are forgotten first (and
deleted from the journal in the transaction of the append that pushed them
out), so memory stays bounded while a restarted writer, which repeats only
its last few appends, still finds its keys.

An append a pair's partner did not acknowledge (it was unreachable) failed
for its writer, but its records are on this broker's disk, under its key:
the key is remembered as written and *unconfirmed*, with the position of
the write (L{StoreError.unconfirmed}); a retry writes nothing and waits for
the partner to have that write (L{Store.confirm}), then is answered with
the first append's numbers, or fails again.

Tests: ``tests/unit/test_broker_appends.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from malamute_pack.protocol.records import AppendKey

# Told the outcome of an append: first and last sequence numbers, status
# code, reason.
Waiter = Callable[[int, int, int, str], None]


class AppendKeys:
    """
    Remembered and pending append keys.

    @ivar forgotten: keys forgotten to stay within the limit.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"append-keys must be at least 1, not {limit}")
        self._limit = limit
        self._written: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        # Written keys whose write the pair's partner has not acknowledged: its position.
        self._unconfirmed: dict[tuple[str, str], int] = {}
        self._pending: dict[tuple[str, str], list[Waiter]] = {}
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._written) + len(self._pending)

    def restore(self, keys: Iterable[AppendKey]) -> None:
        """Remember the keys a journal kept, oldest first."""
        for key in keys:
            self._written[(key.stream, key.key)] = (key.first, key.last)
            self._written.move_to_end((key.stream, key.key))
            self._unconfirmed.pop((key.stream, key.key), None)
        while len(self._written) > self._limit:
            self._unconfirmed.pop(self._written.popitem(last=False)[0], None)

    def written(self, stream: str, key: str) -> tuple[int, int] | None:
        """The sequence numbers of the records written under C{key}, if it was."""
        return self._written.get((stream, key))

    def unconfirmed(self, stream: str, key: str) -> int | None:
        """
        The position of the write of C{key}, if it is written and the
        pair's partner has not acknowledged it (a retry confirms it).
        """
        return self._unconfirmed.get((stream, key))

    def wait(self, stream: str, key: str, waiter: Waiter) -> bool:
        """If C{key} is being written, tell C{waiter} its outcome too; whether it is."""
        waiting = self._pending.get((stream, key))
        if waiting is None:
            return False
        waiting.append(waiter)
        return True

    def begin(self, stream: str, key: str, waiter: Waiter) -> list[tuple[str, str]]:
        """
        C{key} is being written now; C{waiter} gets its outcome. The keys
        forgotten to make room for it, which the journal deletes with it.
        """
        self._pending[(stream, key)] = [waiter]
        forget: list[tuple[str, str]] = []
        while self._written and len(self) > self._limit:
            old = self._written.popitem(last=False)[0]
            self._unconfirmed.pop(old, None)
            forget.append(old)
        self.forgotten += len(forget)
        return forget

    def begin_confirm(self, stream: str, key: str, waiter: Waiter) -> None:
        """
        The unconfirmed write of C{key} is being confirmed; C{waiter} (and
        whoever L{wait}s) gets the outcome (L{end}).
        """
        self._pending[(stream, key)] = [waiter]

    def end(
        self,
        stream: str,
        key: str,
        first: int,
        last: int,
        code: int,
        reason: str,
        unconfirmed: int | None = None,
    ) -> None:
        """
        The append of C{key} is durable (C{code} 200 or 208: remembered),
        or failed: forgotten, so that a retry writes it, unless it is on
        this disk all the same (C{unconfirmed}, the write's position: a
        retry confirms it). Its waiters are told.
        """
        waiting = self._pending.pop((stream, key), [])
        if code < 300:
            self._written[(stream, key)] = (first, last)
            self._unconfirmed.pop((stream, key), None)
        elif unconfirmed is not None:
            self._written[(stream, key)] = (first, last)
            self._unconfirmed[(stream, key)] = unconfirmed
        else:
            self._written.pop((stream, key), None)
            self._unconfirmed.pop((stream, key), None)
        for waiter in waiting:
            waiter(first, last, code, reason)
