"""
Tests for the streams the broker model knows without a client having named
them (L{malamute_pack.broker.streams.Streams.restore}): those a journal
holds, listed after a restart with their journal figures.
"""

from __future__ import annotations

from twisted.internet.defer import inlineCallbacks
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase, TestCase

from malamute_pack.broker.stalled import Stalled
from malamute_pack.broker.streams import Streams
from tests.unit.test_journal_journal import Inline, append, new_path, open_journal


class KnownStreamsTests(SynchronousTestCase):
    def test_restoredStreamsKnown(self) -> None:
        """
        Restored names are known streams with nobody reading or writing
        them and nothing written since; restoring again changes nothing.
        """
        streams = Streams(Clock(), None, Stalled(Clock(), 1.0, lambda connection: None), 16, 10)
        streams.restore(["a", "b"])
        streams.restore(["b"])
        self.assertEqual(sorted(streams.streams), ["a", "b"])
        stream = streams.streams["a"]
        self.assertEqual((stream.messages, stream.readers.owner_count()), (0, 0))


class JournalStreamsTests(TestCase):
    @inlineCallbacks
    def test_journalStreamsAfterRestart(self) -> Inline:
        """
        After a restart the model knows every stream of the journal, and
        reads their numbers from it.
        """
        path = new_path(self)
        journal, _ = open_journal(self, path)
        append(journal, "kept", 3)
        yield journal.close()
        journal, _ = open_journal(self, path)
        streams = Streams(Clock(), journal, Stalled(Clock(), 1.0, lambda connection: None), 16, 10)
        streams.restore(journal.stream_names())
        self.assertEqual(list(streams.streams), ["kept"])
        self.assertEqual(streams.last_seq("kept"), 3)
