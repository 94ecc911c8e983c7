"""
Tests for L{malamute_pack.broker.machine}: the broker's state table walked
row by row on a real broker with in-memory sessions (each row's actions run
and its next state is the state the session ends in), every pair of state
and event without a row of its own, and the binding of actions at import.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.broker.broker import Broker, BrokerConfig, check_actions
from malamute_pack.broker.machine import (
    EXPIRED,
    MACHINE,
    REPLACED,
    TAKEN_OVER,
    Action,
    AnyOther,
    EventType,
    Expired,
    InternalEvent,
    Malformed,
    Rejected,
    Replaced,
    Row,
    State,
    TakenOver,
    Unresponsive,
    row,
)
from malamute_pack.protocol import chunks, mlm
from tests.memory_session import InMemorySession

# Every kind of event a session can meet: each message class and each internal event.
EVENT_TYPES: list[EventType] = [
    *mlm.MESSAGE_TYPES.values(),
    Expired,
    TakenOver,
    Replaced,
    Malformed,
    Rejected,
    Unresponsive,
]

# Pairs no session can ever be in, and why: the broker fires internal events
# only on open connections, and a connection that ended is out of the
# registry, so its session is looked up as START again.
UNREACHABLE: dict[tuple[State, EventType], str] = {
    (State.START, Expired): "only open connections are expired",
    (State.START, TakenOver): "only an open connection holds an address",
    (State.START, Replaced): "only an open connection is replaced",
    **{(State.GONE, event): "a GONE connection is out of the registry" for event in EVENT_TYPES},
}

# Commands that the model refuses on a fresh connection (nothing delivered
# to answer), which the table still names.
# Refused on a fresh connection of a broker without a journal: a CONFIRM or
# DONE for nothing held, and the bulk reads (which need the journal).
REFUSED_WHEN_FRESH = {
    mlm.Confirm,
    mlm.Done,
    mlm.StreamQuery,
    mlm.StreamReadRange,
    mlm.StreamConsume,  # consumers need the journal: ERROR 501
}


def sample(event_type: EventType) -> mlm.Message | InternalEvent:
    """An event of C{event_type} that the broker can act on."""
    samples: dict[EventType, mlm.Message | InternalEvent] = {
        Expired: EXPIRED,
        TakenOver: TAKEN_OVER,
        Replaced: REPLACED,
        Malformed: Malformed("unknown message id 99"),
        Rejected: Rejected(mlm.StreamRead("s", ""), "message too large"),
        Unresponsive: Unresponsive("it does not read its answers"),
        mlm.ConnectionOpen: mlm.ConnectionOpen(version=2, address="again"),
        mlm.StreamWrite: mlm.StreamWrite("s"),
        mlm.StreamRead: mlm.StreamRead("s", ""),
        mlm.StreamReadFrom: mlm.StreamReadFrom("s", "", mlm.LATEST, 0),
        mlm.StreamCancel: mlm.StreamCancel("s"),
        mlm.StreamSend: mlm.StreamSend("subject", [b"x"]),
        mlm.MailboxSend: mlm.MailboxSend("bob", "subject", "", 0, [b"x"]),
        mlm.ServiceSend: mlm.ServiceSend("svc", "subject", "", 0, [b"x"]),
        mlm.ServiceOffer: mlm.ServiceOffer("svc", ""),
        mlm.Credit: mlm.Credit(5),
        mlm.StreamAppend: mlm.StreamAppend("s", "k", [chunks.encode_append([("a", [b"x"])])]),
    }
    if event_type in samples:
        return samples[event_type]
    assert issubclass(event_type, mlm.Message), event_type
    return event_type()


class TableWalk(SynchronousTestCase):
    def setUp(self) -> None:
        self.broker = Broker(Clock(), BrokerConfig(timeout=5.0))

    def session_in(self, state: State) -> InMemorySession:
        session = InMemorySession(f"in-{state.value}")
        if state is State.CONNECTED:
            self.broker.receive(session, mlm.ConnectionOpen(version=2, address="me"))
            self.broker.receive(session, mlm.StreamWrite("s"))
            session.take()
        return session

    def walk(self, state: State, event_type: EventType, expected: Row) -> None:
        session = self.session_in(state)
        before = self.broker.registry.get(session)
        refused = self.broker.counters.refused
        self.broker.receive(session, sample(event_type))
        label = f"({state.value}, {event_type.__name__})"
        was_refused = self.broker.counters.refused > refused
        refuses = Action.REFUSE_REJECTED in expected.actions
        self.assertEqual(
            was_refused,
            refuses or (state is State.CONNECTED and event_type in REFUSED_WHEN_FRESH),
            label,
        )
        after = self.broker.registry.get(session)
        ended = before is not None and after is not before
        if was_refused:
            self.assertIs(after, before, label)
            self.assertIs(expected.next, state, label)
        elif expected.next is State.CONNECTED:
            assert after is not None, label
            self.assertIs(after.state, State.CONNECTED, label)
        elif expected.next is State.GONE:
            assert before is not None, label
            self.assertIsNone(after, label)
            self.assertIs(before.state, State.GONE, label)
        else:
            self.assertIsNone(after, label)
        said = {s.what for s in session.take()}
        actions = set(expected.actions)
        if not was_refused:
            self.assertEqual("ok" in said, Action.REPLY_OK in actions, label)
            self.assertEqual("pong" in said, Action.REPLY_PONG in actions, label)
            replies_error = actions & {Action.REPLY_INVALID, Action.REPLY_MALFORMED}
            self.assertEqual("error" in said, bool(replies_error), label)
            # A connection ends by deregistering, or by being replaced by a new OPEN.
            replaced = state is State.CONNECTED and Action.REGISTER in actions
            self.assertEqual(ended, Action.DEREGISTER in actions or replaced, label)
            if ended:
                assert before is not None
                self.assertIs(before.state, State.GONE, label)
        elif refuses:
            self.assertEqual(said, {"error"}, label)  # the oversized command has a reply

    def test_everyRow(self) -> None:
        """
        Every row of the table, run on a session in its state, runs its
        actions (answers as they say, ends the connection exactly when they
        deregister) and leaves the session in the row's next state.
        """
        for (state, event_type), expected in MACHINE.items():
            if event_type is AnyOther:
                continue
            self.walk(state, event_type, expected)

    def test_everyOtherPair(self) -> None:
        """
        Every reachable pair of state and event without a row of its own
        runs its state's row for any other event: ERROR 500, and in
        CONNECTED the end of the connection (a client that sends what only
        a broker sends is in violation).
        """
        for state in (State.START, State.CONNECTED):
            for event_type in EVENT_TYPES:
                if (state, event_type) in MACHINE or (state, event_type) in UNREACHABLE:
                    continue
                self.assertIs(row(state, event_type), MACHINE[(state, AnyOther)])
                self.walk(state, event_type, MACHINE[(state, AnyOther)])

    def test_unreachablePairs(self) -> None:
        """
        The pairs listed as unreachable have no row, GONE has no rows at
        all, and the situations that would reach them do not: a closed
        connection that stays silent past the timeout is not expired, and
        a session whose connection ended is a stranger (START) again.
        """
        for state, event_type in UNREACHABLE:
            self.assertNotIn((state, event_type), MACHINE)
        self.assertFalse([key for key in MACHINE if key[0] is State.GONE])
        clock = Clock()
        broker = Broker(clock, BrokerConfig(timeout=1.0))
        broker.start()
        self.addCleanup(broker.stop)
        session = InMemorySession("closing")
        broker.receive(session, mlm.ConnectionOpen(address="a"))
        broker.receive(session, mlm.ConnectionClose())
        clock.advance(5.0)
        self.assertEqual(broker.counters.expired_clients, 0)
        session.take()
        broker.receive(session, mlm.ConnectionPing())
        [said] = session.take()
        self.assertEqual((said.what, said.values[0]), ("error", mlm.COMMAND_INVALID))

    def test_everyStateHasAFallback(self) -> None:
        """START and CONNECTED each have a row for any other event."""
        for state in (State.START, State.CONNECTED):
            self.assertIn((state, AnyOther), MACHINE)

    def test_refusalKeepsTheState(self) -> None:
        """
        An action that refuses stops its row: the later actions do not run
        and the state does not change (an OPEN with an address too long
        leaves a stranger a stranger, with ERROR and no OK).
        """
        session = InMemorySession("long")
        self.broker.receive(session, mlm.ConnectionOpen(address="x" * 300))
        self.assertEqual([s.what for s in session.take()], ["error"])
        self.assertIsNone(self.broker.registry.get(session))


class BindingTests(SynchronousTestCase):
    def test_everyActionHasAMethod(self) -> None:
        """Every L{Action} is bound to a broker method (checked at import, and here)."""
        check_actions(Broker)
        for action in Action:
            self.assertTrue(callable(getattr(Broker, f"action_{action.value}")), action)

    def test_missingMethodFailsTheCheck(self) -> None:
        """A broker class lacking an action's method fails the check, naming the action."""

        class Incomplete(Broker):
            action_credit = None  # type: ignore[assignment]

        with self.assertRaises(ImportError) as raised:
            check_actions(Incomplete)
        self.assertIn("credit", str(raised.exception))

    def test_everyActionIsUsed(self) -> None:
        """Every action appears in some row: the enumeration has no dead entries."""
        used = {action for entry in MACHINE.values() for action in entry.actions}
        self.assertEqual(used, set(Action))
