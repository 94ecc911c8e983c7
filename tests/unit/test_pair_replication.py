"""
Tests for L{malamute_pack.pair.replication}: an active's journal replicated
to a passive's, with real journals (real SQLite files, the real reactor
and threads) joined by an in-memory link that carries every message
through the pair codec: records and letters, and the owners of addresses,
stream deletes, retention changes and the clients' security state, live
and in catch-ups from scratch and incremental ones; a passive whose damaged
journal was salvaged gets what it lost again.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Callable, Coroutine
from contextlib import closing
from pathlib import Path
from typing import Any

from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import deferLater
from twisted.logger import formatEvent
from twisted.trial.unittest import TestCase

from malamute_pack.journal import Journal, JournalError, RetentionPolicy
from malamute_pack.journal.records import stream_row
from malamute_pack.journal.sequencing import Ceiling
from malamute_pack.journal.writer import QueuedStore, StreamAppend
from malamute_pack.pair.replication import (
    History,
    Replica,
    ReplicationSource,
    security_state,
    set_state,
    unwritten,
)
from malamute_pack.protocol import pair as wire
from malamute_pack.protocol.records import READER, ConsumerPosition, QueuedRecord
from tests.support import capture_log

CLOCK: IReactorTime = reactor
# The command byte of a SHIP (the header's fourth byte).
SHIP = 4


class Link:
    """
    One direction of the pair link: each message is encoded, decoded and
    handed to C{deliver} a reactor turn later, in order; while L{held},
    messages wait (a slow or cut link) and L{lost} ones are dropped.
    """

    def __init__(self, deliver: Callable[[wire.PairMessage], None]) -> None:
        self._deliver = deliver
        self.held = False
        self.cut = False
        self.waiting: list[list[bytes]] = []
        self.sent: list[wire.PairMessage] = []

    def send(self, message: wire.PairMessage) -> bool:
        if self.cut:
            return False
        frames = wire.encode(message)
        self.sent.append(message)
        if self.held:
            self.waiting.append(frames)
        else:
            CLOCK.callLater(0, self._deliver, wire.decode(frames))
        return True

    def release(self) -> None:
        self.held = False
        waiting, self.waiting = self.waiting, []
        for frames in waiting:
            CLOCK.callLater(0, self._deliver, wire.decode(frames))

    def ships_first(self) -> int:
        """
        Let the SHIPs waiting overtake the catch-up's ITEMS (all but the
        first message, CATCHUP_BEGIN): what a SHIP sent while the ITEMS
        were still being read looks like. How many SHIPs there were.
        """
        frames = self.waiting
        ships = [i for i, f in enumerate(frames) if f[0][3] == SHIP]
        rest = [f for i, f in enumerate(frames) if i and i not in ships]
        self.waiting = [frames[0], *(frames[i] for i in ships), *rest]
        return len(ships)


class Pair:
    """An active journal's source and a passive journal's replica, linked."""

    def __init__(self, active: Journal, passive: Journal, history: History, sync: bool) -> None:
        self.to_passive = Link(lambda message: self.replica.receive(message))
        self.to_active = Link(lambda message: self.source.receive(message))
        self.source = ReplicationSource(
            active, self.to_passive.send, history, sync=sync, seconds=CLOCK.seconds
        )
        self.replica = Replica(passive, self.to_active.send, "passive", CLOCK.seconds)


def _rows(path: Path, sql: str, *parameters: object) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, parameters).fetchall()


def _stream(path: Path, stream: str) -> list[tuple[int, str, bytes]]:
    return [
        (seq, subject, content)
        for seq, subject, content in _rows(
            path,
            "SELECT seq, subject, content FROM stream_messages WHERE stream = ? ORDER BY seq",
            stream,
        )
    ]


def _letters(path: Path) -> list[int]:
    return [row[0] for row in _rows(path, "SELECT id FROM queued_messages ORDER BY id")]


class JournalPairCase(TestCase):
    """Real journals for a test, and the ways to wait on them."""

    def journal(self, name: str) -> Journal:
        journal = Journal(Path(self.mktemp()) / f"{name}.sqlite", CLOCK)
        journal.open()
        self.addCleanup(self._close, journal)
        return journal

    def _close(self, journal: Journal) -> Deferred[None] | None:
        return journal.close() if journal.is_open else None

    async def until(self, condition: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = CLOCK.seconds() + timeout
        while not condition():
            if CLOCK.seconds() > deadline:
                self.fail("condition not met in time")
            await deferLater(CLOCK, 0.01, lambda: None)

    async def linked(self, sync: bool) -> tuple[Journal, Journal, Pair]:
        """An active and a passive journal, paired and in sync."""
        active, passive = self.journal("a"), self.journal("b")
        pair = Pair(active, passive, History("e1"), sync=sync)
        pair.replica.hello()
        await self.until(lambda: pair.source.in_sync)
        return active, passive, pair

    def run_async(self, coroutine: Coroutine[Any, Any, None]) -> Deferred[None]:
        return Deferred.fromCoroutine(coroutine)

    def write(self, journal: Journal, stream: str, count: int, subject: str = "s") -> None:
        for i in range(count):
            journal.append_stream(stream, "writer", subject, [b"m%d" % i], 1000.0 + i)

    def store(self, journal: Journal, count: int, results: list[JournalError | None]) -> list[int]:
        ids = []
        for i in range(count):
            record = journal.store_queued(
                "mailbox", "box", "sender", "subject", "", None, [b"l%d" % i], results.append
            )
            ids.append(record.id)
        return ids


class ReplicationTests(JournalPairCase):
    """Replication between two real journals."""

    def test_fresh_partner_gets_everything(self) -> Deferred[None]:
        """
        A partner with an empty journal gets every retained record and every
        queued letter, with their numbers, and the source counts it in sync.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            self.write(active, "trades", 2500)
            self.write(active, "quotes", 10)
            results: list[JournalError | None] = []
            ids = self.store(active, 30, results)
            active.remove_queued(ids[0])
            await active.flush()
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))
            self.assertEqual(len(_stream(passive.path, "trades")), 2500)
            self.assertEqual(_stream(passive.path, "quotes"), _stream(active.path, "quotes"))
            self.assertEqual(_letters(passive.path), ids[1:])
            self.assertTrue(pair.replica.in_sync)
            self.assertEqual(passive.last_seq("trades"), 2500)

        return self.run_async(run())

    def test_live_writes_follow(self) -> Deferred[None]:
        """
        Once in sync, every write (records, letters, removals, appends) is
        shipped and applied in order; the passive's journal equals the
        active's.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            results: list[JournalError | None] = []
            self.write(active, "trades", 300)
            ids = self.store(active, 20, results)
            for rid in ids[:5]:
                active.remove_queued(rid)
            appended: list[JournalError | None] = []
            active.append_batch(
                "trades", "bulk", [("a", [b"1"]), ("b", [b"2"])], 5.0, "k1", [], appended.append
            )
            await self.until(lambda: len(results) == 20 and appended == [None])
            await active.flush()
            await self.until(lambda: pair.source.acked >= active.handed)
            await passive.flush()
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))
            self.assertEqual(_letters(passive.path), _letters(active.path))
            self.assertEqual(
                _rows(passive.path, "SELECT stream, key, first_seq, last_seq FROM stream_appends"),
                [("trades", "k1", 301, 302)],
            )

        return self.run_async(run())

    def test_append_key_written_again_follows(self) -> Deferred[None]:
        """
        The passive applies an append whose key it has already, at other
        numbers (the active shipped the first write, failed to make it
        itself, and wrote the key again for its writer's retry): the
        active's numbers win, and the earlier copy, which the active never
        had, goes (found by the soak: the passive refused the second, and
        its records were lost when it took over).
        """

        async def run() -> None:
            passive = self.journal("b")
            records = [("a", [b"1"]), ("b", [b"2"])]

            def append(first: int) -> StreamAppend:
                rows = [
                    stream_row("trades", seq, 5.0, "bulk", subject, content)
                    for seq, (subject, content) in enumerate(records, first)
                ]
                key = ("trades", "k1", first, first + 1, 5.0)
                return StreamAppend(rows, key, [], lambda _: None, 4, follows=True)

            passive.apply([append(1)])
            await passive.flush()
            passive.apply([append(3)])
            await passive.flush()
            self.assertEqual(
                [(seq, subject) for seq, subject, _ in _stream(passive.path, "trades")],
                [(3, "a"), (4, "b")],
            )
            self.assertEqual(
                _rows(passive.path, "SELECT stream, key, first_seq, last_seq FROM stream_appends"),
                [("trades", "k1", 3, 4)],
            )
            self.assertEqual(
                _rows(passive.path, "SELECT message_count FROM streams WHERE stream = 'trades'"),
                [(2,)],
            )

        return self.run_async(run())

    def test_unwritten_removed_from_the_passive(self) -> Deferred[None]:
        """
        What the active shipped and then failed to write itself (a full
        disk: the records, an append's key, a letter) is removed from the
        passive too, in the order of writes, off the stream's totals; what
        came before and after stays.
        """

        async def run() -> None:
            active, passive, pair = await self.linked(sync=False)
            self.write(active, "trades", 5)
            appended: list[JournalError | None] = []
            active.append_batch("trades", "w", [("a", [b"1"])], 5.0, "k1", [], appended.append)
            results: list[JournalError | None] = []
            [rid] = self.store(active, 1, results)
            await self.until(lambda: appended == [None] and len(results) == 1)
            lost = [stream_row("trades", seq, 1.0, "writer", "s", [b""]) for seq in (3, 4)]
            row = stream_row("trades", 6, 5.0, "w", "a", [b"1"])
            append = StreamAppend([row], ("trades", "k1", 6, 6, 5.0), [], lambda _: None, 0)
            letter = QueuedRecord(rid, "mailbox", "b", "s", "x", "", None, 1.0, ())
            record = QueuedStore(letter, lambda _: None)
            active.pass_to_partner(unwritten([*lost, append, record]))
            self.write(active, "trades", 1)
            await active.flush()
            await self.until(lambda: pair.source.acked >= active.handed)
            await passive.flush()
            self.assertEqual([seq for seq, _, _ in _stream(passive.path, "trades")], [1, 2, 5, 7])
            self.assertEqual(_rows(passive.path, "SELECT key FROM stream_appends"), [])
            self.assertEqual(_letters(passive.path), [])
            self.assertEqual(
                _rows(passive.path, "SELECT message_count FROM streams WHERE stream = 'trades'"),
                [(4,)],
            )

        return self.run_async(run())

    def test_sync_holds_acknowledgement(self) -> Deferred[None]:
        """
        In sync mode a letter's durability callback waits for the partner's
        acknowledgement; and a stream record is not durable before it.
        When the partner is gone, what waited is let go.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            pair.to_active.held = True  # the partner's ACKs are late
            results: list[JournalError | None] = []
            self.store(active, 3, results)
            self.write(active, "trades", 5)
            await active.flush()
            await deferLater(CLOCK, 0.1, lambda: None)
            self.assertEqual(results, [])
            self.assertEqual(active.durable_seq("trades"), 0)
            pair.to_active.release()
            await self.until(lambda: len(results) == 3)
            self.assertEqual(results, [None, None, None])
            await self.until(lambda: active.durable_seq("trades") == 5)
            # The partner falls silent: the active goes on alone.
            pair.to_active.held = True
            self.store(active, 2, results)
            await active.flush()
            await deferLater(CLOCK, 0.05, lambda: None)
            self.assertEqual(len(results), 3)
            pair.source.partner_gone()
            self.assertEqual(len(results), 5)

        return self.run_async(run())

    def test_takeover_waits_for_the_active_to_know(self) -> Deferred[None]:
        """
        A replica that caught up may take over only once the active's
        heartbeat says it holds it in sync on the replica's link: while its
        CAUGHT_UP has not reached the active (a cut link), the active
        acknowledges without it, so a takeover would lose what it did.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.to_active.held = True  # nothing the passive says arrives
            pair.replica.hello()
            await self.until(lambda: bool(pair.to_active.waiting))
            pair.source.receive(wire.decode(pair.to_active.waiting.pop()))  # but its HELLO
            await self.until(lambda: pair.replica.in_sync)
            link, now = pair.source.link, CLOCK.seconds()
            self.assertFalse(pair.replica.may_take_over)
            # The active's heartbeat: it does not hold its partner in sync.
            pair.replica.heartbeat_link(link, now, pair.source.in_sync)
            self.assertFalse(pair.replica.may_take_over)
            results: list[JournalError | None] = []
            self.store(active, 1, results)
            await self.until(lambda: results == [None])  # acknowledged alone
            pair.to_active.release()  # the CAUGHT_UP arrives
            await self.until(lambda: pair.source.in_sync)
            pair.replica.heartbeat_link(link, now, pair.source.in_sync)
            self.assertTrue(pair.replica.may_take_over)
            # A heartbeat of another link (a new catch-up) takes it back.
            pair.replica.heartbeat_link(link + 2, now, True)
            self.assertFalse(pair.replica.may_take_over)

        return self.run_async(run())

    def test_async_does_not_wait(self) -> Deferred[None]:
        """In async mode an acknowledgement never waits for the partner."""

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=False)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            pair.to_active.held = True
            results: list[JournalError | None] = []
            self.store(active, 3, results)
            await self.until(lambda: len(results) == 3)

        return self.run_async(run())

    def test_incremental_catch_up(self) -> Deferred[None]:
        """
        A partner that follows the same history and has part of it gets
        only what it lacks: the catch-up sends the later records alone
        (besides the state in force: retention, owners).
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            self.write(active, "trades", 1000)
            await active.flush()
            await self.until(lambda: pair.source.acked >= active.handed)
            # The link breaks; the active writes on alone.
            pair.to_passive.cut = True
            pair.source.partner_gone()
            self.write(active, "trades", 50)
            await active.flush()
            pair.to_passive.cut = False
            pair.to_passive.sent.clear()
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            shipped = [
                change
                for message in pair.to_passive.sent
                if isinstance(message, wire.Items)
                for change in message.changes
                if type(change) is tuple
            ]
            self.assertEqual(len(shipped), 50)
            begin = next(m for m in pair.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.INCREMENTAL)
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))

        return self.run_async(run())

    def test_salvaged_losses_filled_again(self) -> Deferred[None]:
        """
        A passive whose journal was damaged (a kill -9, then a page spoiled)
        is salvaged when it opens again: it says it holds a stream only up
        to before its first loss, cuts it back there when the catch-up
        begins, and gets the rest from the active (an incremental catch-up,
        not all of it); then it has every record, and no loss is left.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            for i in range(1, 301):
                active.append_stream("trades", "w", "s", [b"MARK%05d-" % i + b"x" * 80], 5.0)
            await active.flush()
            await self.until(lambda: pair.source.acked >= active.handed)
            await passive.flush()
            path = passive.path
            pair.replica.stop()
            await passive.close()
            # A kill -9 leaves it marked running; then a page of records is spoiled.
            with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                conn.execute("UPDATE journal_counters SET value = 1 WHERE name = 'running'")
            data = bytearray(path.read_bytes())
            data[data.index(b"MARK00150-") // 4096 * 4096] = 0x77
            path.write_bytes(bytes(data))
            again = Journal(path, CLOCK)
            again.open()
            self.addCleanup(self._close, again)
            assert again.salvaged is not None
            first_lost = again.losses()["trades"]
            self.assertLess(first_lost, 300)
            refill = Pair(active, again, History("e1"), sync=True)
            refill.replica.hello()
            await self.until(lambda: refill.source.in_sync)
            await again.flush()
            hello = next(m for m in refill.to_active.sent if isinstance(m, wire.Hello))
            self.assertEqual(hello.streams["trades"], first_lost - 1)
            begin = next(m for m in refill.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.INCREMENTAL)
            shipped = [
                change[1]
                for message in refill.to_passive.sent
                if isinstance(message, wire.Items)
                for change in message.changes
                if type(change) is tuple
            ]
            self.assertEqual(shipped, list(range(first_lost, 301)))
            self.assertEqual(_stream(path, "trades"), _stream(active.path, "trades"))
            await self.until(lambda: not again.losses())
            await again.flush()
            self.assertEqual(again.lost("trades", 1, 300), [])
            self.assertEqual(_rows(path, "SELECT count(*) FROM journal_losses"), [(0,)])

        return self.run_async(run())

    def test_active_losses_copied_back(self) -> Deferred[None]:
        """
        An active whose journal lost records to damage (a salvage's losses,
        here the stream's first ones: the catch-up does not tell the passive
        to drop what comes before what the active retains) asks its passive
        for them once it is in sync, a page at a time:
        those the passive holds are written back (counted in the stream's
        totals), and only those it lacks too stay lost, here and in the file.
        """

        async def run() -> None:
            active, passive, pair = await self.linked(sync=True)
            self.write(active, "trades", 2500)
            await active.flush()
            await self.until(lambda: pair.source.acked >= active.handed)
            await passive.flush()
            pair.replica.stop()
            for journal, cut, lost in ((active, (1, 1500), True), (passive, (1200, 1300), False)):
                path = journal.path
                await journal.close()
                with closing(sqlite3.connect(path, isolation_level=None)) as conn:
                    conn.execute(
                        "DELETE FROM stream_messages WHERE stream = 'trades'"
                        " AND seq BETWEEN ? AND ?",
                        cut,
                    )
                    conn.execute(
                        "UPDATE streams SET message_count = (SELECT count(*) FROM"
                        " stream_messages WHERE stream = 'trades') WHERE stream = 'trades'"
                    )
                    if lost:
                        conn.execute(
                            "INSERT INTO journal_losses VALUES ('trades', ?, ?, 0.0, 'damaged')",
                            cut,
                        )
            again, follower = Journal(active.path, CLOCK), Journal(passive.path, CLOCK)
            for journal in (again, follower):
                journal.open()
                self.addCleanup(self._close, journal)
            self.assertEqual(again.lost("trades", 1, 2500), [(1, 1500)])
            refill = Pair(again, follower, History("e1"), sync=True)
            refill.replica.hello()
            await self.until(lambda: again.lost("trades", 1, 2500) == [(1200, 1300)])
            await again.flush()
            asks = [m for m in refill.to_passive.sent if isinstance(m, wire.RefillAsk)]
            self.assertEqual([(m.first, m.last) for m in asks], [(1, 1500), (1001, 1500)])
            begin = next(m for m in refill.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.firsts, {"trades": 1})  # the passive keeps what was lost
            held = [seq for seq, _, _ in _stream(again.path, "trades")]
            self.assertEqual(held, [*range(1, 1200), *range(1301, 2501)])
            self.assertEqual(
                _rows(again.path, "SELECT first_seq, last_seq FROM journal_losses"), [(1200, 1300)]
            )
            self.assertEqual(
                _rows(again.path, "SELECT message_count FROM streams WHERE stream = 'trades'"),
                [(len(held),)],
            )

        return self.run_async(run())

    def test_old_leader_is_cut_back(self) -> Deferred[None]:
        """
        A partner that led the previous history (the old active) loses what
        it wrote after the takeover point (never acknowledged in sync mode)
        and gets the new active's records, letters and numbering.
        """

        async def run() -> None:
            old, new = self.journal("old"), self.journal("new")
            # As partners' journals, they number letters alike (each new
            # journal's ids start past its own creation time).
            letters = max(old.numbering_ceiling().letters, new.numbering_ceiling().letters)
            for journal in (old, new):
                await journal.number_past(Ceiling(0, letters))
            # Both shared records 1..100 and letters; the old one then wrote
            # records 101..120 and a letter the new one never had.
            for journal in (old, new):
                self.write(journal, "trades", 100)
            shared: list[JournalError | None] = []
            shared_ids = self.store(old, 2, shared)
            self.assertEqual(self.store(new, 2, shared), shared_ids)
            self.write(old, "trades", 20, subject="divergent")
            divergent = self.store(old, 1, shared)
            await old.flush()
            await new.flush()
            await old.execute(set_state({"epoch": "e1", "complete": "1"}))
            # The new active took over from e1 at record 100, letter 2.
            history = History("e2", "e1", {"trades": 100}, shared_ids[-1])
            self.write(new, "trades", 5, subject="after")
            await new.flush()
            pair = Pair(new, old, history, sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            await old.flush()
            begin = next(m for m in pair.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.TRUNCATE)
            self.assertEqual(_stream(old.path, "trades"), _stream(new.path, "trades"))
            self.assertNotIn("divergent", [row[1] for row in _stream(old.path, "trades")])
            self.assertNotIn(divergent[0], _letters(old.path))
            self.assertEqual(_letters(old.path), _letters(new.path))

        return self.run_async(run())

    def test_unrelated_history_copied_whole(self) -> Deferred[None]:
        """
        A partner whose journal holds another history keeps nothing of it
        and gets a whole copy.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            self.write(passive, "stale", 10)
            self.write(active, "trades", 10)
            await passive.execute(set_state({"epoch": "elsewhere", "complete": "1"}))
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            begin = next(m for m in pair.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.FULL)
            self.assertEqual(_stream(passive.path, "stale"), [])
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))

        return self.run_async(run())

    def test_letter_removed_during_catch_up(self) -> Deferred[None]:
        """
        A letter removed on the active while its copy is still on the way
        in the catch-up is not stored on the passive.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            results: list[JournalError | None] = []
            ids = self.store(active, 5, results)
            await active.flush()
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.to_passive.held = True
            pair.replica.hello()
            await self.until(lambda: any(isinstance(m, wire.Items) for m in pair.to_passive.sent))
            active.remove_queued(ids[2])
            await active.flush()
            # The removal's SHIP overtakes the ITEMS that carry the letter.
            self.assertEqual(pair.to_passive.ships_first(), 1)
            pair.to_passive.release()
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            self.assertEqual(_letters(passive.path), [i for i in ids if i != ids[2]])

        return self.run_async(run())

    def test_gap_starts_over(self) -> Deferred[None]:
        """
        A SHIP lost on the link (a position missing) makes the passive ask
        for a catch-up again, after which it has everything.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=False)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            pair.to_passive.held = True
            self.write(active, "trades", 10)
            await active.flush()
            self.write(active, "trades", 10)
            await active.flush()
            del pair.to_passive.waiting[0]  # the first SHIP is lost
            catchups = pair.source.stats.catchups
            pair.to_passive.release()
            await self.until(lambda: pair.source.stats.catchups > catchups)
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            self.assertEqual(pair.replica.stats.gaps, 1)
            self.assertEqual(len(_stream(passive.path, "trades")), 20)

        return self.run_async(run())

    def test_lagging_partner_dropped(self) -> Deferred[None]:
        """
        A partner more than the lag bound behind (bytes shipped and not
        acknowledged) is dropped: the active goes on alone instead of
        queueing for it, and the partner catches up from the journal.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair = Pair(active, passive, History("e1"), sync=False)
            pair.source.max_lag_bytes = 20 * (128 + 10)  # about twenty records
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            pair.to_active.held = True  # no ACKs: the partner falls behind
            for _ in range(30):
                self.write(active, "trades", 1)
                await active.flush()
            self.assertEqual(pair.source.link, 0)
            self.assertFalse(pair.source.in_sync)
            self.assertEqual(pair.source.stats.resyncs, 1)
            self.assertEqual(pair.source.unacked_bytes, 0)
            pair.to_active.release()
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            await passive.flush()
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))

        return self.run_async(run())

    def test_abandoned_takeover_says_the_history_it_followed(self) -> Deferred[None]:
        """
        A passive whose journal holds a takeover abandoned before it served
        (SERVED "0", what it held before kept) says hello with the history
        it followed, which it holds whole: the active catches it up from
        where it is, not as a journal of another history (copied whole).
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            for journal in (active, passive):
                self.write(journal, "trades", 20)
                await journal.flush()
            followed = {"epoch": "e1", "leader": "", "previous_epoch": ""}
            await passive.execute(
                set_state(
                    {
                        "epoch": "e2",
                        "leader": "backup",
                        "previous_epoch": "e1",
                        "complete": "1",
                        "served": "0",
                        "before_takeover": json.dumps(followed),
                    }
                )
            )
            self.write(active, "trades", 5)
            await active.flush()
            pair = Pair(active, passive, History("e1"), sync=True)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            hello = next(m for m in pair.to_active.sent if isinstance(m, wire.Hello))
            self.assertEqual(hello.epoch, "e1")
            begin = next(m for m in pair.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.INCREMENTAL)
            await passive.flush()
            self.assertEqual(_stream(passive.path, "trades"), _stream(active.path, "trades"))

        return self.run_async(run())

    def test_takeover_numbers_never_reused(self) -> Deferred[None]:
        """
        A passive's journal opened again as a takeover continues the
        numbering past what the old active may have handed out, and
        reports the takeover point.
        """

        async def run() -> None:
            active, passive, pair = await self.linked(sync=True)
            self.write(active, "trades", 10)
            results: list[JournalError | None] = []
            ids = self.store(active, 3, results)
            await self.until(lambda: len(results) == 3)
            pair.replica.stop()
            await passive.close()
            found = passive.open(takeover=True)
            self.assertEqual(found.lasts, {"trades": 10})
            self.assertGreaterEqual(found.last_id, ids[-1])
            self.assertEqual([r.id for r in found.queued], ids)
            seq = passive.append_stream("trades", "w", "s", [b"x"], 1.0)
            self.assertGreater(seq, 10 + 1)
            letter = passive.store_queued("mailbox", "b", "s", "x", "", None, [b""], results.append)
            self.assertGreater(letter.id, ids[-1] + 1)

        return self.run_async(run())


SECURITY = wire.ClientSecurity(
    {"alice": "wonderland", "bob": "builder"},
    None,
    {"write": {"alice": ["prices.*"], "bob": ["prices.*"]}, "role": {"admin": ["admin"]}},
)
REVOKED = wire.ClientSecurity(
    {"alice": "wonderland", "bob": "builder"},
    None,
    {"write": {"alice": ["prices.*"]}, "role": {"admin": ["admin"]}},
)


def _owners(path: Path) -> list[tuple[str, str, float]]:
    return _rows(path, "SELECT address, user, claimed FROM address_owners ORDER BY address")


class ChangesCase(JournalPairCase):
    """Two real journals paired with a security state to install, in sync or not."""

    def pair(self, active: Journal, passive: Journal) -> tuple[Pair, list[wire.ClientSecurity]]:
        """A pair whose source's security state is C{self.security}; what the replica installs."""
        self.security: wire.ClientSecurity | None = SECURITY
        pair = Pair(active, passive, History("e1"), sync=True)
        pair.source.security = lambda: self.security
        installed: list[wire.ClientSecurity] = []
        pair.replica.on_security = installed.append
        return pair, installed

    async def in_sync(self, pair: Pair, active: Journal, passive: Journal) -> None:
        """Wait until the partner has acknowledged everything written so far, on its disk."""
        await active.flush()
        await self.until(lambda: pair.source.in_sync and pair.source.acked >= active.handed)
        await passive.flush()


class ChangeReplicationTests(ChangesCase):
    """
    Owner claims, stream deletes, retention changes and the clients'
    security state between two real journals: shipped in the order of
    writes, and sent again whole by every catch-up.
    """

    def test_changes_shipped_in_order(self) -> Deferred[None]:
        """
        Once in sync, a claim, a stream delete, a retention change and a
        security reload on the active are shipped in the order they were
        made, among the records, and applied on the passive: the same
        owners, the stream's records gone there too (later ones kept), the
        active's retention in force, the security state installed; the
        positions stay in step (no gap).
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair, installed = self.pair(active, passive)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            self.assertEqual(installed, [SECURITY])  # the catch-up's
            self.write(active, "gone", 10)
            active.save_owner("alice", "alice", 5.0)
            deleted = active.delete_stream("gone")
            config = active.config
            active.set_retention(
                dataclasses.replace(
                    config, per_stream_retention={"kept": RetentionPolicy(max_count=3)}
                )
            )
            active.pass_to_partner(REVOKED)
            self.write(active, "gone", 2, subject="after")
            await self.in_sync(pair, active, passive)
            self.assertEqual(await deleted, (10, 10 * 6))
            kinds = [
                type(change).__name__
                for message in pair.to_passive.sent
                if isinstance(message, wire.Ship)
                for change in message.changes
                if type(change) is not tuple
            ]
            self.assertEqual(
                kinds, ["OwnerClaimed", "StreamDeleted", "Retention", "ClientSecurity"]
            )
            self.assertEqual(_owners(passive.path), [("alice", "alice", 5.0)])
            self.assertEqual([s for _, s, _ in _stream(passive.path, "gone")], ["after"] * 2)
            self.assertEqual(_stream(passive.path, "gone"), _stream(active.path, "gone"))
            self.assertEqual(
                _rows(passive.path, "SELECT message_count FROM streams WHERE stream = 'gone'"),
                [(2,)],
            )
            self.assertEqual(passive.config.retention_for("kept"), RetentionPolicy(max_count=3))
            self.assertEqual(passive.first_seq("gone"), 11)
            self.assertEqual(installed, [SECURITY, REVOKED])
            self.assertEqual(pair.replica.stats.gaps, 0)

        return self.run_async(run())

    def test_full_catch_up_sends_the_state(self) -> Deferred[None]:
        """
        A passive with an empty journal catching up from scratch gets the
        whole owners table (more than one page of it), no record of a
        stream deleted before, the retention and security state in force.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            claims = [(f"box-{i:04d}", f"user-{i % 7}", float(i)) for i in range(1234)]
            for claim in claims:
                active.save_owner(*claim)
            self.write(active, "gone", 5)
            self.write(active, "kept", 5)
            active.delete_stream("gone")
            active.set_retention(
                dataclasses.replace(active.config, retention=RetentionPolicy(max_count=50))
            )
            await active.flush()
            pair, installed = self.pair(active, passive)
            pair.replica.hello()
            await self.in_sync(pair, active, passive)
            self.assertEqual(_owners(passive.path), sorted(claims))
            pages = [
                change
                for message in pair.to_passive.sent
                if isinstance(message, wire.Items)
                for change in message.changes
                if isinstance(change, wire.OwnersPage)
            ]
            self.assertEqual([len(page.claims) for page in pages], [500, 500, 234])
            self.assertEqual(_stream(passive.path, "gone"), [])
            self.assertEqual(len(_stream(passive.path, "kept")), 5)
            self.assertEqual(passive.config.retention, RetentionPolicy(max_count=50))
            self.assertEqual(installed, [SECURITY])

        return self.run_async(run())

    def test_incremental_catch_up_sends_the_state(self) -> Deferred[None]:
        """
        A passive that follows the active's history and was away while the
        active took claims, deleted a stream, had records pruned by
        retention and reloaded its security files gets all of it in an
        incremental catch-up: the active's owners table exactly (an owner
        the active no longer has goes), nothing below each stream's first
        retained record, the retention and security state in force.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair, installed = self.pair(active, passive)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            active.save_owner("alice", "alice", 1.0)
            self.write(active, "gone", 5)
            self.write(active, "pruned", 10)
            await self.in_sync(pair, active, passive)
            self.assertEqual(len(_stream(passive.path, "pruned")), 10)
            # The passive goes away; the active goes on alone.
            pair.to_passive.cut = True
            pair.source.partner_gone()
            active.save_owner("bob", "bob", 2.0)
            active.delete_stream("gone")
            active.set_retention(
                dataclasses.replace(
                    active.config, per_stream_retention={"pruned": RetentionPolicy(max_count=4)}
                )
            )
            self.assertEqual(await active.prune(), 6)
            self.write(active, "pruned", 1, subject="later")
            self.security = REVOKED
            # An owner the active does not have (freed there while it was stopped).
            await passive.execute(
                [("INSERT INTO address_owners VALUES ('stale', 'mallory', 0.0)", ())]
            )
            await active.flush()
            pair.to_passive.cut = False
            pair.to_passive.sent.clear()
            pair.replica.hello()
            await self.in_sync(pair, active, passive)
            begin = next(m for m in pair.to_passive.sent if isinstance(m, wire.CatchupBegin))
            self.assertEqual(begin.mode, wire.INCREMENTAL)
            self.assertEqual(begin.firsts, {"gone": 6, "pruned": 7})
            self.assertEqual(_owners(passive.path), [("alice", "alice", 1.0), ("bob", "bob", 2.0)])
            self.assertEqual(_stream(passive.path, "gone"), [])
            self.assertEqual(_stream(passive.path, "pruned"), _stream(active.path, "pruned"))
            self.assertEqual(
                [seq for seq, _, _ in _stream(passive.path, "pruned")], [7, 8, 9, 10, 11]
            )
            self.assertEqual(
                _rows(passive.path, "SELECT stream, message_count FROM streams ORDER BY stream"),
                [("gone", 0), ("pruned", 5)],
            )
            self.assertEqual(passive.config.retention_for("pruned"), RetentionPolicy(max_count=4))
            self.assertEqual(installed, [SECURITY, REVOKED])

        return self.run_async(run())

    def test_changes_during_catch_up_win(self) -> Deferred[None]:
        """
        A claim and a stream delete shipped while the catch-up's older
        copies (the owners page, the records) are still on the way are not
        undone by those copies: the passive ends with the new owner and
        without the records.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            active.save_owner("box", "alice", 5.0)
            self.write(active, "gone", 10)
            await active.flush()
            pair, _ = self.pair(active, passive)
            pair.to_passive.held = True
            pair.replica.hello()
            await self.until(
                lambda: any(isinstance(m, wire.CatchupEnd) for m in pair.to_passive.sent)
            )
            active.save_owner("box", "carol", 4.0)  # an earlier claim learned from a peer
            active.delete_stream("gone")
            await active.flush()
            self.assertEqual(pair.to_passive.ships_first(), 1)
            pair.to_passive.release()
            await self.in_sync(pair, active, passive)
            self.assertEqual(_owners(passive.path), [("box", "carol", 4.0)])
            self.assertEqual(_stream(passive.path, "gone"), [])

        return self.run_async(run())

    def test_unknown_right_not_installed(self) -> Deferred[None]:
        """
        A security state naming a right this broker does not know is
        logged and not installed; replication goes on.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair, _ = self.pair(active, passive)
            events = capture_log(self)
            installed: list[object] = []

            def install(change: wire.ClientSecurity) -> None:
                installed.append(security_state(change))

            pair.replica.on_security = install
            self.security = wire.ClientSecurity(None, None, {"fly": {"alice": ["*"]}})
            pair.replica.hello()
            await self.in_sync(pair, active, passive)
            self.assertEqual(installed, [])
            self.assertTrue(
                any("right 'fly'" in formatEvent(e) for e in events),
                [formatEvent(e) for e in events],
            )
            self.write(active, "s", 3)
            await self.in_sync(pair, active, passive)
            self.assertEqual(len(_stream(passive.path, "s")), 3)

        return self.run_async(run())


def _consumers(path: Path) -> list[tuple[str, str, str, int]]:
    return _rows(path, "SELECT stream, kind, name, seq FROM stream_consumers ORDER BY name")


class ConsumerReplicationTests(ChangesCase):
    """Consumer positions between two real journals: shipped live, and copied by a catch-up."""

    def test_positions_shipped_live(self) -> Deferred[None]:
        """
        Once in sync, a consumer's position saved on the active, then moved,
        then another forgotten, reach the passive's table as on the active.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair, _ = self.pair(active, passive)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            active.save_consumer(ConsumerPosition("s", READER, "c1", 4, b"", 1.0))
            active.save_consumer(ConsumerPosition("s", READER, "c2", 2, b"", 1.0))
            active.save_consumer(ConsumerPosition("s", READER, "c1", 9, b"", 2.0))
            active.forget_consumer(ConsumerPosition("s", READER, "c2", 2))
            await self.in_sync(pair, active, passive)
            self.assertEqual(_consumers(passive.path), [("s", READER, "c1", 9)])
            self.assertEqual(_consumers(passive.path), _consumers(active.path))

        return self.run_async(run())

    def test_catch_up_copies_the_table_exactly(self) -> Deferred[None]:
        """
        A catch-up sends every position (more than a page of them), and the
        passive keeps none the active does not have.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            for n in range(700):
                active.save_consumer(ConsumerPosition("s", READER, f"c{n:04d}", n, b"", 1.0))
            await active.flush()
            await passive.execute(
                [
                    (
                        "INSERT INTO stream_consumers"
                        " VALUES ('s', 'reader', 'stale', 1, x'', 0.0, '')",
                        (),
                    )
                ]
            )
            pair, _ = self.pair(active, passive)
            pair.replica.hello()
            await self.in_sync(pair, active, passive)
            self.assertEqual(len(_consumers(passive.path)), 700)
            self.assertEqual(_consumers(passive.path), _consumers(active.path))

        return self.run_async(run())

    def test_ship_during_catch_up_wins(self) -> Deferred[None]:
        """A position shipped while the catch-up's older copy is on the way is not undone by it."""

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            active.save_consumer(ConsumerPosition("s", READER, "c1", 4, b"", 1.0))
            await active.flush()
            pair, _ = self.pair(active, passive)
            pair.to_passive.held = True
            pair.replica.hello()
            await self.until(
                lambda: any(isinstance(m, wire.CatchupEnd) for m in pair.to_passive.sent)
            )
            active.save_consumer(ConsumerPosition("s", READER, "c1", 8, b"", 2.0))
            await active.flush()
            pair.to_passive.release()
            await self.in_sync(pair, active, passive)
            self.assertEqual(_consumers(passive.path), [("s", READER, "c1", 8)])

        return self.run_async(run())


def _last_values(path: Path) -> list[tuple[Any, ...]]:
    return _rows(path, "SELECT stream, subject, seq FROM stream_last_values ORDER BY 1, 2")


class LastValueReplicationTests(ChangesCase):
    """Last-value streams between two real journals: the same last values on both."""

    def test_compaction_shipped_live(self) -> Deferred[None]:
        """
        Once in sync, a stream made a last-value stream on the active, among
        its records, is one on the passive too, with the same last values
        (rebuilt there at the same point of the writes), which follow the
        later records; made an ordinary one again, it loses them there too.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            pair, _ = self.pair(active, passive)
            pair.replica.hello()
            await self.until(lambda: pair.source.in_sync)
            self.write(active, "lv", 3, subject="a")
            self.write(active, "lv", 2, subject="b")
            active.set_compaction("lv", True)
            self.write(active, "lv", 1, subject="a")
            await self.in_sync(pair, active, passive)
            self.assertTrue(passive.compacted("lv"))
            self.assertEqual(_last_values(passive.path), [("lv", "a", 6), ("lv", "b", 5)])
            self.assertEqual(_last_values(passive.path), _last_values(active.path))
            active.set_compaction("lv", False)
            await self.in_sync(pair, active, passive)
            self.assertFalse(passive.compacted("lv"))
            self.assertEqual(_last_values(passive.path), [])

        return self.run_async(run())

    def test_catch_up_rebuilds(self) -> Deferred[None]:
        """
        A catch-up sends the last-value streams in force: the passive
        rebuilds their last values from what it then holds, and forgets
        those of a stream it compacted that the active does not.
        """

        async def run() -> None:
            active, passive = self.journal("a"), self.journal("b")
            active.set_compaction("lv", True)
            self.write(active, "lv", 3, subject="a")
            self.write(active, "lv", 2, subject="b")
            await active.flush()
            passive.set_compaction("mine", True)
            self.write(passive, "mine", 2)
            await passive.flush()
            pair, _ = self.pair(active, passive)
            pair.replica.hello()
            await self.in_sync(pair, active, passive)
            self.assertEqual(_last_values(passive.path), [("lv", "a", 3), ("lv", "b", 5)])
            self.assertTrue(passive.compacted("lv"))
            self.assertFalse(passive.compacted("mine"))

        return self.run_async(run())
