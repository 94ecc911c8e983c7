"""
Tests for L{malamute_pack.journal.backlog}: the bytes handed to the
journal's writer and not yet done with, and the watcher told when they pass
the limit and when they are back under half of it; through the journal and
on a L{Backlog} alone.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.journal.backlog import Backlog
from tests.unit.test_journal_journal import Inline, open_journal


class JournalBacklogTests(TestCase):
    @inlineCallbacks
    def test_backlogWatched(self) -> Inline:
        """
        The bytes handed to the writer and not yet written are counted; the
        watcher hears once when they pass the limit and once when they are
        back under half of it, and the count returns to zero.
        """
        journal, _ = open_journal(self)
        heard: list[bool] = []
        journal.watch_backlog(50_000, heard.append)
        for i in range(100):
            journal.append_stream("s", "sender", "subject", [b"x" * 1000], 1000.0 + i)
        self.assertEqual((heard, journal.backlog_bytes), ([], 0))  # not handed over yet
        flushed = journal.flush()
        self.assertEqual(heard, [True])
        self.assertGreater(journal.backlog_bytes, 100 * 1000)
        yield flushed
        self.assertEqual((heard, journal.backlog_bytes), ([True, False], 0))


class BacklogTests(SynchronousTestCase):
    def test_overAndBackUnderHalf(self) -> None:
        """
        The watcher hears True once past the limit and False once the bytes
        are back at half of it or less, shares given back in hand-over order.
        """
        backlog = Backlog()
        heard: list[bool] = []
        backlog.watch(100, heard.append)
        backlog.handed([60, 30], 90)
        self.assertEqual(heard, [])
        backlog.handed([40], 40)
        self.assertEqual((heard, backlog.bytes), ([True], 130))
        backlog.done(1)
        self.assertEqual((heard, backlog.bytes), ([True], 70))
        backlog.done(1)
        self.assertEqual((heard, backlog.bytes), ([True, False], 40))
        backlog.done(5)
        self.assertEqual((heard, backlog.bytes), ([True, False], 0))

    def test_sharesWithOverhead(self) -> None:
        """
        A hand-over's shares are its operations' own plus one overhead
        each; a batch reported may end inside a hand-over, and frees just
        the shares of the operations it covers.
        """
        backlog = Backlog()
        backlog.handed([10, 20, 30], 360, 100)
        backlog.handed([5], 5)
        self.assertEqual(backlog.bytes, 365)
        backlog.done(2)
        self.assertEqual(backlog.bytes, 135)
        backlog.done(2)
        self.assertEqual(backlog.bytes, 0)

    def test_resetLetsGo(self) -> None:
        """A reset (the journal opened again) empties it and tells a watcher it is under."""
        backlog = Backlog()
        heard: list[bool] = []
        backlog.watch(10, heard.append)
        backlog.handed([50], 50)
        backlog.reset()
        self.assertEqual((heard, backlog.bytes), ([True, False], 0))
        backlog.reset()
        self.assertEqual(heard, [True, False])

    def test_unwatched(self) -> None:
        """Without a watcher the bytes are counted all the same."""
        backlog = Backlog()
        backlog.handed([5, 6], 11)
        backlog.done(1)
        self.assertEqual(backlog.bytes, 6)
