"""
Tests for a journal file damaged on disk (L{malamute_pack.journal.checksums},
L{malamute_pack.journal.verify}, L{malamute_pack.journal.scan},
L{malamute_pack.journal.damage}, L{malamute_pack.journal.checking},
L{malamute_pack.journal.salvage}, and the Spark source's
L{malamute_pack.spark.journal_file}): real SQLite files in the test's
directory, damaged by writing bytes into them between a close and an open.
Every record is written with its checksum; a damaged record is never served
as good (reads leave it out and tell the reader of a gap in its place, a
range read and a replay are always answered); a file damaged where SQLite
looks (a malformed page, a truncated or empty file) is salvaged when it
opens: the damaged file kept aside, what can be read copied, what was lost
logged and reported to readers, and no number given twice.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.logger import formatEvent
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.client.bulk import RangeChunk
from malamute_pack.journal import Journal, JournalConfig
from malamute_pack.journal.checksums import letter_checksum, row_checksums, with_checksums
from malamute_pack.journal.identity import JOURNAL_MARKER, read_marker
from malamute_pack.journal.inserts import INSERT_STREAM, insert_all
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.salvage import salvage
from malamute_pack.journal.scan import next_readable
from malamute_pack.journal.schema import migrate
from malamute_pack.journal.verify import Found, StreamScan
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.records import READER, ConsumerPosition
from malamute_pack.spark.journal_file import DamagedRange, JournalFile
from tests.broker_support import BrokerHarness
from tests.support import capture_log

Inline = Any
W, R = b"writer", b"reader"
# Small, so that a salvage's jump is easy to see.
CRASH_SKIP = 1000
NEVER = JournalConfig(prune_interval_s=3600, check_at_open="never", crash_skip=CRASH_SKIP)
CRASH = JournalConfig(prune_interval_s=3600, crash_skip=CRASH_SKIP)


def body(seq: int) -> bytes:
    """Record C{seq}'s content: its marker, unique in the file, and padding."""
    return b"MARK%05d-" % seq + b"x" * 80


def flip(path: Path, marker: bytes, at: int = 2, bit: int = 0) -> int:
    """Flip one bit of the file at C{path}, C{at} bytes into C{marker}; its offset."""
    data = bytearray(path.read_bytes())
    offset = data.index(marker) + at
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))
    return offset


def break_page(path: Path, marker: bytes) -> int:
    """Spoil the b-tree page that holds C{marker} (an invalid page type); its number."""
    data = bytearray(path.read_bytes())
    page = data.index(marker) // 4096
    data[page * 4096] = 0x77
    path.write_bytes(bytes(data))
    return page + 1


def sql(path: Path, statement: str, *parameters: object) -> list[tuple[Any, ...]]:
    """Run C{statement} on the file at C{path} (outside any journal)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        return conn.execute(statement, parameters).fetchall()


def mark_crashed(path: Path) -> None:
    """Leave the journal at C{path} as a kill -9 leaves it: marked running."""
    sql(path, "UPDATE journal_counters SET value = 1 WHERE name = 'running'")


def chunk_records(messages: list[mlm.Message]) -> dict[int, tuple[str, bytes]]:
    """Every record of the STREAM_CHUNKs in C{messages}: seq to (subject, content)."""
    found: dict[int, tuple[str, bytes]] = {}
    for message in messages:
        if isinstance(message, mlm.StreamChunk):
            columns = chunks.decode_chunk(message.content[0], message.count)
            for seq, subject, frames in zip(
                columns.seq, columns.subject, columns.frames, strict=True
            ):
                (content,) = chunks.decode_frames(frames)
                found[seq] = (subject, content)
    return found


def gaps(messages: list[mlm.Message]) -> list[tuple[int, int]]:
    """The STREAM_GAPs of C{messages}: (missed, available)."""
    return [(m.missed, m.available) for m in messages if isinstance(m, mlm.StreamGap)]


def ignore(error: object) -> None:
    """A letter's outcome nobody waits for."""


def texts(events: list[Any]) -> str:
    return "\n".join(formatEvent(event) for event in events)


class HarnessCase(SynchronousTestCase):
    """A broker with a journal of records 1..C{records}, closed: damage it, then L{reopen}."""

    records = 10

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        first = BrokerHarness(BrokerConfig(timeout=60.0), self.path, CRASH)
        # A time that is no whole number: each timestamp takes its 8 bytes.
        first.clock.advance(1_700_000_000.25)
        first.open(W, "writer", version=2)
        first.command(W, mlm.StreamWrite("s"))
        for seq in range(1, self.records + 1):
            first.send(W, mlm.StreamSend(f"n{seq}", [body(seq)]))
        first.settle()
        first.close()
        self.assertFalse(Path(f"{self.path}-wal").exists())

    def reopen(self, config: JournalConfig = NEVER) -> BrokerHarness:
        harness = BrokerHarness(BrokerConfig(timeout=60.0), self.path, config)
        self.addCleanup(harness.close)
        harness.open(R, "", version=2)
        return harness

    def read_range(self, harness: BrokerHarness, first: int, last: int) -> list[mlm.Message]:
        harness.send(R, mlm.StreamReadRange("s", "", first, last))
        harness.send(R, mlm.Credit(60_000))
        return harness.take(R)

    def assert_answered(self, messages: list[mlm.Message], last: int) -> None:
        """
        Each of records 1..C{last} is served with its exact content or is in a
        gap, never both; the read ended.
        """
        served = chunk_records(messages)
        gapped = {seq for missed, available in gaps(messages) for seq in range(missed, available)}
        for seq, (subject, content) in served.items():
            self.assertEqual((subject, content), (f"n{seq}", body(seq)), seq)
        self.assertFalse(set(served) & gapped)
        self.assertEqual(set(served) | gapped, set(range(1, last + 1)))
        self.assertEqual(messages[-1], mlm.StreamEnd("s", last))


class ReadTests(HarnessCase):
    """Reads of a file with a damaged record: the others served, a gap in its place."""

    def test_contentFlipNotServed(self) -> None:
        """
        A bit flipped in a record's content: a range read serves every
        other record, tells a gap for that one in its place, and ends; the
        journal counts it once and logs it as damaged.
        """
        flip(self.path, b"MARK00005-", at=20)
        events = capture_log(self)
        harness = self.reopen()
        got = self.read_range(harness, 1, 10)
        self.assertEqual(sorted(chunk_records(got)), [1, 2, 3, 4, 6, 7, 8, 9, 10])
        self.assertEqual(gaps(got), [(5, 6)])
        self.assert_answered(got, 10)
        assert harness.journal is not None
        self.assertEqual(harness.journal.counters.damaged_records, 1)
        self.assertIn("records 5-5 cannot be served (checksum mismatch)", texts(events))
        self.assertEqual(self.read_range(harness, 1, 10)[-1], mlm.StreamEnd("s", 10))
        self.assertEqual(harness.journal.counters.damaged_records, 1)

    def test_replayTellsGap(self) -> None:
        """
        A reader replaying from the journal (STREAM_READ_FROM) gets the
        records before and after a damaged one, and a gap for it between.
        """
        flip(self.path, b"MARK00004-", at=30)
        harness = self.reopen()
        harness.send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        harness.send(R, mlm.Credit(100))
        got = harness.take(R)
        order = [
            ("gap", m.missed) if isinstance(m, mlm.StreamGap) else ("record", m.sequence)
            for m in got
            if isinstance(m, mlm.StreamGap | mlm.StreamRecord)
        ]
        self.assertEqual(
            order,
            [("record", n) for n in (1, 2, 3)]
            + [("gap", 4)]
            + [("record", n) for n in range(5, 11)],
        )
        for message in got:
            if isinstance(message, mlm.StreamRecord):
                self.assertEqual(message.content, [body(message.sequence)])

    def test_timestampFlipAnswered(self) -> None:
        """
        A bit flipped in a record's timestamp (which made the chunk's
        encoding fail, and the range read never answer): the read is
        answered, the record told as a gap.
        """
        # A record's timestamp is the 8 bytes before its sender ("writer"):
        # the exponent's high bit flipped, 1.7e9 becomes about 1e163.
        before = self.path.read_bytes()
        at = flip(self.path, b"writern6\x00", at=-8, bit=5)
        self.assertEqual(before[at], 0x41)
        harness = self.reopen()
        got = self.read_range(harness, 1, 10)
        self.assertEqual(gaps(got), [(6, 7)])
        self.assert_answered(got, 10)

    def test_legacyRowServed(self) -> None:
        """A record written before checksums (NULL) is served as it is."""
        sql(self.path, "UPDATE stream_messages SET checksum = NULL WHERE seq = 3")
        harness = self.reopen()
        got = self.read_range(harness, 1, 10)
        self.assertEqual(sorted(chunk_records(got)), list(range(1, 11)))
        self.assert_answered(got, 10)


class JournalFileTests(HarnessCase):
    """The Spark source's C{journal} option reads a damaged file as the broker does."""

    def test_damagedRangeInPlace(self) -> None:
        """
        A record whose content a flipped bit spoiled is not read from the
        file: a L{DamagedRange} (a gap that says why) comes in its place,
        between the chunks of the records around it.
        """
        flip(self.path, b"MARK00005-", at=20)
        with JournalFile(self.path, chunk_records=3) as journal:
            items = list(journal.read_range("s", 1, 10))
        order: list[object] = []
        for item in items:
            if isinstance(item, DamagedRange):
                order.append((item.missed, item.available, item.why))
            else:
                assert isinstance(item, RangeChunk)
                order += item.seq
                for seq, frames in zip(item.seq, item.content, strict=True):
                    self.assertEqual(chunks.decode_frames(frames), (body(seq),))
        self.assertEqual(order, [1, 2, 3, 4, (5, 6, "checksum mismatch"), 6, 7, 8, 9, 10])


class PageTests(HarnessCase):
    """A malformed page under a read: answered, what it held told as a gap."""

    records = 300

    def test_malformedPageAnswered(self) -> None:
        """
        A page of records SQLite cannot read (which failed the whole read
        with ERROR 502): a range read serves every record it can, in order,
        tells a gap for the page's, and ends.
        """
        break_page(self.path, b"MARK00150-")
        harness = self.reopen()
        got = self.read_range(harness, 1, 300)
        self.assertTrue(gaps(got))
        self.assertGreater(len(chunk_records(got)), 200)
        self.assert_answered(got, 300)

    def test_replayAcrossMalformedPage(self) -> None:
        """A replay across an unreadable page goes on past it, with a gap."""
        break_page(self.path, b"MARK00150-")
        harness = self.reopen()
        harness.send(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        harness.send(R, mlm.Credit(1000))
        got = harness.take(R)
        records = [m.sequence for m in got if isinstance(m, mlm.StreamRecord)]
        missed = gaps(got)
        self.assertTrue(missed)
        self.assertIn(300, records)
        gapped = {seq for a, b in missed for seq in range(a, b)}
        self.assertEqual(set(records) | gapped, set(range(1, 301)))
        self.assertFalse(any(isinstance(m, mlm.Error) for m in got))


class LetterTests(TestCase):
    """A damaged letter is left out of what the journal recovers."""

    @inlineCallbacks
    def test_damagedLetterLeftOut(self) -> Inline:
        """
        A letter whose content a flipped bit spoiled is not recovered (nor
        delivered): the other letters are, and it is counted and logged by
        its id.
        """
        path = Path(self.mktemp()) / "journal.sqlite"
        journal = Journal(path, reactor, NEVER)
        journal.open()
        for i in range(3):
            journal.store_queued(
                "mailbox", "box", "a", f"letter-{i}", "", None, [b"LETTER%d-" % i * 5], ignore
            )
        yield journal.close()
        flip(path, b"LETTER1-", at=3)
        events = capture_log(self)
        again = Journal(path, reactor, NEVER)
        found = again.open()
        self.addCleanup(again.close)
        base = found.queued[0].id - 1  # ids start past the journal's creation time
        self.assertEqual([letter.id - base for letter in found.queued], [1, 3])
        self.assertEqual(again.counters.damaged_records, 1)
        self.assertIn(f"letter {base + 2} is damaged", texts(events))


class ChecksumTests(TestCase):
    """What the journal writes: every record with its checksum."""

    @inlineCallbacks
    def test_everyRowHasItsChecksum(self) -> Inline:
        """
        Stream records written one by one, in an append, in a batch the
        insert process writes, and letters: each row's checksum is the one
        its columns give.
        """
        path = Path(self.mktemp()) / "journal.sqlite"
        journal = Journal(path, reactor, JournalConfig(insert_process_rows=5))
        journal.open()
        self.addCleanup(journal.close)
        journal.append_stream("s", "w", "one", [b"a", b"b"], 1.0)
        yield journal.flush()
        for i in range(20):  # one turn: a batch for the insert process
            journal.append_stream("flood", "w", f"f{i}", [b"x" * i], 2.5)
        yield journal.flush()
        journal.append_batch("s", "w", [("x", [b"1"]), ("y", [])], 3, "k", [], lambda e: None)
        journal.store_queued("mailbox", "box", "a", "hi", "t", 9.0, [b"c"], lambda e: None)
        yield journal.flush()
        rows = sql(
            path,
            "SELECT stream, seq, ts, sender, subject, content, bytes, origin, origin_seq,"
            " checksum FROM stream_messages ORDER BY stream, seq",
        )
        self.assertEqual(len(rows), 23)
        self.assertEqual(row_checksums([row[:9] for row in rows]), [row[9] for row in rows])
        letters = sql(
            path,
            "SELECT id, kind, address, sender, subject, tracker, deadline, created, content,"
            " relay_origin, relay_id, checksum FROM queued_messages",
        )
        self.assertEqual([letter_checksum(row[:11]) for row in letters], [letters[0][11]])


class OpenTests(TestCase):
    """A file damaged where SQLite looks is salvaged when it opens."""

    def setUp(self) -> None:
        self.dir = Path(self.mktemp())
        self.path = self.dir / "journal.sqlite"
        self.marker = self.dir / JOURNAL_MARKER

    def journal(self) -> Journal:
        journal = Journal(self.path, reactor, CRASH, marker=self.marker)
        self.addCleanup(lambda: journal.close() if journal.is_open else None)
        return journal

    @inlineCallbacks
    def fill(self, records: int = 300) -> Inline:
        """Records 1..C{records} of stream C{s}, and a letter; closed. Its identity."""
        journal = self.journal()
        journal.open()
        for seq in range(1, records + 1):
            journal.append_stream("s", "w", f"n{seq}", [body(seq)], 1000.0 + seq)
        journal.store_queued("mailbox", "box", "a", "hi", "", None, [b"letter"], ignore)
        yield journal.close()
        return journal.identity

    @inlineCallbacks
    def served(self, journal: Journal, last: int) -> Inline:
        """What of 1..C{last} is served (exactly) and what is told lost: both sets."""
        records = yield journal.read_stream("s", 1, last + 10)
        for record in records:
            self.assertEqual(list(record.content), [body(record.seq)], record.seq)
        served = {record.seq for record in records}
        lost = {seq for a, b in journal.lost("s", 1, last) for seq in range(a, b + 1)}
        self.assertFalse(served & lost)
        return served, lost

    @inlineCallbacks
    def accounted(self, journal: Journal, last: int) -> Inline:
        """L{served}, once every number of 1..C{last} is served or told lost."""
        served, lost = yield self.served(journal, last)
        self.assertEqual(served | lost, set(range(1, last + 1)))
        return served, lost

    @inlineCallbacks
    def test_crashDamageSalvaged(self) -> Inline:
        """
        After an unclean stop, a malformed page is found at open (quick_check)
        and the file salvaged: the damaged file (untouched) is kept aside
        with its WAL and shm, the new journal has the same identity, every
        other record and the letter, the lost stretch is logged and told to
        readers, and numbering jumps past everything the damaged file held.
        """
        identity = yield self.fill()
        mark_crashed(self.path)
        break_page(self.path, b"MARK00150-")
        damaged = self.path.read_bytes()
        events = capture_log(self)
        journal = self.journal()
        found = journal.open()
        salvaged = journal.salvaged
        assert salvaged is not None
        self.assertTrue(salvaged.reason)
        self.assertEqual(salvaged.aside.read_bytes(), damaged)
        self.assertTrue(salvaged.aside.name.startswith("journal.sqlite.damaged-"))
        self.assertEqual(journal.identity, identity)
        self.assertEqual(len(found.queued), 1)
        served, lost = yield self.accounted(journal, 300)
        self.assertIn(150, lost)
        self.assertGreater(len(served), 200)
        [(first, last)] = salvaged.lost["s"]
        self.assertIn(f"stream 's': records {first}-{last} lost", texts(events))
        self.assertIn(str(salvaged.aside), texts(events))
        self.assertEqual(journal.append_stream("s", "w", "new", [b"n"], 9.0), 300 + CRASH_SKIP + 1)
        marker = read_marker(self.marker)
        assert marker is not None
        self.assertEqual(marker.identity, identity)

    @inlineCallbacks
    def skipped_then_damaged(self, how: str) -> Inline:
        """
        Records 1..100, a crash (numbering jumps CRASH_SKIP), records
        1101..1200, a crash; then the file damaged (C{how}: the page of
        record 100 broken, or the file cut short after record 1150) and
        salvaged. What the journal serves and says lost of 1..1200.
        """
        yield self.fill(100)
        mark_crashed(self.path)
        journal = self.journal()
        journal.open()
        for n in range(100):
            seq = journal.append_stream("s", "w", "after", [body(1101 + n)], 2000.0)
            self.assertEqual(seq, 1101 + n)
        yield journal.close()
        mark_crashed(self.path)
        if how == "page":
            break_page(self.path, b"MARK00100-")
        else:
            data = self.path.read_bytes()
            self.path.write_bytes(data[: data.index(b"MARK01150-") // 4096 * 4096 + 1000])
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        return (yield self.served(journal, 1200))

    @inlineCallbacks
    def test_skippedNumbersNotLost(self) -> Inline:
        """
        The numbers a stream skipped after a crash were never given: a
        salvage of a file damaged around them (a broken page holding the
        records before and after the jump, or the file cut short past it)
        reports none of them lost (found by the soak: a pair's salvaged
        journal reported its takeover's jump as a million records lost and
        gave up the history it led).
        """
        for how in ("page", "cut"):
            served, lost = yield self.skipped_then_damaged(how)
            self.assertEqual(served | lost, set(range(1, 101)) | set(range(1101, 1201)), how)
            self.assertTrue(lost, how)
            self.setUp()  # a new directory for the next

    @inlineCallbacks
    def test_truncatedSalvaged(self) -> Inline:
        """
        A file cut short is salvaged at any open: the records before the
        cut are served, those after are told lost, and numbering goes on
        past the last number the file showed.
        """
        yield self.fill()
        data = self.path.read_bytes()
        self.path.write_bytes(data[: data.index(b"MARK00150-") // 4096 * 4096 + 1000])
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        served, lost = yield self.accounted(journal, 300)
        self.assertIn(1, served)
        self.assertIn(300, lost)
        self.assertGreater(journal.append_stream("s", "w", "new", [b"n"], 9.0), 300)

    @inlineCallbacks
    def test_numbersKeptWithoutTheStreamsTable(self) -> Inline:
        """
        A salvage that can read neither the streams table nor the records
        (a salvaged file damaged again, say) still numbers every stream past
        what the journal gave: its counters keep the highest number (found
        by the soak: such a journal numbered from a million again, and gave
        numbers twice).
        """
        yield self.fill(100)
        mark_crashed(self.path)
        journal = self.journal()
        journal.open()
        self.assertEqual(journal.append_stream("s", "w", "x", [b"x"], 2.0), 100 + CRASH_SKIP + 1)
        yield journal.close()
        sql(self.path, "DROP TABLE streams")
        sql(self.path, "DROP TABLE stream_messages")
        found = salvage(self.path, "damaged twice", None, CRASH_SKIP, 5.0)
        self.assertTrue(found.streams_unknown)
        journal = self.journal()
        journal.open()
        self.assertGreater(journal.append_stream("s", "w", "y", [b"y"], 6.0), 100 + CRASH_SKIP + 1)

    @inlineCallbacks
    def test_numbersKeptInTheMarker(self) -> Inline:
        """
        A journal cut so short that nothing in it can be read (its streams
        table and counters lost) still numbers every stream past what it
        may have given: its data directory's marker says so, refreshed at
        each open (found by the soak: such a journal numbered from a
        million again, and gave numbers twice).
        """
        yield self.fill(100)
        mark_crashed(self.path)
        journal = self.journal()
        journal.open()  # numbering jumps past 100: the marker says 1100
        self.assertEqual(journal.append_stream("s", "w", "x", [b"x"], 2.0), 100 + CRASH_SKIP + 1)
        yield journal.close()
        marker = read_marker(self.marker)
        assert marker is not None
        self.assertEqual(marker.numbered, 100 + CRASH_SKIP)
        self.path.write_bytes(self.path.read_bytes()[:50])
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        self.assertGreater(journal.append_stream("s", "w", "y", [b"y"], 6.0), 100 + CRASH_SKIP + 1)
        self.assertGreater(journal.append_stream("t", "w", "y", [b"y"], 6.0), 100 + CRASH_SKIP + 1)

    @inlineCallbacks
    def test_lostHeadTold(self) -> Inline:
        """
        A file whose stream index and first records are both damaged is
        salvaged with the numbers before the first record saved counted
        lost, not taken for records pruned (found by the soak: a pair's
        partner, told the journal retained nothing before, dropped its
        copies of them).
        """
        yield self.fill()
        (root,) = sql(
            self.path,
            "SELECT rootpage FROM sqlite_master"
            " WHERE name LIKE 'sqlite_autoindex_stream_messages%'",
        )[0]
        data = bytearray(self.path.read_bytes())
        data[(root - 1) * 4096] = 0x77  # the index's root page
        self.path.write_bytes(bytes(data))
        break_page(self.path, b"MARK00001-")
        mark_crashed(self.path)
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        _, lost = yield self.accounted(journal, 300)
        self.assertIn(1, lost)

    @inlineCallbacks
    def test_cutShortSalvaged(self) -> Inline:
        """
        A file cut shorter than SQLite's header where the marker says a
        journal was made is damaged: salvaged with the marker's identity,
        and since no stream's name survived, every stream starts past the
        crash skip. (An empty one is refused: tests/system/test_datadir.)
        """
        identity = yield self.fill()
        self.path.write_bytes(self.path.read_bytes()[:50])
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        self.assertTrue(journal.salvaged.streams_unknown)
        self.assertEqual(journal.identity, identity)
        self.assertEqual(journal.append_stream("s", "w", "new", [b"n"], 9.0), CRASH_SKIP + 1)
        self.assertEqual(journal.append_stream("other", "w", "x", [b"n"], 9.0), CRASH_SKIP + 1)

    @inlineCallbacks
    def test_lossesKeptAcrossRestarts(self) -> Inline:
        """
        What a salvage lost is kept in the new file: after a clean restart
        the readers are still told of it, and nothing is salvaged again.
        """
        yield self.fill()
        mark_crashed(self.path)
        break_page(self.path, b"MARK00150-")
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        lost = journal.lost("s", 1, 300)
        yield journal.close()
        again = self.journal()
        again.open()
        self.assertIsNone(again.salvaged)
        self.assertEqual(again.lost("s", 1, 300), lost)
        self.assertEqual(again.losses(), {"s": lost[0][0]})

    @inlineCallbacks
    def test_lostConsumerNamed(self) -> Inline:
        """
        A table's page SQLite cannot read (the consumers'): the positions
        on it are not saved, and the log names each one lost (its key's
        index still lists it); the records are all saved.
        """
        journal = self.journal()
        journal.open()
        journal.append_stream("s", "w", "n1", [body(1)], 1.0)
        for name in ("billing", "audit"):
            journal.save_consumer(ConsumerPosition("s", READER, name, 1, b"", 5.0))
        yield journal.close()
        mark_crashed(self.path)
        ((root,),) = sql(
            self.path, "SELECT rootpage FROM sqlite_master WHERE name = ?", "stream_consumers"
        )
        data = bytearray(self.path.read_bytes())
        data[(root - 1) * 4096] = 0x77
        self.path.write_bytes(bytes(data))
        events = capture_log(self)
        again = self.journal()
        found = again.open()
        assert again.salvaged is not None
        self.assertEqual(found.consumers, [])
        self.assertEqual(
            again.salvaged.lost_rows["stream_consumers"],
            [("s", READER, "audit"), ("s", READER, "billing")],
        )
        self.assertIn(
            "consumer positions (stream, kind, name) lost: ('s', 'reader', 'audit'),"
            " ('s', 'reader', 'billing')",
            texts(events),
        )
        served, lost = yield self.served(again, 1)
        self.assertEqual((served, lost), ({1}, set()))

    @inlineCallbacks
    def test_contentDamageFoundAfterCrash(self) -> Inline:
        """
        After an unclean stop, a record whose checksum no longer matches is
        found at open too (pages sound): salvaged, that record alone lost.
        """
        yield self.fill()
        mark_crashed(self.path)
        flip(self.path, b"MARK00042-", at=40)
        journal = self.journal()
        journal.open()
        assert journal.salvaged is not None
        self.assertEqual(journal.salvaged.lost, {"s": [(42, 42)]})
        served, lost = yield self.served(journal, 300)
        self.assertEqual(lost, {42})
        self.assertEqual(served, set(range(1, 301)) - {42})


class ScanTests(SynchronousTestCase):
    """The pieces that step over damage."""

    def test_nextReadable(self) -> None:
        """
        Bisection finds the first key from which a probe reads again, with
        what it read; None when nothing past the damage can be read.
        """
        damaged = range(10, 50)

        def probe(key: int) -> int:
            if key in damaged or key < 10:
                raise sqlite3.DatabaseError("database disk image is malformed")
            return key * 2

        self.assertEqual(next_readable(probe, 11, 1000), (50, 100))
        self.assertIsNone(next_readable(probe, 11, 40))

    def test_scanReportsStretch(self) -> None:
        """
        A stream scan leaves out a record whose checksum does not match and
        reports every number between the good records around it.
        """
        path = Path(self.mktemp())
        with closing(sqlite3.connect(path, isolation_level=None)) as conn:
            migrate(conn)
            rows = [stream_row("s", seq, 1.0, "w", f"n{seq}", [body(seq)]) for seq in range(1, 6)]
            insert_all(conn, INSERT_STREAM, with_checksums(rows))
            conn.execute("UPDATE stream_messages SET checksum = checksum + 1 WHERE seq IN (3, 5)")
            found = Found()
            scan = StreamScan(conn, "s", 1, 100, found)
            read: list[int] = []
            while block := scan.next_block(2):
                read += [row[0] for row in block]
        self.assertEqual(read, [1, 2, 4])
        self.assertEqual([span[1:3] for span in found.spans], [(3, 3), (5, 5)])
        self.assertEqual(found.records, [("s", 3), ("s", 5)])
