"""
Tests for L{malamute_pack.client.machine}: the client's state table, applied
by a L{CommandChannel} with an in-memory owner. Every row is walked (each
from a state the channel reached through its inputs, its event produced by
an input); every (state, event) pair without a row is listed with the
reason it cannot happen, and random walks of inputs, guarded as the core
guards them, visit every row and never such a pair.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Final

from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client import channel as channel_module
from malamute_pack.client.channel import CommandChannel, UnreachableEvent
from malamute_pack.client.machine import (
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
from tests.test_client_channel import Harness, Outcomes

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


def _because(reason: str, *groups: frozenset[Event] | Event) -> dict[Event, str]:
    events: set[Event] = set()
    for group in groups:
        events |= group if isinstance(group, frozenset) else {group}
    return dict.fromkeys(events, reason)


_NO_DEADLINE = "the deadline is set only in CONNECTING and CLOSING"
_NO_NEXT = "NEXT is raised only by rows that lead to CONNECTED"
_NO_REPLAYED = "REPLAYED is raised only while RECONNECTING"
_NOT_WATCHED = "silence counts only in WATCHED states"

# Every (state, event) without a row, and why it cannot happen.
UNREACHABLE: Final[dict[ClientState, dict[Event, str]]] = {
    S.START: {
        **_because("the core drops input unread before connect()", _FROM_BROKER),
        **_because(_NOT_WATCHED, E.SILENCE),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CONNECTING: {
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
        **_because(
            "nothing is outstanding in CONNECTED", _OPEN_ANSWERS, _COMMAND_ANSWERS, _CLOSE_ANSWERS
        ),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CONFIRMING: {
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
        **_because(
            "CONNECTION_OPEN or a replayed setting is outstanding in RECONNECTING",
            _CLOSE_ANSWERS,
            _STRAYS,
        ),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
    },
    S.DISCONNECTED: {
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
        **_because("no CONNECTION_OPEN goes out while closing", _OPEN_ANSWERS),
        **_because("while closing, PROCEED_TO_CLOSE sends the queued commands", E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
    S.CLOSED: {
        **_because("the core drops input unread once closed", _FROM_BROKER),
        **_because(_NOT_WATCHED, E.SILENCE),
        **_because(_NO_DEADLINE, E.DEADLINE),
        **_because(_NO_NEXT, E.NEXT),
        **_because(_NO_REPLAYED, E.REPLAYED),
    },
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
_FOLLOW_UPS: Final = frozenset({E.NEXT, E.REPLAYED})


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
        """Every action is in some row."""
        used = {action for row in MACHINE.values() for action in row.actions}
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


class RandomWalkTests(SynchronousTestCase):
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
        )
        if kind == "connect":
            channel.connect(Outcomes())
        elif kind == "command":
            channel.command(mlm.StreamWrite("s"), Outcomes())
        elif kind == "close":
            channel.close(Outcomes())
        elif kind in ("ok", "error", "invalid", "pong") and listening:
            message: mlm.Message = {
                "ok": mlm.Ok(),
                "error": mlm.Error(mlm.FAILED, ""),
                "invalid": mlm.Error(mlm.COMMAND_INVALID, ""),
                "pong": mlm.ConnectionPong(),
            }[kind]
            channel.heard(message)
            if isinstance(message, mlm.Ok):
                channel.ok(message)
            elif isinstance(message, mlm.Error):
                channel.error(message)
        elif kind == "silence" and channel.state in WATCHED:
            channel.silence()
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
