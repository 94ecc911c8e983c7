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

A last-value stream (compacted by subject,
:mod:`malamute_pack.journal.last_values`) never loses a subject's latest
record: the scan steps over those (they still count towards the stream's
records and bytes) and deletes the others by the same rules, so what it
retains is no longer contiguous (``first_seq`` is its oldest record still
stored). Its scan starts at the stream's ``floor``, below which every
record is a kept latest one or one known to be superseded since, and its
budget counts the records it looks at, so kept records are not walked
again at every prune.

Tests: ``tests/unit/test_journal_retention.py``, ``tests/unit/test_journal_last_values.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from malamute_pack.journal.last_values import Compacted

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
    compacted: Mapping[str, Compacted] | None = None,
) -> PruneStep:
    """
    Delete, inside the caller's transaction on ``conn``, at most ``budget``
    records that the streams' policies no longer retain at time ``now``,
    visiting streams in name order from ``resume_from``; the streams of
    ``compacted`` keep each subject's latest record (their budget counts
    the records looked at).
    """
    step = PruneStep()
    streams = conn.execute(
        "SELECT stream, message_count, total_bytes FROM streams WHERE stream >= ? ORDER BY stream",
        (resume_from,),
    ).fetchall()
    spent = 0
    for stream, count, total in streams:
        left = budget - spent
        if left <= 0:
            step.resume_from = stream
            return step
        policy = policy_for(stream)
        state = compacted.get(stream) if compacted else None
        if state is None:
            deleted, last_seq = _prune_stream(conn, stream, policy, count, total, now, left)
            used, first = deleted, last_seq + 1
        else:
            deleted, used = _prune_compacted(conn, stream, policy, count, total, now, left, state)
            first = _first_stored(conn, stream) if deleted else 0
        if deleted:
            step.deleted += deleted
            step.first_seq[stream] = first
        spent += used
        if used >= left:
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


# A last-value stream's records from a number on, each with whether it is
# its subject's latest (kept).
_WALK: Final = (
    "SELECT m.seq, m.ts, m.bytes, EXISTS (SELECT 1 FROM stream_last_values v"
    " WHERE v.stream = m.stream AND v.subject = m.subject AND v.seq = m.seq)"
    " FROM stream_messages m WHERE m.stream = ? AND m.seq >= ? ORDER BY m.seq LIMIT ?"
)
_SUPERSEDED: Final = "SELECT seq, ts, bytes FROM stream_messages WHERE stream = ? AND seq = ?"
_DELETE_ONE: Final = "DELETE FROM stream_messages WHERE stream = ? AND seq = ?"


def _prune_compacted(
    conn: sqlite3.Connection,
    stream: str,
    policy: RetentionPolicy,
    count: int,
    total: int,
    now: float,
    budget: int,
    state: Compacted,
) -> tuple[int, int]:
    """
    Prune a last-value stream's oldest records that are not their
    subject's latest: those superseded below its floor first, then on
    from the floor, moving it on. Returns (records deleted, records looked
    at, at most ``budget``). ``state`` is moved on inside the transaction:
    if it fails, the caller forgets every floor.
    """
    excess_count = count - policy.max_count if policy.max_count is not None else 0
    excess_bytes = total - policy.max_bytes if policy.max_bytes is not None else 0
    cutoff = now - policy.max_age_s if policy.max_age_s is not None else None
    if excess_count <= 0 and excess_bytes <= 0 and cutoff is None:
        return 0, 0
    doomed: list[tuple[str, int]] = []
    freed = looked = 0

    def breaks(ts: float) -> bool:
        """Whether a record of time ``ts`` is past what the policy retains."""
        return (
            len(doomed) < excess_count
            or freed < excess_bytes
            or (cutoff is not None and ts < cutoff)
        )

    stopped = False
    if state.superseded:
        # All older than anything from the floor on: the oldest candidates.
        waiting = sorted(set(state.superseded))
        handled = 0
        for seq in waiting:
            if looked >= budget:
                break
            looked += 1
            row = conn.execute(_SUPERSEDED, (stream, seq)).fetchone()
            if row is None:  # deleted meanwhile
                handled += 1
                continue
            if not breaks(row[1]):
                stopped = True
                break
            doomed.append((stream, seq))
            freed += row[2]
            handled += 1
        state.superseded = waiting[handled:]
    if not stopped and looked < budget:
        cursor = conn.execute(_WALK, (stream, state.floor, budget - looked))
        try:
            for seq, ts, size, latest in cursor:
                looked += 1
                if not breaks(ts):
                    state.floor = seq
                    break
                if not latest:
                    doomed.append((stream, seq))
                    freed += size
                state.floor = seq + 1
        finally:
            cursor.close()
    if doomed:
        conn.executemany(_DELETE_ONE, doomed)
        conn.execute(
            "UPDATE streams SET message_count = message_count - ?, total_bytes = total_bytes - ? "
            "WHERE stream = ?",
            (len(doomed), freed, stream),
        )
    return len(doomed), looked


def _first_stored(conn: sqlite3.Connection, stream: str) -> int:
    """The first sequence number ``stream`` stores (the one after its last if none)."""
    first, last = conn.execute(
        "SELECT (SELECT min(seq) FROM stream_messages WHERE stream = ?),"
        " (SELECT last_seq FROM streams WHERE stream = ?)",
        (stream, stream),
    ).fetchone()
    return int(first) if first is not None else int(last or 0) + 1
