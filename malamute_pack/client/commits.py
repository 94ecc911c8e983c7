"""
A consumer's commits (STREAM_COMMIT, version 2) waiting for their
STREAM_COMMITTED: each is settled with the position the broker made durable,
or with the broker's refusal, or fails at its deadline; sent again if the
broker forgot us before it answered (a commit is idempotent: a position
never moves back).

The broker answers a connection's commits of one stream one by one, in the
order they were sent: each answer settles the oldest commit of its stream
still on the wire.

- OK (200) settles it with the position the broker made durable, which is
  not always the one asked for: a reader's commit past the last record
  it was sent is clamped to it (and one below its position answers that
  position). The result is the broker's position, whatever was asked.
- A refusal (300: not a consumer of the stream, taken over, no longer a
  group's member, a record not delivered to this member, a number past the
  stream's last, a journal error), which the broker sends at once,
  settles the oldest commit of that stream and sequence (or, if none has
  that sequence, of that stream) with L{MalamuteError}.
- A commit not answered within C{timeout} seconds of the call (the
  client's C{commit_timeout}) fails with L{BrokerUnreachableError}. Its
  answer may still come: it stays on the wire, answered by nobody, so that
  the answers after it settle the commits they belong to. (As for the
  STOREDs of the outbox, this counts on the broker answering every commit
  it got on a connection it still knows.)

While the broker is away, commits wait (those made while the connection is
not usable are sent once it is again). When the broker forgot us (a
restart, an expiry, another endpoint), every commit not answered yet is
sent again once the connection is usable (after the replay of the
consumers), in the order first made; answers that come meanwhile are late
ones of the connection the broker forgot, and are dropped. The deadline
does not restart on a resend: it bounds the wait of the caller from its
call, however many reconnections happen; a commit past its deadline is not
sent again.

Tests: ``tests/unit/test_client_commits.py``, ``tests/unit/test_client_core.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from twisted.logger import Logger

from malamute_pack.client.errors import BrokerUnreachableError, ClientError, MalamuteError
from malamute_pack.client.heartbeat import Clock
from malamute_pack.protocol import mlm

_log = Logger()

# Settled with the position made durable, or the error.
CommitCallback = Callable[[int | ClientError], None]


@dataclass(eq=False, slots=True)
class _Commit:
    """
    One commit: C{settled} is None once its caller has its result (an
    answer or the deadline); C{sent}, whether it is on the current
    connection (an answer is owed for it).
    """

    stream: str
    sequence: int
    settled: CommitCallback | None
    deadline: float
    sent: bool = False


class Commits:
    """
    The commits whose callers wait for an answer, oldest first, and those
    on the wire per stream, in the order sent.

    @param send: sends a commit's frames now (the connection is usable).
    @param clock: gives the time the deadlines count from.
    @param timeout: seconds a commit waits for its answer, from the call.
    """

    def __init__(self, send: Callable[[list[bytes]], None], clock: Clock, timeout: float) -> None:
        self._send_frames = send
        self._clock = clock
        self._timeout = timeout
        # Commits not settled yet (and, lazily removed, settled ones), in
        # the order made: so in the order of their deadlines too.
        self._waiting: deque[_Commit] = deque()
        self._live = 0
        # Per stream, the commits on the wire, in the order sent, settled
        # ones (past their deadline) included: each answer takes the oldest.
        self._owed: dict[str, deque[_Commit]] = {}

    def __len__(self) -> int:
        """Commits whose callers still wait."""
        return self._live

    def commit(self, stream: str, sequence: int, settled: CommitCallback, usable: bool) -> None:
        """
        Acknowledge the records of C{stream} up to C{sequence}; C{settled}
        when answered or at the deadline. Sent now if the connection is
        C{usable}, else when it is (L{flush}).
        """
        entry = _Commit(stream, sequence, settled, self._clock.seconds() + self._timeout)
        self._waiting.append(entry)
        self._live += 1
        if usable:
            self._send(entry)

    def committed(self, message: mlm.StreamCommitted) -> None:
        """
        The broker's answer to the oldest commit of its stream on the wire:
        OK settles that commit with the broker's position; a refusal settles
        the oldest of that stream and sequence (or of that stream) with the
        error.
        """
        stream = message.address
        owed = self._owed.get(stream)
        if not owed:
            _log.info(
                "STREAM_COMMITTED for stream {stream} with no commit waiting for it ignored",
                stream=stream,
            )
            return
        if message.status_code == mlm.SUCCESS:
            self._settle(owed.popleft(), message.sequence)
        else:
            entry = next((c for c in owed if c.sequence == message.sequence), owed[0])
            owed.remove(entry)
            self._settle(entry, MalamuteError(message.status_code, message.status_reason))
        if not owed:
            del self._owed[stream]

    def resend(self) -> None:
        """
        The broker forgot us: no answer comes for what was sent; every
        commit not settled goes again at the next L{flush}, in order.
        """
        self._owed.clear()
        for entry in self._waiting:
            entry.sent = False

    def flush(self) -> None:
        """The connection is usable: send the commits that wait for it, in order."""
        for entry in self._waiting:
            if entry.settled is not None and not entry.sent:
                self._send(entry)

    def wakeup_at(self) -> float | None:
        """The deadline of the oldest commit whose caller waits, or None."""
        waiting = self._waiting
        while waiting and waiting[0].settled is None:
            waiting.popleft()
        return waiting[0].deadline if waiting else None

    def on_time(self, now: float) -> None:
        """Fail the commits whose deadline has come."""
        waiting = self._waiting
        while waiting and (waiting[0].settled is None or waiting[0].deadline <= now):
            entry = waiting.popleft()
            self._settle(
                entry,
                BrokerUnreachableError(
                    f"no STREAM_COMMITTED for stream {entry.stream!r} up to {entry.sequence} "
                    f"within {self._timeout:g}s"
                ),
            )

    def drop_all(self, error: ClientError) -> None:
        """The client closed: every commit waiting fails with C{error}."""
        waiting, self._waiting = self._waiting, deque()
        self._owed.clear()
        for entry in waiting:
            self._settle(entry, error)

    def _send(self, entry: _Commit) -> None:
        self._send_frames(mlm.encode(mlm.StreamCommit(entry.stream, entry.sequence)))
        entry.sent = True
        self._owed.setdefault(entry.stream, deque()).append(entry)

    def _settle(self, entry: _Commit, result: int | ClientError) -> None:
        """Give the caller its result (once: nothing for a settled commit)."""
        settled = entry.settled
        if settled is None:
            return
        entry.settled = None
        self._live -= 1
        settled(result)
