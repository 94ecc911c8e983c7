"""
Tests for L{malamute_pack.protocol.records}: the records the pair link
carries are the ones the broker and the journal use, under their old names.
"""

from __future__ import annotations

import dataclasses

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack import store
from malamute_pack.journal import records as journal_records
from malamute_pack.journal import retention
from malamute_pack.protocol import records


class RecordsTests(SynchronousTestCase):
    def test_oldNames(self) -> None:
        """The broker's and the journal's names are the protocol's records themselves."""
        self.assertIs(store.QueuedRecord, records.QueuedRecord)
        self.assertIs(journal_records.QueuedRecord, records.QueuedRecord)
        self.assertIs(journal_records.StreamRow, records.StreamRow)
        self.assertIs(retention.RetentionPolicy, records.RetentionPolicy)

    def test_values(self) -> None:
        """Records are immutable values; a policy without limits has none of any kind."""
        record = records.QueuedRecord(1, "mailbox", "a", "b", "s", "", None, 0.0, (b"x",))
        self.assertEqual((record.relay_origin, record.relay_id), ("", 0))
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, record, "id", 2)
        self.assertEqual(records.RetentionPolicy(), records.RetentionPolicy(None, None, None))
