"""
Tests for L{malamute_pack.broker.registry}: connections by session and by
address, and the attached/detached calls each session gets.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.connection import Connection
from malamute_pack.broker.registry import Registry
from tests.memory_session import InMemorySession


class RegistryTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.registry = Registry()

    def test_addAndLookUp(self) -> None:
        """A registered connection is found by its session and by its address."""
        session = InMemorySession("a")
        connection = Connection(session, "alice", 0.0)
        self.registry.add(connection)
        self.assertIs(self.registry.get(session), connection)
        self.assertIs(self.registry.holder("alice"), connection)
        self.assertEqual(len(self.registry), 1)
        self.assertEqual(list(self.registry), [connection])
        self.assertEqual(self.registry.addresses(), {"alice"})
        self.assertEqual(session.attachments, [1])

    def test_anonymousHoldsNoAddress(self) -> None:
        """An anonymous connection is registered by session only."""
        session = InMemorySession("anon")
        self.registry.add(Connection(session, "", 0.0))
        self.assertIsNone(self.registry.holder(""))
        self.assertEqual(self.registry.addresses(), set())
        self.assertIsNotNone(self.registry.get(session))

    def test_remove(self) -> None:
        """Removing a connection forgets both keys and tells the session it is detached."""
        session = InMemorySession("a")
        connection = Connection(session, "alice", 0.0)
        self.registry.add(connection)
        self.assertTrue(self.registry.remove(connection))
        self.assertIsNone(self.registry.get(session))
        self.assertIsNone(self.registry.holder("alice"))
        self.assertEqual(session.attachments, [1, -1])

    def test_removeStale(self) -> None:
        """
        Removing a connection that is no longer the session's (it was
        replaced) leaves the current one alone and tells nobody.
        """
        session = InMemorySession("a")
        old = Connection(session, "old", 0.0)
        self.registry.add(old)
        self.registry.remove(old)
        new = Connection(session, "new", 0.0)
        self.registry.add(new)
        self.assertFalse(self.registry.remove(old))
        self.assertIs(self.registry.get(session), new)
        self.assertEqual(session.attachments, [1, -1, 1])

    def test_iterationIsASnapshot(self) -> None:
        """Connections can be removed while iterating (expiry does)."""
        for name in "abc":
            self.registry.add(Connection(InMemorySession(name), name, 0.0))
        for connection in self.registry:
            self.registry.remove(connection)
        self.assertEqual(len(self.registry), 0)
