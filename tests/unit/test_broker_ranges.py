"""
Tests for L{malamute_pack.broker.ranges}: STREAM_QUERY and STREAM_READ_RANGE
on a broker with a real journal, through its real MLM sessions: what a query
answers, range reads paced by credit, filtered by pattern, clamped to what
is committed, reporting retention gaps, ended or cancelled.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.journal import JournalConfig, RetentionPolicy
from malamute_pack.protocol import chunks, mlm
from tests.broker_support import BrokerHarness

W, R = b"writer", b"reader"


def chunk_seqs(messages: list[mlm.Message]) -> list[int]:
    """The sequence numbers of every record in the STREAM_CHUNKs of C{messages}."""
    seqs: list[int] = []
    for m in messages:
        if isinstance(m, mlm.StreamChunk):
            seqs += chunks.decode_chunk(m.content[0], m.count).seq
    return seqs


class RangesTestCase(SynchronousTestCase):
    journal_config = JournalConfig(prune_interval_s=3600)

    def setUp(self) -> None:
        path = Path(self.mktemp()) / "journal.sqlite"
        self.h = BrokerHarness(BrokerConfig(timeout=60.0), path, self.journal_config)
        self.addCleanup(self.h.close)
        self.h.open(W, "writer", version=2)
        self.h.command(W, mlm.StreamWrite("s"))
        self.write(*[f"n{i}" for i in range(1, 11)])
        self.h.open(R, "", version=2)

    def write(self, *subjects: str) -> None:
        for subject in subjects:
            self.h.send(W, mlm.StreamSend(subject, [subject.encode(), b"\x00\xff"]))
        self.h.settle()

    def read(
        self, first: int, last: int, pattern: str = "", credit: int = 1000
    ) -> list[mlm.Message]:
        got = self.h.command(R, mlm.StreamReadRange("s", pattern, first, last))
        if credit:
            got += self.h.command(R, mlm.Credit(credit))
        return got


class QueryTests(RangesTestCase):
    def test_positions(self) -> None:
        """A query gives first and last committed, and where each kind of position falls."""
        self.h.clock.advance(10)
        self.write("late")
        for whence, position, expected in [
            (mlm.EARLIEST, 0, 1),
            (mlm.LATEST, 0, 12),
            (mlm.SEQUENCE, 5, 5),
            (mlm.TIME, 10_000, 11),
            (mlm.TIME, 99_000, 12),
        ]:
            got = self.h.command(R, mlm.StreamQuery("s", whence, position))
            self.assertEqual(got, [mlm.StreamStatus("s", 1, 11, expected)], (whence, position))

    def test_unknownStream(self) -> None:
        """A stream never written is empty: first 1, last 0."""
        got = self.h.command(R, mlm.StreamQuery("nothing", mlm.EARLIEST, 0))
        self.assertEqual(got, [mlm.StreamStatus("nothing", 1, 0, 1)])

    def test_version1(self) -> None:
        """A version 1 client's query is ERROR 500."""
        self.h.open(b"old", "old")
        [reply] = self.h.command(b"old", mlm.StreamQuery("s", mlm.EARLIEST, 0))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)

    def test_noJournal(self) -> None:
        """Without a journal a query is ERROR 501."""
        h = BrokerHarness(BrokerConfig(timeout=60.0))
        h.open(R, "", version=2)
        [reply] = h.command(R, mlm.StreamQuery("s", mlm.EARLIEST, 0))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.NOT_IMPLEMENTED)


class RangeReadTests(RangesTestCase):
    def test_wholeRange(self) -> None:
        """OK, then every record of the range in one chunk with its frames, then STREAM_END."""
        got = self.read(3, 8)
        self.assertEqual(got[0], mlm.Ok())
        self.assertEqual(got[-1], mlm.StreamEnd("s", 8))
        [chunk] = [m for m in got if isinstance(m, mlm.StreamChunk)]
        columns = chunks.decode_chunk(chunk.content[0], chunk.count)
        self.assertEqual(columns.seq, [3, 4, 5, 6, 7, 8])
        self.assertEqual(columns.subject, ["n3", "n4", "n5", "n6", "n7", "n8"])
        self.assertEqual(set(columns.sender), {"writer"})
        self.assertEqual(chunks.decode_frames(columns.frames[0]), (b"n3", b"\x00\xff"))

    def test_noCreditNothing(self) -> None:
        """A reader that gave no credit gets nothing until it does."""
        self.assertEqual(self.read(1, 10, credit=0), [mlm.Ok()])
        got = self.h.command(R, mlm.Credit(100))
        self.assertEqual(chunk_seqs(got), list(range(1, 11)))

    def test_pacedByCredit(self) -> None:
        """Credit bounds the records sent; more credit goes on where it stopped."""
        got = self.read(1, 10, credit=4)
        self.assertEqual(chunk_seqs(got), [1, 2, 3, 4])
        self.assertNotIn(mlm.StreamEnd("s", 10), got)
        got = self.h.command(R, mlm.Credit(100))
        self.assertEqual(chunk_seqs(got), list(range(5, 11)))
        self.assertEqual(got[-1], mlm.StreamEnd("s", 10))

    def test_chunked(self) -> None:
        """A range larger than a chunk comes in several chunks, in order, each record once."""
        self.h.broker.ranges._chunk_records = 3
        got = self.read(1, 10)
        self.assertEqual(len([m for m in got if isinstance(m, mlm.StreamChunk)]), 4)
        self.assertEqual(chunk_seqs(got), list(range(1, 11)))

    def test_pattern(self) -> None:
        """Only records whose subject matches the pattern, of any kind, are sent."""
        got = self.read(1, 10, "prefix:n1")
        self.assertEqual(chunk_seqs(got), [1, 10])
        self.assertEqual(got[-1], mlm.StreamEnd("s", 10))

    def test_badPattern(self) -> None:
        """A pattern that does not compile is ERROR 300 with the reason; nothing is read."""
        [reply] = self.h.command(R, mlm.StreamReadRange("s", "topic:a..b", 1, 10))
        assert isinstance(reply, mlm.Error)
        self.assertIn("invalid pattern", reply.status_reason)
        self.assertEqual(self.h.broker.registry.get(self.h.sessions.session(R)).ranges, {})  # type: ignore[union-attr]

    def test_clampedToCommitted(self) -> None:
        """The range ends at the last committed record when it starts: later writes are not read."""
        got = self.h.command(R, mlm.StreamReadRange("s", "", 5, 1_000))
        self.write("n11", "n12")
        got += self.h.command(R, mlm.Credit(100))
        self.assertEqual(chunk_seqs(got), list(range(5, 11)))
        self.assertEqual(got[-1], mlm.StreamEnd("s", 10))

    def test_notLive(self) -> None:
        """A range reader is not a stream reader: live records do not reach it."""
        self.read(1, 10)
        self.write("n11")
        self.assertEqual(self.h.take(R), [])

    def test_twiceRefused(self) -> None:
        """A second range read of a stream being read is ERROR 300; another stream is fine."""
        self.read(1, 10, credit=0)
        [reply] = self.h.command(R, mlm.StreamReadRange("s", "", 1, 10))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.FAILED)
        self.assertEqual(self.h.command(R, mlm.StreamReadRange("t", "", 1, 10))[0], mlm.Ok())

    def test_cancel(self) -> None:
        """STREAM_CANCEL ends a range read: nothing more comes."""
        self.read(1, 10, credit=0)
        self.assertEqual(self.h.command(R, mlm.StreamCancel("s")), [mlm.Ok()])
        self.assertEqual(self.h.command(R, mlm.Credit(100)), [])

    def test_emptyRange(self) -> None:
        """A range past the end ends at once."""
        got = self.read(20, 30)
        self.assertEqual(got, [mlm.Ok(), mlm.StreamEnd("s", 10)])

    def test_stalledResent(self) -> None:
        """A chunk the session could not take is read and sent again once it drains."""
        self.h.full.add(R)
        self.h.command(R, mlm.StreamReadRange("s", "", 1, 10))
        self.h.command(R, mlm.Credit(100))
        self.h.full.discard(R)
        self.h.clock.advance(1)
        self.assertEqual(chunk_seqs(self.h.take(R)), list(range(1, 11)))


class RangeGapTests(RangesTestCase):
    journal_config = JournalConfig(prune_interval_s=3600, retention=RetentionPolicy(max_count=4))

    def test_gap(self) -> None:
        """Records retention removed are STREAM_GAP, then the rest of the range, then the end."""
        assert self.h.journal is not None
        pruned: list[object] = []
        self.h.journal.prune().addCallback(pruned.append)
        self.h.clock.run_thread_calls(lambda: bool(pruned))
        got = self.read(2, 9)
        self.assertEqual(got[1], mlm.StreamGap("s", 2, 7))
        self.assertEqual(chunk_seqs(got), [7, 8, 9])
        self.assertEqual(got[-1], mlm.StreamEnd("s", 9))
        self.assertEqual(self.h.broker.ranges.gaps, 1)
