"""
Last-value streams in the journal's writer thread: for each stream
compacted by subject (``streams.compact`` is ``subject``, docs/protocol.md)
the ``stream_last_values`` table holds the sequence number of each
subject's latest record, kept by the writer in the transaction that writes
the record, and rebuilt from the retained records when compaction is
turned on.

L{LastValues} is the writer's state of them: which streams are compacted,
how many subjects each keeps (at most ``limit``: a record of a new subject
past it is stored but not kept as a last value, and counted), what
retention needs to skip a stream's kept records cheaply (L{Compacted}'s
``floor`` and ``superseded``), and the snapshots being read
(L{Capture}). Changes of a transaction are applied to the state only once
it commits (L{Pending}); a capture is filled before, so that a read that
sees a commit sees what the capture holds for it.

Only batches that hold records of a compacted stream do anything here: a
stream that is not compacted costs one set lookup per batch.

Tests: ``tests/unit/test_journal_last_values.py``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from malamute_pack.protocol.records import StreamRow

# The one compaction there is (``streams.compact``; '' for none).
SUBJECT: Final = "subject"

_UPSERT: Final = (
    "INSERT INTO stream_last_values (stream, subject, seq) VALUES (?, ?, ?) "
    "ON CONFLICT (stream, subject) DO UPDATE SET seq = excluded.seq WHERE excluded.seq > seq"
)
# Subjects looked up per statement: statements of a few fixed sizes, which
# SQLite keeps prepared (a remainder takes the smaller ones).
_LOOKUP_SIZES: Final = (256, 64, 16, 4, 1)
_CLEAR: Final = "DELETE FROM stream_last_values WHERE stream = ?"
# The latest retained record of each subject up to a sequence number, the
# most recent ``limit`` subjects.
_REBUILD: Final = (
    "INSERT INTO stream_last_values (stream, subject, seq) "
    "SELECT stream, subject, max(seq) FROM stream_messages WHERE stream = ? AND seq <= ? "
    "GROUP BY subject ORDER BY max(seq) DESC LIMIT ?"
)
# Past every sequence number.
_ALL: Final = 1 << 62
_MARK: Final = (
    "INSERT INTO streams (stream, last_seq, message_count, total_bytes, compact) "
    "VALUES (?, 0, 0, 0, ?) ON CONFLICT (stream) DO UPDATE SET compact = excluded.compact"
)
_UNMARK: Final = "UPDATE streams SET compact = '' WHERE stream = ?"
_FORGET_DELETED: Final = "DELETE FROM stream_last_values WHERE stream = ? AND seq <= ?"


def _lookup(size: int) -> str:
    marks = ", ".join("?" * size)
    return f"SELECT subject, seq FROM stream_last_values WHERE stream = ? AND subject IN ({marks})"


_LOOKUPS: Final = {size: _lookup(size) for size in _LOOKUP_SIZES}


@dataclass(slots=True)
class Capture:
    """
    A last-value snapshot of ``stream`` as of sequence number ``through``,
    being read: from its place in the order of writes on, the writer notes
    in ``old`` the latest record (as of ``through``) of each subject it
    updates, so that the read can tell a subject's value as of
    ``through`` even when it sees a later one. ``open`` until the read is
    done (the writer then forgets it).
    """

    stream: str
    through: int
    old: dict[str, int] = field(default_factory=dict)
    open: bool = True


@dataclass(slots=True)
class Compacted:
    """
    One compacted stream: ``subjects`` kept, ``not_kept`` records of new
    subjects past the limit (since the journal opened), and for retention
    (:mod:`malamute_pack.journal.retention`) ``floor``, below which every
    stored record is a kept last value or in ``superseded`` (records that
    have stopped being their subject's latest since retention last walked
    past them). A floor of 0 is not known: retention walks from the start.
    """

    subjects: int = 0
    not_kept: int = 0
    floor: int = 0
    superseded: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Pending:
    """What one transaction changed, for the state once it commits."""

    subjects: dict[str, int] = field(default_factory=dict)
    not_kept: dict[str, int] = field(default_factory=dict)
    superseded: dict[str, list[int]] = field(default_factory=dict)
    # The compacted streams after a change of them (None: unchanged).
    streams: dict[str, Compacted] | None = None


class LastValues:
    """The writer's state of the last-value streams, each keeping at most ``limit`` subjects."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streams: dict[str, Compacted] = {}
        self.captures: list[Capture] = []

    def load(self, conn: sqlite3.Connection) -> None:
        """The compacted streams and their subjects, as the journal on ``conn`` holds them."""
        names = [
            row[0]
            for row in conn.execute("SELECT stream FROM streams WHERE compact = ?", (SUBJECT,))
        ]
        self.streams = {name: Compacted() for name in names}
        for name, subjects in conn.execute(
            "SELECT stream, count(*) FROM stream_last_values GROUP BY stream"
        ):
            if name in self.streams:
                self.streams[name].subjects = subjects

    def names(self) -> frozenset[str]:
        return frozenset(self.streams)

    def involved(self, streams: Iterable[str]) -> bool:
        """Whether any of ``streams`` is compacted (the only cost of a batch of others)."""
        return bool(self.streams) and not self.streams.keys().isdisjoint(streams)

    # Records written.

    def keep(self, conn: sqlite3.Connection, rows: Iterable[StreamRow], pending: Pending) -> None:
        """
        Make each record of ``rows`` that belongs to a compacted stream its
        subject's last value (inside the caller's transaction), up to the
        limit of subjects; what changes, in ``pending``.
        """
        streams = pending.streams if pending.streams is not None else self.streams
        # stream -> subject -> [latest seq, records, first seq]
        latest: dict[str, dict[str, list[int]]] = {}
        for row in rows:
            name = row[0]
            if name not in streams:
                continue
            subjects = latest.get(name)
            if subjects is None:
                subjects = latest[name] = {}
            found = subjects.get(row[4])
            if found is None:
                subjects[row[4]] = [row[1], 1, row[1]]
            else:
                found[0] = max(found[0], row[1])
                found[1] += 1
                found[2] = min(found[2], row[1])
        for name, subjects in latest.items():
            self._keep_stream(conn, name, streams[name], subjects, pending)

    def _keep_stream(
        self,
        conn: sqlite3.Connection,
        name: str,
        state: Compacted,
        subjects: dict[str, list[int]],
        pending: Pending,
    ) -> None:
        old = dict(_existing(conn, name, list(subjects)))
        # New subjects take the room left in the order they came.
        new = sorted(
            (first, subject) for subject, (_, _, first) in subjects.items() if subject not in old
        )
        room = self.limit - state.subjects - pending.subjects.get(name, 0)
        refused = new[max(0, room) :]
        kept_new = new[: max(0, room)]
        upserts = [(name, subject, subjects[subject][0]) for subject in old]
        upserts += [(name, subject, subjects[subject][0]) for _, subject in kept_new]
        if upserts:
            conn.executemany(_UPSERT, upserts)
        if kept_new:
            pending.subjects[name] = pending.subjects.get(name, 0) + len(kept_new)
        if refused:
            records = sum(subjects[subject][1] for _, subject in refused)
            pending.not_kept[name] = pending.not_kept.get(name, 0) + records
        if state.floor:
            below = [seq for seq in old.values() if seq < state.floor]
            if below:
                pending.superseded.setdefault(name, []).extend(below)
        for capture in self.captures:
            if capture.open and capture.stream == name:
                through, notes = capture.through, capture.old
                for subject, seq in old.items():
                    if seq <= through and subject not in notes:
                        notes[subject] = seq

    # Compaction turned on and off.

    def change(
        self,
        conn: sqlite3.Connection,
        wanted: frozenset[str],
        rebuild: bool,
        pending: Pending,
        upto: Mapping[str, int],
    ) -> None:
        """
        Compact exactly the streams ``wanted`` (inside the caller's
        transaction): a stream turned on (or every one, with ``rebuild``)
        gets its last values from its retained records (up to ``upto``'s
        sequence number for it: later ones, written after the change, are
        kept by L{keep} in their turn); one turned off loses them.
        """
        current = pending.streams if pending.streams is not None else self.streams
        after = {name: state for name, state in current.items() if name in wanted}
        for name in current.keys() - wanted:
            conn.execute(_CLEAR, (name,))
            conn.execute(_UNMARK, (name,))
        for name in sorted(wanted):
            if name in after and not rebuild:
                continue
            conn.execute(_CLEAR, (name,))
            kept = conn.execute(_REBUILD, (name, upto.get(name, _ALL), self.limit)).rowcount
            conn.execute(_MARK, (name, SUBJECT))
            previous = after.get(name)
            after[name] = Compacted(kept, previous.not_kept if previous else 0)
            pending.subjects.pop(name, None)
            pending.superseded.pop(name, None)
        pending.streams = after

    def deleted(
        self, conn: sqlite3.Connection, stream: str, through: int, pending: Pending
    ) -> None:
        """Records of ``stream`` up to ``through`` deleted: their last values go too."""
        current = pending.streams if pending.streams is not None else self.streams
        if stream not in current:
            return
        gone = conn.execute(_FORGET_DELETED, (stream, through)).rowcount
        if gone:
            pending.subjects[stream] = pending.subjects.get(stream, 0) - gone

    # After the transaction.

    def committed(self, pending: Pending) -> None:
        """``pending``'s transaction committed: the state follows."""
        if pending.streams is not None:
            self.streams = pending.streams
        streams = self.streams
        for name, change in pending.subjects.items():
            if name in streams:
                streams[name].subjects += change
        for name, records in pending.not_kept.items():
            if name in streams:
                streams[name].not_kept += records
        for name, seqs in pending.superseded.items():
            if name in streams:
                streams[name].superseded.extend(seqs)
        if any(not capture.open for capture in self.captures):
            self.captures = [capture for capture in self.captures if capture.open]

    def forget_floors(self) -> None:
        """What retention knew of the records below each floor is lost: walk from the start."""
        for state in self.streams.values():
            state.floor = 0
            state.superseded.clear()


def _existing(
    conn: sqlite3.Connection, stream: str, subjects: Sequence[str]
) -> Iterator[tuple[str, int]]:
    """(subject, seq) of those of ``subjects`` that ``stream`` keeps a last value of."""
    start = 0
    while start < len(subjects):
        size = next(s for s in _LOOKUP_SIZES if s <= len(subjects) - start)
        yield from conn.execute(_LOOKUPS[size], (stream, *subjects[start : start + size]))
        start += size
