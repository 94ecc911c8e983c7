"""
Tests of what an idle client costs the broker in Python objects: an opened
MLM connection that does nothing more holds its session, its connection,
its address, its routing id and the tables' entries, and none of the
containers a connection makes only on first use
(L{malamute_pack.broker.connection}, L{malamute_pack.broker.receipts}).
Bytes are counted with tracemalloc: what the objects hold, never how long
anything takes.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import Broker, BrokerConfig
from malamute_pack.broker.connection import Connection
from malamute_pack.broker.letters import Kind, Letter
from malamute_pack.broker.limits import Limits
from malamute_pack.broker.receipts import Receipts
from malamute_pack.protocol import mlm
from malamute_pack.transport.sessions import MlmSessions
from tests.memory_session import InMemorySession

# Connections (receipts) measured together, so that the tables' growth is
# spread over them as it is in a broker with many clients.
COUNT = 1000
# Bytes of Python objects an idle MLM connection may hold: about 660 with
# CPython 3.11 (its session 96, its connection 200, two dicts 128, its
# receipts 40, address, routing id, the tables' entries); 2,090 when every
# container was made at CONNECTION_OPEN.
IDLE_CONNECTION_BYTES = 1000
# Bytes a connection's receipts may hold once every receipt has left: the
# object alone (48), not the 760 of an empty deque.
SETTLED_RECEIPTS_BYTES = 100


def held_bytes(action: Callable[[], object]) -> int:
    """The bytes of the Python objects C{action} made and still holds after it ran."""
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        kept = action()
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    del kept
    return held


class IdleMemoryTests(SynchronousTestCase):
    def test_idleConnection(self) -> None:
        """
        An MLM client that opened and does nothing more holds at most
        L{IDLE_CONNECTION_BYTES} of Python objects in the broker.
        """
        broker = Broker(Clock(), BrokerConfig(limits=Limits(max_clients=COUNT)))
        sessions = MlmSessions(broker, lambda route, frames: True, Limits())
        opens = [
            (f"route-{i}".encode(), mlm.encode(mlm.ConnectionOpen(address=f"idle-{i}")))
            for i in range(COUNT)
        ]

        def open_all() -> None:
            for route, frames in opens:
                sessions.receive(route, frames)

        held = held_bytes(open_all)
        self.assertEqual(len(broker.registry), COUNT)
        self.assertLessEqual(held / COUNT, IDLE_CONNECTION_BYTES)

    def test_settledReceipts(self) -> None:
        """
        A connection's receipts hold no queue once every receipt has left:
        at most L{SETTLED_RECEIPTS_BYTES} each, after a letter came and went.
        """

        def settle_one_each() -> list[Receipts]:
            all_receipts = [Receipts() for _ in range(COUNT)]
            for receipts in all_receipts:
                self.assertEqual(len(receipts.settle(receipts.expect("t"), 1, 200, "")), 1)
            return all_receipts

        self.assertLessEqual(held_bytes(settle_one_each) / COUNT, SETTLED_RECEIPTS_BYTES)

    def test_receiptsAfterClear(self) -> None:
        """
        Receipts cleared (their connection gone) settle nothing; new ones
        after that queue and leave as before.
        """
        receipts = Receipts()
        old = receipts.expect("old")
        receipts.clear()
        self.assertEqual(len(receipts), 0)
        self.assertEqual(receipts.settle(old, 1, 200, ""), [])
        first, second = receipts.expect("a"), receipts.expect("b")
        self.assertEqual(receipts.settle(second, 3, 200, ""), [])
        self.assertEqual(receipts.settle(first, 2, 200, ""), [first, second])
        self.assertEqual(len(receipts), 0)

    def test_containersMadeOnFirstUse(self) -> None:
        """
        A connection's offers, letters held, replaying and history streams
        and range reads are made on first use and keep what is put in them;
        its subscriptions count offers only once it has some.
        """
        connection = Connection(InMemorySession("a"), "a", 0.0)
        self.assertEqual((connection.subscriptions(), connection.held_count()), (0, 0))
        letter = Letter(7, Kind.MAILBOX, "b", "a", "subject", "", [b"x"])
        connection.held[letter.id] = letter
        connection.history.add("history")
        connection.replaying.add("replay")
        connection.offers.setdefault("echo", set()).add("ping.*")
        self.assertEqual(connection.held, {7: letter})
        self.assertEqual(connection.held_count(), 1)
        self.assertEqual(connection.history, {"history"})
        self.assertEqual(connection.replaying, {"replay"})
        self.assertEqual(connection.offers, {"echo": {"ping.*"}})
        self.assertEqual(connection.ranges, {})
        self.assertIs(connection.ranges, connection.ranges)
        self.assertEqual(connection.subscriptions(), 1)
