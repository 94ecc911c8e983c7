"""
Sequencing and the tail: the journal's numbers, handed out synchronously
in the reactor thread, and the stream records not yet committed.

Per stream the next sequence number and the first one still retained, and
the next queued-record id, seeded from what the journal recovered
(:mod:`malamute_pack.journal.opening`) and moved on as records are
appended, deleted, pruned, or applied from a pair's partner. Each stream
record stays in its stream's in-memory tail from its append until its
batch has committed, so a reader sees it at once; the tail answers reads
that start in it, and the committed part comes from disk
(:mod:`malamute_pack.journal.reads`). A tail is a list in sequence order
(each record joins it as it is numbered): a committed batch leaves it in
one cut, found by bisection, with no loop over its records in Python.

Tests: ``tests/unit/test_journal_sequencing.py``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Final, NamedTuple

from malamute_pack.journal.records import row_record, stream_row
from malamute_pack.protocol.records import StreamRecord, StreamRow

# A stream row's sequence number.
_SEQ: Final = itemgetter(1)


class Ceiling(NamedTuple):
    """The highest stream number and the highest letter id a journal may have given."""

    streams: int
    letters: int


class Sequencer:
    """The numbers of a journal and the tails of its streams."""

    def __init__(self) -> None:
        self._next_seq: dict[str, int] = {}
        self._first_seq: dict[str, int] = {}
        self._tails: dict[str, list[StreamRow]] = {}
        self._next_id = 1
        # The first number of a stream it does not know (1, unless a salvage
        # lost the names of some streams: malamute_pack.journal.salvage).
        self._start = 1

    def recovered(self, streams: dict[str, tuple[int, int]], last_id: int, floor: int = 0) -> None:
        """
        Start from what the journal holds: per stream (first, last), the
        last id, and where the numbers of a stream it does not know start
        after (C{floor}).
        """
        self._next_seq = {stream: last + 1 for stream, (_, last) in streams.items()}
        self._first_seq = {stream: first for stream, (first, _) in streams.items()}
        self._tails = {}
        self._next_id = last_id + 1
        self._start = floor + 1

    def stream_names(self) -> list[str]:
        """Every stream numbered so far (recovered or since), sorted."""
        return sorted(self._next_seq)

    # Numbers handed out.

    def stream_row(
        self,
        stream: str,
        sender: str,
        subject: str,
        content: Sequence[bytes],
        timestamp: float,
        origin: str,
        origin_seq: int,
    ) -> StreamRow:
        """The row of the next record of ``stream``, numbered and in its tail."""
        seq = self._next_seq.get(stream, self._start)
        self._next_seq[stream] = seq + 1
        if stream not in self._first_seq:
            self._first_seq[stream] = seq
        row = stream_row(stream, seq, timestamp, sender, subject, content, origin, origin_seq)
        tail = self._tails.get(stream)
        if tail is None:
            tail = self._tails[stream] = []
        tail.append(row)
        return row

    def batch_rows(
        self,
        stream: str,
        sender: str,
        records: Sequence[tuple[str, Sequence[bytes]]],
        timestamp: float,
    ) -> list[StreamRow]:
        """The rows of ``records`` (subject, frames), numbered in turn and in the tail."""
        first = self._next_seq.get(stream, self._start)
        self._next_seq[stream] = first + len(records)
        if stream not in self._first_seq:
            self._first_seq[stream] = first
        rows = [
            stream_row(stream, seq, timestamp, sender, subject, frames)
            for seq, (subject, frames) in enumerate(records, first)
        ]
        tail = self._tails.get(stream)
        if tail is None:
            tail = self._tails[stream] = []
        tail.extend(rows)
        return rows

    def queued_id(self) -> int:
        """The next queued record's id."""
        rid = self._next_id
        self._next_id = rid + 1
        return rid

    # What the numbers are.

    def first_seq(self, stream: str) -> int:
        """The first sequence number ``stream`` still retains (last_seq + 1 if none)."""
        return self._first_seq.get(stream, self._start)

    def last_seq(self, stream: str) -> int:
        """The last sequence number assigned in ``stream`` (0 for an unknown stream)."""
        return self._next_seq.get(stream, self._start) - 1

    def durable_seq(self, stream: str) -> int:
        """The last sequence number of ``stream`` whose record is committed (0 for none)."""
        tail = self._tails.get(stream)
        if tail:
            return int(tail[0][1]) - 1
        return self.last_seq(stream)

    # Numbers moved on.

    def committed(self, stream_last: dict[str, int]) -> None:
        """Per stream, the records through that number are committed: out of the tail."""
        tails = self._tails
        for stream, last in stream_last.items():
            tail = tails.get(stream)
            if not tail or tail[-1][1] <= last:
                tails.pop(stream, None)
            elif tail[0][1] <= last:
                del tail[: bisect_right(tail, last, key=_SEQ)]

    def forget_before(self, stream: str, first: int) -> None:
        """``stream`` retains nothing before ``first``."""
        if first > self._first_seq.get(stream, self._start):
            self._first_seq[stream] = first

    def pruned(self, first_seq: dict[str, int]) -> None:
        """Retention left each stream from its number on."""
        for stream, first in first_seq.items():
            self.forget_before(stream, first)

    def delete_all(self, stream: str) -> int:
        """Everything of ``stream`` assigned so far is gone for readers; its last number."""
        last = self.last_seq(stream)
        self.forget_before(stream, last + 1)
        return last

    def truncated(self, stream: str, last: int) -> None:
        """``stream`` now ends at ``last`` (a replica cut back to its active's history)."""
        self._next_seq[stream] = last + 1
        self._first_seq[stream] = min(self._first_seq.get(stream, last + 1), last + 1)

    def note_counters(self, lasts: dict[str, int], last_id: int) -> None:
        """Numbers handed out elsewhere (a pair's partner): never hand them out here."""
        for stream, last in lasts.items():
            if last >= self._next_seq.get(stream, self._start):
                self._next_seq[stream] = last + 1
        self._next_id = max(self._next_id, last_id + 1)

    def ceiling(self) -> Ceiling:
        """The highest stream number and letter id this journal may have given (0 for none)."""
        streams = max(max(self._next_seq.values(), default=1), self._start) - 1
        return Ceiling(streams, self._next_id - 1)

    def number_past(self, ceiling: Ceiling) -> None:
        """Give no stream number nor letter id up to C{ceiling}'s from now on."""
        above = ceiling.streams + 1
        next_seq = self._next_seq
        for stream, following in next_seq.items():
            if following < above:
                next_seq[stream] = above
        self._start = max(self._start, above)
        self._next_id = max(self._next_id, ceiling.letters + 1)

    # Following numbers assigned elsewhere (a pair's partner's writes applied here).

    def follow_row(self, stream: str, seq: int) -> None:
        """A record numbered ``seq`` on ``stream`` elsewhere."""
        if seq >= self._next_seq.get(stream, self._start):
            self._next_seq[stream] = seq + 1
        self._first_seq.setdefault(stream, seq)

    def follow_append(self, stream: str, first: int, last: int) -> None:
        """Records ``first`` to ``last`` of ``stream``, numbered elsewhere."""
        self._next_seq[stream] = max(self._next_seq.get(stream, self._start), last + 1)
        self._first_seq.setdefault(stream, first)

    def follow_delete(self, stream: str, through: int) -> None:
        """``stream`` deleted through ``through`` elsewhere."""
        self.forget_before(stream, through + 1)
        if through >= self._next_seq.get(stream, self._start):
            self._next_seq[stream] = through + 1

    def follow_id(self, rid: int) -> None:
        """A queued record given id ``rid`` elsewhere."""
        self._next_id = max(self._next_id, rid + 1)

    # The tail as reads see it.

    def read_tail(self, stream: str, from_seq: int, limit: int) -> tuple[list[StreamRecord], bool]:
        """
        The tail's part of a read of up to ``limit`` records of ``stream``
        from ``from_seq`` on, and whether that is all of it: when the read
        starts before the tail, the committed records before it must come
        from disk (:func:`merge_tail` joins them).
        """
        tail = self._tails.get(stream)
        if tail and from_seq >= tail[0][1]:
            # All of it is still in memory: no thread, no disk.
            start = from_seq - tail[0][1]
            return [row_record(row) for row in tail[start : start + limit]], True
        # Committed records leave the tail only after their commit, so what
        # is not in this snapshot a later read transaction sees.
        return ([row_record(row) for row in tail[:limit]] if tail else []), False

    def first_in_tail_at(self, stream: str, t: float) -> int | None:
        """The first seq in the tail of ``stream`` with timestamp >= ``t`` (None: none)."""
        tail = self._tails.get(stream, ())
        return next((row[1] for row in tail if row[2] >= t), None)

    def tail_origin_marks(self, marks: dict[tuple[str, str], int]) -> None:
        """Raise ``marks`` (per stream and origin) to the forwarded records in the tails."""
        for tail in self._tails.values():
            for row in tail:
                if row[7]:
                    key = (row[0], row[7])
                    if row[8] > marks.get(key, 0):
                        marks[key] = row[8]


def merge_tail(
    committed: list[StreamRecord], snapshot: Iterable[StreamRecord], from_seq: int, limit: int
) -> list[StreamRecord]:
    """``committed`` continued with the tail snapshot's later records, up to ``limit``."""
    last = committed[-1].seq if committed else from_seq - 1
    for record in snapshot:
        if len(committed) >= limit:
            break
        if record.seq > last:
            committed.append(record)
    return committed
