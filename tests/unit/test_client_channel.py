"""
Tests for L{malamute_pack.client.channel}: the command channel driven with
a L{Clock} and an in-memory owner (L{ChannelRecorder}) that records what
the channel's actions asked of the rest of the client. The walk of the
whole state table is in ``tests/unit/test_client_machine.py``; here, what the
engine guarantees around it: one command at a time, callbacks that see the
next state, events raised from callbacks, replay and close.
"""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.channel import CommandChannel
from malamute_pack.client.endpoints import EndpointRing
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
)
from malamute_pack.client.machine import ClientState, Event
from malamute_pack.client.options import ClientOptions
from malamute_pack.client.subscriptions import ReplayStep, Setting
from malamute_pack.protocol import mlm

Transition = tuple[ClientState, Event, ClientState]


class ChannelRecorder:
    """The channel's owner: the other parts of a client, reduced to records."""

    def __init__(self) -> None:
        self.sent: list[mlm.Message] = []
        self.pinging = False
        self.flushes = 0
        self.regrants = 0
        self.forgets = 0
        self.recorded: list[Setting] = []
        self.plan: list[ReplayStep] = []
        self.resends = 0
        self.awaiting = False
        self.sends_dropped = 0
        self.connected_to: list[str] = []
        self.linked = True  # whether the connection is up, for try_send

    def take(self) -> list[mlm.Message]:
        """What was sent since the last call."""
        sent, self.sent = self.sent, []
        return sent

    def send_frames(self, frames: list[bytes]) -> None:
        self.sent.append(mlm.decode(frames))

    def try_send(self, frames: list[bytes]) -> bool:
        """Sent if the connection is up (C{linked})."""
        if self.linked:
            self.send_frames(frames)
        return self.linked

    def start_heartbeat(self) -> None:
        self.pinging = True

    def stop_heartbeat(self) -> None:
        self.pinging = False

    def flush(self) -> None:
        self.flushes += 1

    def regrant_credit(self) -> None:
        self.regrants += 1

    def forget_given_back(self) -> None:
        self.forgets += 1

    def record_setting(self, setting: Setting) -> None:
        self.recorded.append(setting)

    def replay_plan(self) -> list[ReplayStep]:
        return list(self.plan)

    def resend_unstored(self) -> None:
        self.resends += 1
        self.awaiting = False  # they are held again

    def awaiting_stored(self) -> bool:
        return self.awaiting

    def drop_sends(self) -> None:
        self.sends_dropped += 1
        self.awaiting = False

    def connect_to(self, endpoint: str) -> None:
        self.connected_to.append(endpoint)


class Outcomes:
    """A completion callback that keeps its outcomes, in order."""

    def __init__(self) -> None:
        self.outcomes: list[ClientError | None] = []

    def __call__(self, result: ClientError | None) -> None:
        self.outcomes.append(result)


class Harness:
    """
    A channel for "me" (timeout 5 s, close timeout 1 s), its owner and its
    transitions; with C{endpoints}, failing over between them.
    """

    def __init__(self, endpoints: tuple[str, ...] = ()) -> None:
        self.clock = Clock()
        self.owner = ChannelRecorder()
        self.ring = EndpointRing(endpoints)
        self.channel = CommandChannel(self.clock, self.owner, ClientOptions("me"), self.ring)
        self.transitions: list[Transition] = []
        self.channel.observer = self.observe

    def observe(self, before: ClientState, event: Event, after: ClientState) -> None:
        self.transitions.append((before, event, after))

    def connected(self) -> None:
        self.channel.connect(Outcomes())
        self.channel.ok()
        self.owner.take()

    def ok(self) -> None:
        self.channel.ok(mlm.Ok())

    def error(self, code: int) -> None:
        self.channel.error(mlm.Error(code, f"status {code}"))

    def deadline(self) -> None:
        """Let the connect or close timeout pass."""
        when = self.channel.wakeup_at()
        assert when is not None, "no deadline set"
        self.clock.advance(when - self.clock.seconds())
        self.channel.on_time(self.clock.seconds())


class CommandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness()
        self.h.connected()

    def test_oneAtATime(self) -> None:
        """A command waits for the outstanding one's answer; each gets its own result."""
        first, second = Outcomes(), Outcomes()
        self.h.channel.command(mlm.StreamWrite("a"), first)
        self.h.channel.command(mlm.StreamWrite("b"), second)
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("a")])
        self.assertEqual(self.h.channel.queued, 1)
        self.h.ok()
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("b")])
        self.h.error(mlm.FAILED)
        self.assertEqual(first.outcomes, [None])
        [refusal] = second.outcomes
        assert isinstance(refusal, MalamuteError)
        self.assertEqual(refusal.code, mlm.FAILED)
        self.assertEqual(self.h.owner.recorded, [mlm.StreamWrite("a")])
        self.assertIs(self.h.channel.state, ClientState.CONNECTED)

    def test_callbackSeesNextState(self) -> None:
        """
        A command's callback runs once the table's next state is applied
        (and the next queued command sent): CONFIRMING here, not the
        CONFIRMING of the answered command half-way to CONNECTED.
        """
        seen: list[ClientState] = []
        self.h.channel.command(mlm.StreamWrite("a"), lambda _: seen.append(self.h.channel.state))
        self.h.channel.command(mlm.StreamWrite("b"), Outcomes())
        self.h.ok()
        self.assertEqual(seen, [ClientState.CONFIRMING])
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("a"), mlm.StreamWrite("b")])

    def test_commandFromCallback(self) -> None:
        """A command started from another's callback is queued and sent in turn."""
        later = Outcomes()

        def then(result: ClientError | None) -> None:
            self.h.channel.command(mlm.StreamWrite("later"), later)

        self.h.channel.command(mlm.StreamWrite("first"), then)
        self.h.ok()
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("first"), mlm.StreamWrite("later")])
        self.assertIs(self.h.channel.state, ClientState.CONFIRMING)
        self.h.ok()
        self.assertEqual(later.outcomes, [None])

    def test_closeFromCallback(self) -> None:
        """close() from a command's callback closes after it, not in the middle of it."""
        closed = Outcomes()
        self.h.channel.command(mlm.StreamWrite("s"), lambda _: self.h.channel.close(closed))
        self.h.ok()
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("s"), mlm.ConnectionClose()])
        self.assertIs(self.h.channel.state, ClientState.CLOSING)
        self.h.ok()
        self.assertEqual(closed.outcomes, [None])
        self.assertIs(self.h.channel.state, ClientState.CLOSED)

    def test_invalidRetriesOnce(self) -> None:
        """
        A command cut short by ERROR 500 is sent again after the reopen;
        a second ERROR 500 to it is its refusal, not another reopen.
        """
        result = Outcomes()
        self.h.channel.command(mlm.StreamWrite("s"), result)
        self.h.error(mlm.COMMAND_INVALID)
        self.assertEqual(
            self.h.owner.take(), [mlm.StreamWrite("s"), mlm.ConnectionOpen(version=2, address="me")]
        )
        self.h.ok()  # nothing to replay: the cut-short command goes again
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("s")])
        self.h.error(mlm.COMMAND_INVALID)
        [refusal] = result.outcomes
        assert isinstance(refusal, MalamuteError)
        self.assertEqual(refusal.code, mlm.COMMAND_INVALID)
        self.assertEqual(self.h.channel.reconnects, 1)
        self.assertIs(self.h.channel.state, ClientState.CONNECTED)

    def test_silenceFailsWaiting(self) -> None:
        """SILENCE fails the outstanding and queued commands; later ones fail at once."""
        first, second, third = Outcomes(), Outcomes(), Outcomes()
        self.h.channel.command(mlm.StreamWrite("a"), first)
        self.h.channel.command(mlm.StreamWrite("b"), second)
        self.h.channel.silence()
        self.h.channel.command(mlm.StreamWrite("c"), third)
        for outcome in (first, second, third):
            [error] = outcome.outcomes
            self.assertIsInstance(error, BrokerUnreachableError)


class ReplayTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness()
        self.h.connected()
        self.resume = mlm.StreamReadFrom("s", "p", mlm.SEQUENCE, 8)
        self.h.owner.plan = [
            ReplayStep(mlm.StreamWrite("out")),
            ReplayStep(self.resume, fallback=mlm.StreamRead("s", "p")),
        ]

    def test_replayInOrderThenUsable(self) -> None:
        """After the new OPEN's OK: credit again, every step in turn, then usable."""
        self.h.error(mlm.COMMAND_INVALID)
        self.assertEqual(self.h.owner.resends, 1)
        self.h.owner.take()
        self.h.ok()
        self.assertEqual(self.h.owner.regrants, 1)
        self.assertEqual(self.h.owner.take(), [mlm.StreamWrite("out")])
        self.h.ok()
        self.assertEqual(self.h.owner.take(), [self.resume])
        flushes = self.h.owner.flushes
        self.h.ok()
        self.assertIs(self.h.channel.state, ClientState.CONNECTED)
        self.assertEqual(self.h.owner.flushes, flushes + 1)
        self.assertEqual(self.h.owner.recorded, [])  # replays are recorded already

    def test_refusedStepFallsBack(self) -> None:
        """A refused step with a fallback is replaced by it; one without is skipped."""
        self.h.error(mlm.COMMAND_INVALID)
        self.h.ok()
        self.h.error(mlm.FAILED)  # StreamWrite("out"): no fallback
        self.h.error(mlm.NOT_IMPLEMENTED)  # the resume: its fallback
        self.h.ok()
        self.assertEqual(
            self.h.owner.take(),
            [
                mlm.ConnectionOpen(version=2, address="me"),
                mlm.StreamWrite("out"),
                self.resume,
                mlm.StreamRead("s", "p"),
            ],
        )
        self.assertIs(self.h.channel.state, ClientState.CONNECTED)


class CloseTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.h = Harness()
        self.h.connected()

    def test_closeWaitsForStored(self) -> None:
        """
        With sends waiting for STORED, CONNECTION_CLOSE waits (pings stop,
        the close timeout runs) until the last one comes.
        """
        self.h.owner.awaiting = True
        self.h.owner.pinging = True
        closed = Outcomes()
        self.h.channel.close(closed)
        self.assertEqual(self.h.owner.take(), [])
        self.assertFalse(self.h.owner.pinging)
        self.assertEqual(self.h.channel.wakeup_at(), 1.0)
        self.assertFalse(self.h.channel.said_close)
        self.h.owner.awaiting = False
        self.h.channel.sends_stored()
        self.assertEqual(self.h.owner.take(), [mlm.ConnectionClose()])
        self.assertTrue(self.h.channel.said_close)
        self.h.ok()
        self.assertEqual(closed.outcomes, [None])
        self.assertEqual(self.h.owner.sends_dropped, 1)

    def test_closeTimeoutSaysClose(self) -> None:
        """The close timeout with STOREDs still missing: CONNECTION_CLOSE anyway, CLOSED."""
        self.h.owner.awaiting = True
        closed = Outcomes()
        self.h.channel.close(closed)
        self.h.deadline()
        self.assertEqual(self.h.owner.take(), [mlm.ConnectionClose()])
        self.assertEqual(closed.outcomes, [None])
        self.assertIs(self.h.channel.state, ClientState.CLOSED)
        self.assertIsNone(self.h.channel.wakeup_at())

    def test_commandsBeforeCloseFinish(self) -> None:
        """
        close() during a command: CLOSING at once (new commands refused),
        the commands queued before it still go, then CONNECTION_CLOSE.
        """
        first, queued, refused, closed = Outcomes(), Outcomes(), Outcomes(), Outcomes()
        self.h.channel.command(mlm.StreamWrite("a"), first)
        self.h.channel.command(mlm.StreamWrite("b"), queued)
        self.h.channel.close(closed)
        self.assertIs(self.h.channel.state, ClientState.CLOSING)
        self.h.channel.command(mlm.StreamWrite("c"), refused)
        self.assertIsInstance(refused.outcomes[0], ClientClosedError)
        self.h.ok()
        self.h.error(mlm.FAILED)
        self.assertEqual(
            self.h.owner.take(),
            [mlm.StreamWrite("a"), mlm.StreamWrite("b"), mlm.ConnectionClose()],
        )
        self.assertEqual(first.outcomes, [None])
        self.assertIsInstance(queued.outcomes[0], MalamuteError)
        self.assertEqual(self.h.owner.recorded, [mlm.StreamWrite("a")])
        self.h.ok()
        self.assertEqual(closed.outcomes, [None])

    def test_forgottenWhileClosing(self) -> None:
        """
        ERROR 500 while the commands queued before close() still run: the
        broker has nothing of ours to close, so the client is CLOSED and
        those commands fail with ClientClosedError.
        """
        waiting, closed = Outcomes(), Outcomes()
        self.h.channel.command(mlm.StreamWrite("a"), waiting)
        self.h.channel.close(closed)
        self.h.error(mlm.COMMAND_INVALID)
        self.assertIs(self.h.channel.state, ClientState.CLOSED)
        self.assertIsInstance(waiting.outcomes[0], ClientClosedError)
        self.assertEqual(closed.outcomes, [None])

    def test_closeBeforeConnect(self) -> None:
        """close() before connect() completes at once; connect() then is refused."""
        h = Harness()
        closed, opened = Outcomes(), Outcomes()
        h.channel.close(closed)
        h.channel.connect(opened)
        self.assertEqual(closed.outcomes, [None])
        self.assertIsInstance(opened.outcomes[0], ClientClosedError)
        self.assertEqual(h.owner.take(), [])

    def test_connectTimesOut(self) -> None:
        """No answer to CONNECTION_OPEN within the timeout: BrokerUnreachableError, CLOSED."""
        h = Harness()
        opened = Outcomes()
        h.channel.connect(opened)
        self.assertEqual(h.channel.wakeup_at(), 5.0)
        h.deadline()
        self.assertIsInstance(opened.outcomes[0], BrokerUnreachableError)
        self.assertIs(h.channel.state, ClientState.CLOSED)
