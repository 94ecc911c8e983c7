"""
Tests for L{malamute_pack.journal.reader}: queries run on the journal's
reader thread and fire in the reactor, counted while pending; what SQLite fails with comes back as
a JournalError; a reader not started, or stopped, refuses.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import cast

from twisted.internet import reactor
from twisted.internet.defer import inlineCallbacks
from twisted.internet.interfaces import IReactorFromThreads
from twisted.trial.unittest import TestCase

from malamute_pack.journal import JournalError
from malamute_pack.journal.reader import ReaderThread
from tests.unit.test_journal_journal import Inline, new_path


def thread_name(conn: sqlite3.Connection) -> str:
    return threading.current_thread().name


def broken(conn: sqlite3.Connection) -> object:
    return conn.execute("SELECT * FROM no_such_table").fetchall()


class ReaderThreadTests(TestCase):
    def reader(self) -> ReaderThread:
        path = new_path(self)
        path.parent.mkdir(parents=True)
        reader = ReaderThread(path, cast(IReactorFromThreads, reactor))
        reader.start(sqlite3.connect(path, check_same_thread=False))
        self.addCleanup(reader.stop)
        return reader

    @inlineCallbacks
    def test_readsOnItsThread(self) -> Inline:
        """A query runs on the reader's own thread, a daemon one."""
        reader = self.reader()
        self.assertTrue(reader.running)
        name = yield reader.read(thread_name)
        self.assertIn("journal-reader", name)

    @inlineCallbacks
    def test_pendingCounted(self) -> Inline:
        """Reads asked for count as pending until answered, failed ones too."""
        reader = self.reader()
        reading = reader.read(thread_name)
        failing = reader.read(broken)
        self.assertEqual(reader.pending, 2)
        yield reading
        with self.assertRaises(JournalError):
            yield failing
        self.assertEqual(reader.pending, 0)

    @inlineCallbacks
    def test_sqliteErrorWrapped(self) -> Inline:
        """A query SQLite fails comes back as a JournalError that says it was reading."""
        reader = self.reader()
        with self.assertRaises(JournalError) as caught:
            yield reader.read(broken)
        self.assertIn("reading", str(caught.exception))

    @inlineCallbacks
    def test_stoppedRefuses(self) -> Inline:
        """A reader stopped refuses with a JournalError; stopping it again is fine."""
        reader = self.reader()
        yield reader.stop()
        self.assertFalse(reader.running)
        self.assertRaises(JournalError, reader.read, thread_name)
        yield reader.stop()
