"""
Tests for L{malamute_pack.broker.appends} and STREAM_APPEND on a broker
with a real journal, through its real MLM sessions: all-or-nothing appends
answered once durable, a key written once however often it is sent (also
while the first is being written, after a restart, and after a pair's
partner did not acknowledge it), the bound on keys remembered, and
refusals answered as STREAM_APPENDED.
"""

from __future__ import annotations

from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.appends import AppendKeys
from malamute_pack.broker.broker import BrokerConfig
from malamute_pack.broker.limits import Limits
from malamute_pack.journal import JournalConfig
from malamute_pack.protocol import chunks, mlm
from malamute_pack.protocol.records import AppendKey
from tests.broker_support import BrokerHarness

A, R = b"appender", b"reader"


class AppendKeysTests(SynchronousTestCase):
    def test_writtenAfterEnd(self) -> None:
        """A key is written only once its append ended with 200; its waiters are told."""
        keys = AppendKeys(10)
        told: list[tuple[int, int, int, str]] = []
        keys.begin("s", "k", lambda *a: told.append(a))
        self.assertIsNone(keys.written("s", "k"))
        self.assertTrue(keys.wait("s", "k", lambda *a: told.append(a)))
        keys.end("s", "k", 1, 3, 200, "")
        self.assertEqual(keys.written("s", "k"), (1, 3))
        self.assertEqual(told, [(1, 3, 200, "")] * 2)

    def test_failedForgotten(self) -> None:
        """A failed append's key is not remembered: a retry writes it."""
        keys = AppendKeys(10)
        keys.begin("s", "k", lambda *a: None)
        keys.end("s", "k", 1, 3, 300, "disk full")
        self.assertIsNone(keys.written("s", "k"))
        self.assertFalse(keys.wait("s", "k", lambda *a: None))

    def test_unconfirmed(self) -> None:
        """
        An append that failed on this disk all the same (a pair's partner
        did not acknowledge it) stays written, unconfirmed, with its
        position, until it is confirmed (then plain written) or forgotten.
        """
        keys = AppendKeys(10)
        told: list[tuple[int, int, int, str]] = []
        keys.begin("s", "k", lambda *a: told.append(a))
        keys.end("s", "k", 1, 3, 300, "not acknowledged", unconfirmed=7)
        self.assertEqual((keys.written("s", "k"), keys.unconfirmed("s", "k")), ((1, 3), 7))
        keys.begin_confirm("s", "k", lambda *a: told.append(a))
        self.assertTrue(keys.wait("s", "k", lambda *a: told.append(a)))
        keys.end("s", "k", 1, 3, 208, "already written")
        self.assertEqual((keys.written("s", "k"), keys.unconfirmed("s", "k")), ((1, 3), None))
        self.assertEqual(
            told, [(1, 3, 300, "not acknowledged")] + [(1, 3, 208, "already written")] * 2
        )

    def test_bounded(self) -> None:
        """Past the limit the oldest keys are forgotten, and begin() says which."""
        keys = AppendKeys(2)
        keys.restore([AppendKey("s", "a", 1, 1), AppendKey("t", "b", 1, 1)])
        forget = keys.begin("s", "c", lambda *a: None)
        self.assertEqual(forget, [("s", "a")])
        self.assertEqual(keys.forgotten, 1)
        self.assertIsNone(keys.written("s", "a"))
        self.assertEqual(keys.written("t", "b"), (1, 1))

    def test_restoreBounded(self) -> None:
        """Restoring more keys than the limit keeps the newest."""
        keys = AppendKeys(1)
        keys.restore([AppendKey("s", "a", 1, 1), AppendKey("s", "b", 2, 2)])
        self.assertEqual((keys.written("s", "a"), keys.written("s", "b")), (None, (2, 2)))


def append(key: str, *subjects: str, stream: str = "s") -> mlm.StreamAppend:
    data = chunks.encode_append([(s, [s.encode(), b"\x01"]) for s in subjects])
    return mlm.StreamAppend(stream, key, [data])


class AppendTests(SynchronousTestCase):
    limits = Limits()

    def setUp(self) -> None:
        self.path = Path(self.mktemp()) / "journal.sqlite"
        self.h = self.harness()
        self.addCleanup(lambda: self.h.close())

    def harness(self) -> BrokerHarness:
        h = BrokerHarness(
            BrokerConfig(timeout=60.0, limits=self.limits),
            self.path,
            JournalConfig(prune_interval_s=3600),
        )
        h.open(A, "appender", version=2)
        return h

    def test_appended(self) -> None:
        """An append is answered with its records' sequence numbers; they are in the stream."""
        self.assertEqual(
            self.h.command(A, append("k1", "a", "b", "c")),
            [mlm.StreamAppended("s", "k1", 1, 3, 200, "")],
        )
        self.assertEqual(
            self.h.command(A, append("k2", "d")), [mlm.StreamAppended("s", "k2", 4, 4, 200, "")]
        )
        self.h.open(R, "", version=2)
        got = self.h.command(R, mlm.StreamReadFrom("s", "", mlm.EARLIEST, 0))
        recs = [
            (m.sequence, m.sender, m.subject, m.content)
            for m in got
            if isinstance(m, mlm.StreamRecord)
        ]
        self.assertEqual(recs[0], (1, "appender", "a", [b"a", b"\x01"]))
        self.assertEqual([r[0] for r in recs], [1, 2, 3, 4])

    def test_answeredWhenDurable(self) -> None:
        """The answer waits for the journal's commit."""
        self.h.send(A, append("k", "a"))
        self.assertEqual(self.h.sent.get(A, []), [])
        self.assertEqual(self.h.take(A), [mlm.StreamAppended("s", "k", 1, 1, 200, "")])

    def test_liveReaders(self) -> None:
        """Live readers get an append's records as they get any other."""
        self.h.open(R, "", version=2)
        self.h.command(R, mlm.StreamRead("s", "^b"))
        self.h.command(A, append("k", "a", "b"))
        got = [m for m in self.h.take(R) if isinstance(m, mlm.StreamRecord)]
        self.assertEqual([(m.sequence, m.subject) for m in got], [(2, "b")])

    def test_duplicate(self) -> None:
        """A key sent again writes nothing: 208 with the first append's numbers."""
        self.h.command(A, append("k", "a", "b"))
        self.assertEqual(
            self.h.command(A, append("k", "a", "b")),
            [mlm.StreamAppended("s", "k", 1, 2, mlm.ALREADY_WRITTEN, "already written")],
        )
        self.assertEqual(self.h.broker.store.last_seq("s"), 2)  # type: ignore[union-attr]

    def test_duplicateWhileWriting(self) -> None:
        """A key sent again before the first is durable gets the first's outcome, once it is."""
        self.h.send(A, append("k", "a"))
        self.h.send(A, append("k", "a"))
        self.assertEqual(self.h.take(A), [mlm.StreamAppended("s", "k", 1, 1, 200, "")] * 2)
        self.assertEqual(self.h.broker.store.last_seq("s"), 1)  # type: ignore[union-attr]

    def flushed(self) -> None:
        """Wait until the journal wrote everything sent so far."""
        done: list[object] = []
        self.h.journal.flush().addBoth(done.append)  # type: ignore[union-attr]
        self.h.clock.run_thread_calls(lambda: bool(done))

    def test_unconfirmedRetry(self) -> None:
        """
        An append a pair's partner did not acknowledge fails, but its
        records are on this disk under its key: a retry writes nothing, fails
        again while the partner is still away, and once the partner has the
        write is answered with the first append's numbers (208).
        """
        journal = self.h.journal
        assert journal is not None
        journal.hold_for_replica(True)
        self.h.send(A, append("k", "a", "b"))
        self.flushed()
        self.assertEqual(self.h.sent.get(A, []), [])  # held for the partner
        journal.refuse_held("the pair's partner is unreachable")
        [refused] = self.h.take(A)
        assert isinstance(refused, mlm.StreamAppended)
        self.assertEqual(
            (refused.status_code, refused.status_reason),
            (mlm.FAILED, "not acknowledged: the pair's partner is unreachable"),
        )
        self.h.send(A, append("k", "a", "b"))
        self.assertEqual(self.h.take(A), [])  # waits for the partner
        journal.refuse_held("the pair's partner is unreachable")
        [again] = self.h.take(A)
        self.assertEqual(again.status_code, mlm.FAILED)  # type: ignore[attr-defined]
        self.h.send(A, append("k", "a", "b"))
        self.h.send(A, append("k", "a", "b"))
        journal.replica_acked(journal.handed)
        self.assertEqual(
            self.h.take(A),
            [mlm.StreamAppended("s", "k", 1, 2, mlm.ALREADY_WRITTEN, "already written")] * 2,
        )
        self.assertEqual(journal.last_seq("s"), 2)

    def test_keyPerStream(self) -> None:
        """The same key on another stream is another append."""
        self.h.command(A, append("k", "a"))
        got = self.h.command(A, append("k", "a", stream="t"))
        self.assertEqual(got, [mlm.StreamAppended("t", "k", 1, 1, 200, "")])

    def test_rememberedAfterRestart(self) -> None:
        """A key written before a restart is still a duplicate after it."""
        self.h.command(A, append("k", "a", "b"))
        self.h.close()
        self.h = self.harness()
        got = self.h.command(A, append("k", "a", "b"))
        self.assertEqual(got[0].status_code, mlm.ALREADY_WRITTEN)  # type: ignore[attr-defined]
        got = self.h.command(A, append("k2", "c"))
        self.assertEqual(got, [mlm.StreamAppended("s", "k2", 3, 3, 200, "")])

    def test_malformed(self) -> None:
        """Records that do not decode are refused with 300 and the reason; nothing is written."""
        [reply] = self.h.command(A, mlm.StreamAppend("s", "k", [b"\x05ab"]))
        assert isinstance(reply, mlm.StreamAppended)
        self.assertEqual(reply.status_code, mlm.FAILED)
        self.assertIn("invalid append", reply.status_reason)
        self.assertEqual(self.h.broker.store.last_seq("s"), 0)  # type: ignore[union-attr]

    def test_longSubject(self) -> None:
        """A record with a subject over the limit refuses the whole append."""
        data = chunks.encode_append([("ok", []), ("x" * 255, [])])
        h = self.h
        h.broker.streams._max_subject = 100
        [reply] = h.command(A, mlm.StreamAppend("s", "k", [data]))
        self.assertEqual(reply.status_code, mlm.FAILED)  # type: ignore[attr-defined]
        self.assertEqual(h.broker.store.last_seq("s"), 0)  # type: ignore[union-attr]

    def test_version1(self) -> None:
        """A version 1 client's append is ERROR 500."""
        self.h.open(b"old", "old")
        [reply] = self.h.command(b"old", append("k", "a"))
        assert isinstance(reply, mlm.Error)
        self.assertEqual(reply.status_code, mlm.COMMAND_INVALID)


class BoundedKeysTests(AppendTests):
    limits = Limits(append_keys=2)

    def test_forgottenInJournal(self) -> None:
        """A key pushed out of memory leaves the journal too: after a restart it is gone."""
        for key in ("a", "b", "c"):
            self.h.command(A, append(key, key))
        self.h.close()
        self.h = self.harness()
        self.assertEqual(self.h.command(A, append("a", "a"))[0].status_code, 200)  # type: ignore[attr-defined]
        self.assertEqual(
            self.h.command(A, append("c", "c"))[0].status_code,  # type: ignore[attr-defined]
            mlm.ALREADY_WRITTEN,
        )
