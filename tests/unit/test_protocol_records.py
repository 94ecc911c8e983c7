"""
Tests for L{malamute_pack.protocol.records}: the records the pair link
carries, and the broker and the journal use, are immutable values.
"""

from __future__ import annotations

import dataclasses

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.protocol import records


class RecordsTests(SynchronousTestCase):
    def test_values(self) -> None:
        """Records are immutable values; a policy without limits has none of any kind."""
        record = records.QueuedRecord(1, "mailbox", "a", "b", "s", "", None, 0.0, (b"x",))
        self.assertEqual((record.relay_origin, record.relay_id), ("", 0))
        self.assertRaises(dataclasses.FrozenInstanceError, setattr, record, "id", 2)
        self.assertEqual(records.RetentionPolicy(), records.RetentionPolicy(None, None, None))
