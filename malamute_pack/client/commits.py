"""
A consumer's commits (STREAM_COMMIT, version 2) waiting for their
STREAM_COMMITTED: each is settled with the position the broker made durable,
or with the broker's refusal; sent again if the broker forgot us before it
answered (a commit is idempotent: a position never moves back).

Tests: ``tests/unit/test_client_commits.py``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from malamute_pack.client.errors import ClientError, MalamuteError
from malamute_pack.protocol import mlm

# Settled with the position made durable, or the error.
CommitCallback = Callable[[int | ClientError], None]


class Commits:
    """
    The commits sent and not answered yet, oldest first.

    @param post: sends (or holds, while the broker is away) a commit's frames.
    """

    def __init__(self, post: Callable[[list[bytes]], None]) -> None:
        self._post = post
        self._pending: deque[tuple[str, int, CommitCallback]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def commit(self, stream: str, sequence: int, settled: CommitCallback) -> None:
        """Acknowledge the records of C{stream} up to C{sequence}; C{settled} when answered."""
        self._post(mlm.encode(mlm.StreamCommit(stream, sequence)))
        self._pending.append((stream, sequence, settled))

    def committed(self, message: mlm.StreamCommitted) -> None:
        """
        The broker's answer: a position made durable settles every commit of
        that stream up to it; a refusal settles the oldest commit of that
        stream and sequence (or of that stream) with the error.
        """
        stream, position = message.address, message.sequence
        pending = self._pending
        if message.status_code == mlm.SUCCESS:
            settled = [p for p in pending if p[0] == stream and p[1] <= position]
            self._pending = deque(p for p in pending if p not in settled)
            for _, _, callback in settled:
                callback(position)
            return
        same = [p for p in pending if p[0] == stream]
        match = next((p for p in same if p[1] == position), same[0] if same else None)
        if match is not None:
            pending.remove(match)
            match[2](MalamuteError(message.status_code, message.status_reason))

    def resend(self) -> None:
        """The broker forgot us: every commit not answered goes again, in order."""
        for stream, sequence, _ in self._pending:
            self._post(mlm.encode(mlm.StreamCommit(stream, sequence)))

    def drop_all(self, error: ClientError) -> None:
        """The client closed: every commit waiting fails with C{error}."""
        pending, self._pending = self._pending, deque()
        for _, _, callback in pending:
            callback(error)
