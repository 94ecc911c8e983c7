"""
Stream retention: the policy (by count, age and bytes) and the pruning step
the writer thread runs for it.

Pruning always removes a prefix of a stream (the oldest sequence numbers),
so what a stream retains is one contiguous range and ``first_seq`` only ever
advances. A record goes while the stream holds more than ``max_count``
records, more than ``max_bytes`` bytes, or the record is older than
``max_age_s``; the first record that breaks none of these stops the scan,
even if a later record carries an older timestamp. A step deletes at most
``budget`` records so that one large prune never holds the writer for long;
the writer interleaves steps with write batches until the prune is done.

Tests: ``tests/unit/test_journal_retention.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

# The policy: defined with the pair link's codec, which carries it.
from malamute_pack.protocol.records import RetentionPolicy

DEFAULT_RETENTION: Final = RetentionPolicy(
    max_count=1_000_000, max_age_s=7 * 24 * 3600.0, max_bytes=1 << 30
)


@dataclass(slots=True)
class PruneStep:
    """
    What one pruning step did: records deleted, the first sequence number
    each pruned stream still retains, and the stream to resume from
    (``None`` once every stream is within its policy).
    """

    deleted: int = 0
    first_seq: dict[str, int] = field(default_factory=dict)
    resume_from: str | None = None


def prune_step(
    conn: sqlite3.Connection,
    policy_for: Callable[[str], RetentionPolicy],
    now: float,
    budget: int,
    resume_from: str = "",
) -> PruneStep:
    """
    Delete, inside the caller's transaction on ``conn``, at most ``budget``
    records that the streams' policies no longer retain at time ``now``,
    visiting streams in name order from ``resume_from``.
    """
    step = PruneStep()
    streams = conn.execute(
        "SELECT stream, message_count, total_bytes FROM streams WHERE stream >= ? ORDER BY stream",
        (resume_from,),
    ).fetchall()
    for stream, count, total in streams:
        left = budget - step.deleted
        if left <= 0:
            step.resume_from = stream
            return step
        deleted, last_seq = _prune_stream(conn, stream, policy_for(stream), count, total, now, left)
        if deleted:
            step.deleted += deleted
            step.first_seq[stream] = last_seq + 1
        if deleted == left:
            # The budget ran out inside this stream: it may hold more to prune.
            step.resume_from = stream
            return step
    return step


def _prune_stream(
    conn: sqlite3.Connection,
    stream: str,
    policy: RetentionPolicy,
    count: int,
    total: int,
    now: float,
    budget: int,
) -> tuple[int, int]:
    """Prune one stream's oldest records; return (records deleted, last seq deleted)."""
    excess_count = count - policy.max_count if policy.max_count is not None else 0
    excess_bytes = total - policy.max_bytes if policy.max_bytes is not None else 0
    cutoff = now - policy.max_age_s if policy.max_age_s is not None else None
    if excess_count <= 0 and excess_bytes <= 0 and cutoff is None:
        return 0, 0
    deleted = freed = last_seq = 0
    # Walks the primary key from the oldest record: costs what it deletes, plus one row.
    cursor = conn.execute(
        "SELECT seq, ts, bytes FROM stream_messages WHERE stream = ? ORDER BY seq LIMIT ?",
        (stream, budget),
    )
    try:
        for seq, ts, size in cursor:
            too_old = cutoff is not None and ts < cutoff
            if deleted < excess_count or freed < excess_bytes or too_old:
                deleted += 1
                freed += size
                last_seq = seq
            else:
                break
    finally:
        cursor.close()
    if deleted:
        conn.execute(
            "DELETE FROM stream_messages WHERE stream = ? AND seq <= ?", (stream, last_seq)
        )
        conn.execute(
            "UPDATE streams SET message_count = message_count - ?, total_bytes = total_bytes - ? "
            "WHERE stream = ?",
            (deleted, freed, stream),
        )
    return deleted, last_seq
