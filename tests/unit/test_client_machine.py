"""
Tests for L{malamute_pack.client.machine}: the client's state table, applied
by a L{CommandChannel} with an in-memory owner. Every row is walked (each
from a state the channel reached through its inputs, its event produced by
an input); every (state, event) pair without a row is listed with the
reason it cannot happen, and random walks of inputs, guarded as the core
guards them, visit every row and never such a pair. The same for the
fail-over table (several endpoints), with its own setups and unreachable
pairs.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client import channel as channel_module
from malamute_pack.client.channel import CommandChannel, UnreachableEvent
from malamute_pack.client.endpoints import NOT_ACTIVE
from malamute_pack.client.machine import (
    FAILOVER_MACHINE,
    HOLDING,
    LISTENING,
    MACHINE,
    NOTIFICATIONS,
    USABLE,
    WATCHED,
    Action,
    ClientState,
    Event,
)
from malamute_pack.client.subscriptions import ReplayStep
from malamute_pack.protocol import mlm
from tests.unit.test_client_channel import Harness, Outcomes

S = ClientState
E = Event

_FROM_BROKER: Final = frozenset(
    {
        E.OPEN_OK,
        E.OPEN_REFUSED,
        E.OPEN_INVALID,
        E.OK,
        E.REFUSED,
        E.INVALID,
        E.CLOSE_OK,
        E.CLOSE_ERROR,
        E.STRAY_OK,
        E.STRAY_ERROR,
    }
)
_OPEN_ANSWERS: Final = frozenset({E.OPEN_OK, E.OPEN_REFUSED, E.OPEN_INVALID})
_CLOSE_ANSWERS: Final = frozenset({E.CLOSE_OK, E.CLOSE_ERROR})
_STRAYS: Final = frozenset({E.STRAY_OK, E.STRAY_ERROR})
_COMMAND_ANSWERS: Final = frozenset({E.OK, E.REFUSED})
_FAILOVER_ONLY: Final = frozenset(
    {
        E.NOT_ACTIVE,
        E.NO_ANSWER,
        E.LOST,
        E.UNCONNECTED,
        E.MOVE_ON,
        E.ROUND_FAILED,
        E.BACKED_OFF,
    }
)


def _because(reason: str, *groups: frozenset[Event] | Event) -> dict[Event, str]:
    events: set[Event] = set()
    for group in groups:
        events |= group if isinstance(group, frozenset) else {group}
    return dict.fromkeys(events, reason)


_NO_DEADLINE = "the deadline is set only in CONNECTING and CLOSING"
_NO_NEXT = "NEXT is raised only by rows that lead to CONNECTED"
_NO_REPLAYED = "REPLAYED is raised only while RECONNECTING"
_NOT_WATCHED = "silence counts only in WATCHED states"
_ONE_ENDPOINT = "raised with several endpoints only (FAILOVER_MACHINE)"

# Every (state, event) without a row, and why it cannot happen.
UNREACHABLE: Final[dict[ClientState, dict[Event, str]]] = {
    S.START: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because("the core drops input unread before connect()", _FROM_BROKER),
        **_because(_NOT_WATCHED, E.SILENCE),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CONNECTING: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because(
            "CONNECTION_OPEN is outstanding until CONNECTING ends",
            _COMMAND_ANSWERS,
            E.INVALID,
            _CLOSE_ANSWERS,
            _STRAYS,
        ),
        **_because("not watched: the connect timeout (DEADLINE) stands for it", E.SILENCE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CONNECTED: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because(
            "nothing is outstanding in CONNECTED", _OPEN_ANSWERS, _COMMAND_ANSWERS, _CLOSE_ANSWERS
        ),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CONFIRMING: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because(
            "an application's command is outstanding in CONFIRMING",
            _OPEN_ANSWERS,
            _CLOSE_ANSWERS,
            _STRAYS,
        ),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because("the queue goes on from CONNECTED (" + _NO_NEXT + ")", E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.RECONNECTING: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because(
            "CONNECTION_OPEN or a replayed setting is outstanding in RECONNECTING",
            _CLOSE_ANSWERS,
            _STRAYS,
        ),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
    },
    S.DISCONNECTED: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because(
            "nothing is outstanding in DISCONNECTED",
            _OPEN_ANSWERS,
            _COMMAND_ANSWERS,
            _CLOSE_ANSWERS,
        ),
        **_because("HEARD makes it CONNECTED before the answer is handled", _STRAYS),
        **_because(_NOT_WATCHED, E.SILENCE),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CLOSING: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because("no CONNECTION_OPEN goes out while closing", _OPEN_ANSWERS),
        **_because("while closing, PROCEED_TO_CLOSE sends the queued commands", E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CLOSED: {
        **_because(_ONE_ENDPOINT, _FAILOVER_ONLY),
        **_because("the core drops input unread once closed", _FROM_BROKER),
        **_because(_NOT_WATCHED, E.SILENCE),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
}


_NO_SHARE = "an endpoint's share of the connect timeout runs only in CONNECTING"
_NO_FOLLOW_UP = "FAIL_OVER raises it, and its rows lead to CONNECTING or RECONNECTING"
_NO_BACK_OFF = "the back-off runs only in CONNECTING and DISCONNECTED (leaving them cancels it)"
_NO_GRACE = (
    "only connect()'s or a reopen's CONNECTION_OPEN waits for a connection (in CONNECTING or "
    "RECONNECTING; leaving them cancels the grace)"
)
_FAILOVER_TIMERS: Final = {
    **_because(_NO_SHARE, E.NO_ANSWER),
    **_because(_NO_GRACE, E.UNCONNECTED),
    **_because(_NO_FOLLOW_UP, E.MOVE_ON, E.ROUND_FAILED),
    **_because(_NO_BACK_OFF, E.BACKED_OFF),
}


def _failover_unreachable(state: ClientState, *with_row: Event) -> dict[Event, str]:
    """The single table's reasons for C{state}, the fail-over events without a row added."""
    kept = {e: r for e, r in UNREACHABLE[state].items() if e not in _FAILOVER_ONLY}
    return {**kept, **{e: r for e, r in _FAILOVER_TIMERS.items() if e not in with_row}}


_DROPPED = "the core drops input unread before connect() and once closed"

# The same for the fail-over table.
FAILOVER_UNREACHABLE: Final[dict[ClientState, dict[Event, str]]] = {
    S.START: {**_failover_unreachable(S.START), E.NOT_ACTIVE: _DROPPED, E.LOST: _DROPPED},
    S.CONNECTING: _failover_unreachable(
        S.CONNECTING, E.NO_ANSWER, E.UNCONNECTED, E.MOVE_ON, E.ROUND_FAILED, E.BACKED_OFF
    ),
    S.CONNECTED: _failover_unreachable(S.CONNECTED),
    S.CONFIRMING: _failover_unreachable(S.CONFIRMING),
    S.RECONNECTING: _failover_unreachable(S.RECONNECTING, E.UNCONNECTED, E.MOVE_ON, E.ROUND_FAILED),
    S.DISCONNECTED: _failover_unreachable(S.DISCONNECTED, E.BACKED_OFF),
    S.CLOSING: _failover_unreachable(S.CLOSING),
    S.CLOSED: {**_failover_unreachable(S.CLOSED), E.NOT_ACTIVE: _DROPPED, E.LOST: _DROPPED},
}

# Ways to bring a new channel into a state.


def _connecting(h: Harness) -> None:
    h.channel.connect(Outcomes())


def _confirming(h: Harness) -> None:
    h.connected()
    h.channel.command(mlm.StreamWrite("s"), Outcomes())


def _confirming_with_queue(h: Harness) -> None:
    _confirming(h)
    h.channel.command(mlm.StreamWrite("t"), Outcomes())


def _reconnecting(h: Harness) -> None:
    h.connected()
    h.error(mlm.COMMAND_INVALID)


def _replaying(h: Harness) -> None:
    h.owner.plan = [ReplayStep(mlm.StreamWrite("s"))]
    _reconnecting(h)
    h.ok()


def _disconnected(h: Harness) -> None:
    h.connected()
    h.channel.silence()


def _closing_commands(h: Harness) -> None:
    _confirming(h)
    h.channel.close(Outcomes())


def _closing_stored(h: Harness) -> None:
    h.connected()
    h.owner.awaiting = True
    h.channel.close(Outcomes())


def _closing_said(h: Harness) -> None:
    h.connected()
    h.channel.close(Outcomes())


def _closed(h: Harness) -> None:
    _closing_said(h)
    h.ok()


Setup = Callable[[Harness], None]

_SETUPS: Final[dict[ClientState, Setup]] = {
    S.START: lambda h: None,
    S.CONNECTING: _connecting,
    S.CONNECTED: Harness.connected,
    S.CONFIRMING: _confirming,
    S.RECONNECTING: _reconnecting,
    S.DISCONNECTED: _disconnected,
    S.CLOSING: _closing_said,
    S.CLOSED: _closed,
}
# Rows that need a particular situation within their state (or, for the
# follow-up events, the state before the one that raises them).
_SETUP_FOR_ROW: Final[dict[tuple[ClientState, Event], Setup]] = {
    (S.CONNECTED, E.NEXT): _confirming_with_queue,
    (S.RECONNECTING, E.OK): _replaying,
    (S.RECONNECTING, E.REFUSED): _replaying,
    (S.RECONNECTING, E.INVALID): _replaying,
    (S.RECONNECTING, E.REPLAYED): _replaying,
    (S.CLOSING, E.OK): _closing_commands,
    (S.CLOSING, E.REFUSED): _closing_commands,
    (S.CLOSING, E.SENDS_STORED): _closing_stored,
    (S.CLOSING, E.STRAY_OK): _closing_stored,
    (S.CLOSING, E.STRAY_ERROR): _closing_stored,
    (S.CLOSING, E.INVALID): _closing_stored,
}
_FOLLOW_UPS: Final = frozenset({E.NEXT, E.REPLAYED, E.MOVE_ON, E.ROUND_FAILED})

_PAIR: Final = ("tcp://a:9999", "tcp://b:9999")


def _not_active(h: Harness) -> None:
    h.error(NOT_ACTIVE)


def _connecting_second(h: Harness) -> None:
    """CONNECTING, the first endpoint having refused: the next refusal ends the round."""
    _connecting(h)
    _not_active(h)


def _connecting_backing_off(h: Harness) -> None:
    _connecting_second(h)
    _not_active(h)


def _reconnecting_second(h: Harness) -> None:
    """RECONNECTING on the second endpoint: its refusal ends the round."""
    h.connected()
    _not_active(h)


def _connecting_last_share(h: Harness) -> None:
    """CONNECTING on the second endpoint, silence having left the first: its share ends last."""
    _connecting(h)
    h.deadline()


def _failover_disconnected(h: Harness) -> None:
    _reconnecting_second(h)
    _not_active(h)


def _connecting_unlinked(h: Harness) -> None:
    """CONNECTING, with no connection up to take CONNECTION_OPEN: the grace runs."""
    h.owner.linked = False
    _connecting(h)


def _reconnecting_unlinked(h: Harness) -> None:
    """RECONNECTING on the second endpoint after the first's connection broke; none up yet."""
    h.connected()
    h.owner.linked = False
    h.channel.connection_lost()


_FAILOVER_SETUPS: Final[dict[ClientState, Setup]] = {
    **_SETUPS,
    S.DISCONNECTED: _failover_disconnected,
}
_FAILOVER_SETUP_FOR_ROW: Final[dict[tuple[ClientState, Event], Setup]] = {
    **_SETUP_FOR_ROW,
    (S.CONNECTING, E.ROUND_FAILED): _connecting_second,
    (S.CONNECTING, E.BACKED_OFF): _connecting_backing_off,
    (S.RECONNECTING, E.ROUND_FAILED): _reconnecting_second,
    (S.CONNECTING, E.DEADLINE): _connecting_last_share,
    (S.CONNECTING, E.UNCONNECTED): _connecting_unlinked,
    (S.RECONNECTING, E.UNCONNECTED): _reconnecting_unlinked,
}


def _sends_stored(h: Harness) -> None:
    h.owner.awaiting = False
    h.channel.sends_stored()


# The input that produces each event (from the situation the setup made).
_TRIGGERS: Final[dict[Event, Setup]] = {
    E.CONNECT: lambda h: h.channel.connect(Outcomes()),
    E.COMMAND: lambda h: h.channel.command(mlm.StreamWrite("x"), Outcomes()),
    E.CLOSE: lambda h: h.channel.close(Outcomes()),
    **dict.fromkeys((E.OPEN_OK, E.OK, E.CLOSE_OK, E.STRAY_OK, E.NEXT, E.REPLAYED), Harness.ok),
    **dict.fromkeys(
        (E.OPEN_REFUSED, E.REFUSED, E.CLOSE_ERROR, E.STRAY_ERROR),
        lambda h: h.error(mlm.FAILED),
    ),
    **dict.fromkeys((E.OPEN_INVALID, E.INVALID), lambda h: h.error(mlm.COMMAND_INVALID)),
    E.SILENCE: lambda h: h.channel.silence(),
    E.DEADLINE: Harness.deadline,
    E.HEARD: lambda h: h.channel.heard(mlm.ConnectionPong()),
    E.SENDS_STORED: _sends_stored,
    **dict.fromkeys((E.NOT_ACTIVE, E.MOVE_ON, E.ROUND_FAILED), _not_active),
    **dict.fromkeys((E.NO_ANSWER, E.BACKED_OFF, E.UNCONNECTED), Harness.deadline),
    E.LOST: lambda h: h.channel.connection_lost(),
}


class TableTests(SynchronousTestCase):
    def test_everyRowWalked(self) -> None:
        """
        For every row: a channel brought into its state through its inputs,
        given the input that makes the row's event, takes that row to the
        row's next state.
        """
        for (state, event), row in MACHINE.items():
            h = Harness()
            _SETUP_FOR_ROW.get((state, event), _SETUPS[state])(h)
            if event not in _FOLLOW_UPS:
                self.assertIs(h.channel.state, state, (state, event))
            h.transitions.clear()
            _TRIGGERS[event](h)
            self.assertIn((state, event, row.next), h.transitions, (state, event))

    def test_unreachablePairsListed(self) -> None:
        """
        The pairs without a row are exactly those listed with a reason
        (besides the notifications, which mean nothing where they have none).
        """
        without_row = {
            (state, event)
            for state in ClientState
            for event in Event
            if event not in NOTIFICATIONS and (state, event) not in MACHINE
        }
        listed = {(state, event) for state, events in UNREACHABLE.items() for event in events}
        self.assertEqual(without_row, listed)

    def test_unreachablePairRaises(self) -> None:
        """An event in a state without its row is a bug the channel reports."""
        h = Harness()
        self.assertRaises(UnreachableEvent, h.channel._dispatch, E.OPEN_OK, None)

    def test_notificationWithoutRowIgnored(self) -> None:
        """A notification where the table has no row for it changes nothing."""
        h = Harness()
        h.connected()
        h.channel.sends_stored()
        h.channel.heard(mlm.ConnectionPong())
        self.assertIs(h.channel.state, S.CONNECTED)

    def test_everyActionUsed(self) -> None:
        """Every action is in some row of one table or the other."""
        rows = [*MACHINE.values(), *FAILOVER_MACHINE.values()]
        used = {action for row in rows for action in row.actions}
        self.assertEqual(used, set(Action))

    def test_missingActionFailsAtImport(self) -> None:
        """A table action without its method is reported by the import-time check."""

        class Broken(CommandChannel):
            _action_flush = None  # type: ignore[assignment]

        self.assertRaises(ImportError, channel_module._check_actions, Broken)
        channel_module._check_actions(CommandChannel)

    def test_stateSets(self) -> None:
        """
        USABLE and HOLDING are disjoint and neither includes CLOSING; every
        WATCHED state is LISTENING.
        """
        self.assertFalse(USABLE & HOLDING)
        self.assertNotIn(S.CLOSING, USABLE | HOLDING)
        self.assertLessEqual(WATCHED, LISTENING)


class FailoverTableTests(SynchronousTestCase):
    """The fail-over table, applied by a channel with two endpoints."""

    def test_everyRowWalked(self) -> None:
        """
        For every row of the fail-over table: a channel with two endpoints,
        brought into its state through its inputs, given the input that
        makes the row's event, takes that row to the row's next state.
        """
        for (state, event), row in FAILOVER_MACHINE.items():
            h = Harness(_PAIR)
            _FAILOVER_SETUP_FOR_ROW.get((state, event), _FAILOVER_SETUPS[state])(h)
            if event not in _FOLLOW_UPS:
                self.assertIs(h.channel.state, state, (state, event))
            h.transitions.clear()
            _TRIGGERS[event](h)
            self.assertIn((state, event, row.next), h.transitions, (state, event))

    def test_unreachablePairsListed(self) -> None:
        """The fail-over table's pairs without a row are exactly those listed with a reason."""
        without_row = {
            (state, event)
            for state in ClientState
            for event in Event
            if event not in NOTIFICATIONS and (state, event) not in FAILOVER_MACHINE
        }
        listed = {
            (state, event) for state, events in FAILOVER_UNREACHABLE.items() for event in events
        }
        self.assertEqual(without_row, listed)

    def test_oneEndpointKeepsTheTable(self) -> None:
        """
        The fail-over table is the single one with rows changed or added
        for the fail-over events only where fail-over differs; a 503 with
        one endpoint is an ordinary refusal.
        """
        changed = {key for key, row in FAILOVER_MACHINE.items() if MACHINE.get(key) != row}
        self.assertEqual({key for key in MACHINE if key not in FAILOVER_MACHINE}, set())
        self.assertEqual(
            {event for _, event in changed} - _FAILOVER_ONLY,
            {E.CONNECT, E.OPEN_OK, E.SILENCE},
        )
        h = Harness()
        h.connected()
        h.channel.command(mlm.StreamWrite("s"), Outcomes())
        _not_active(h)
        self.assertEqual(h.transitions[-1], (S.CONFIRMING, E.REFUSED, S.CONNECTED))


class RandomWalkTests(SynchronousTestCase):
    def test_failoverWalksVisitEveryRowAndNoOther(self) -> None:
        """
        With two endpoints, random sequences of every input (ERROR 503
        among them) never meet a pair without a row of the fail-over
        table, and together take every row.
        """
        rng = random.Random(11)
        visited: set[tuple[ClientState, Event]] = set()
        for _ in range(1000):
            h = Harness(_PAIR)
            for _ in range(40):
                self._step(h, rng)
            visited |= {(before, event) for before, event, _ in h.transitions}
        self.assertEqual(set(FAILOVER_MACHINE) - visited, set())

    def test_walksVisitEveryRowAndNoOther(self) -> None:
        """
        Random sequences of every input (broker input only while LISTENING,
        silence only while WATCHED, as the core does) never meet a pair
        without a row, and together take every row.
        """
        rng = random.Random(7)
        visited: set[tuple[ClientState, Event]] = set()
        for _ in range(400):
            h = Harness()
            for _ in range(40):
                self._step(h, rng)
            visited |= {(before, event) for before, event, _ in h.transitions}
        self.assertEqual(set(MACHINE) - visited, set())

    def _step(self, h: Harness, rng: random.Random) -> None:
        channel = h.channel
        listening = channel.state in LISTENING
        kind = rng.choice(
            [
                "connect",
                "command",
                "close",
                "ok",
                "error",
                "invalid",
                "pong",
                "silence",
                "deadline",
                "send",
                "stored",
                "plan",
            ]
            + ["ok"] * 3
            + (["not_active"] * 2 + ["lost", "link"] if h.ring.several else [])
        )
        if kind == "connect":
            channel.connect(Outcomes())
        elif kind == "command":
            channel.command(mlm.StreamWrite("s"), Outcomes())
        elif kind == "close":
            channel.close(Outcomes())
        elif kind in ("ok", "error", "invalid", "pong", "not_active") and listening:
            message: mlm.Message = {
                "ok": mlm.Ok(),
                "error": mlm.Error(mlm.FAILED, ""),
                "invalid": mlm.Error(mlm.COMMAND_INVALID, ""),
                "pong": mlm.ConnectionPong(),
                "not_active": mlm.Error(NOT_ACTIVE, "not active"),
            }[kind]
            channel.heard(message)
            if isinstance(message, mlm.Ok):
                channel.ok(message)
            elif isinstance(message, mlm.Error):
                channel.error(message)
        elif kind == "silence" and channel.state in WATCHED:
            channel.silence()
        elif kind == "lost" and listening:
            h.owner.linked = False
            channel.connection_lost()
        elif kind == "link" and not h.owner.linked:
            # The connection comes up again: a CONNECTION_OPEN waiting for it goes.
            h.owner.linked = True
            if listening:
                channel.connection_made()
        elif kind == "deadline" and h.ring.several:
            # Time passes: an endpoint's share and the connect timeout run on the clock.
            when = channel.wakeup_at()
            if when is not None:
                h.clock.advance(max(0.0, when - h.clock.seconds()))
                channel.on_time(h.clock.seconds())
        elif kind == "deadline":
            channel.on_time(channel.wakeup_at() or 0.0)
        elif kind == "send" and channel.state in USABLE:
            h.owner.awaiting = True  # a send on the wire, waiting for its STORED
        elif kind == "stored" and listening and h.owner.awaiting:
            h.owner.awaiting = False
            channel.heard(mlm.Stored(1, "", mlm.SUCCESS, ""))
            channel.sends_stored()
        elif kind == "plan":
            h.owner.plan = [
                ReplayStep(mlm.StreamReadFrom("s", "", mlm.SEQUENCE, 2), mlm.StreamRead("s", ""))
            ] * rng.randrange(3)
