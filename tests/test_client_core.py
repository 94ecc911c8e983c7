"""
Tests for L{malamute_pack.client.core}: the client's state machine driven
with a L{Clock} and frames built with the MLM codec, no sockets.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from malamute_pack.client.core import ClientCore, ClientState, Done
from malamute_pack.client.errors import (
    BrokerUnreachableError,
    ClientClosedError,
    ClientError,
    MalamuteError,
)
from malamute_pack.client.events import Confirmation, Delivery
from malamute_pack.protocol import mlm

_UNSET = object()


class Recorder:
    """The core's owner: keeps what the core sent and handed over."""

    def __init__(self) -> None:
        self.sent: list[mlm.Message] = []
        self.deliveries: list[Delivery] = []
        self.confirmations: list[Confirmation] = []

    def send_frames(self, frames: list[bytes]) -> None:
        self.sent.append(mlm.decode(frames))

    def delivered(self, delivery: Delivery) -> None:
        self.deliveries.append(delivery)

    def confirmed(self, confirmation: Confirmation) -> None:
        self.confirmations.append(confirmation)

    def take(self) -> list[mlm.Message]:
        """What was sent since the last call."""
        sent, self.sent = self.sent, []
        return sent


class Result:
    """A command's completion callback that remembers its outcome."""

    def __init__(self) -> None:
        self.outcome: object = _UNSET

    def __call__(self, error: ClientError | None) -> None:
        assert self.outcome is _UNSET, "completed twice"
        self.outcome = error

    @property
    def done(self) -> bool:
        return self.outcome is not _UNSET


class CoreTestCase(SynchronousTestCase):
    """A core with address "me", timeout 5 s and heartbeat 1 s on a Clock."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.owner = Recorder()
        self.core = ClientCore(self.clock, self.owner, "me", timeout=5.0, heartbeat=1.0)

    def reply(self, message: mlm.Message) -> None:
        self.core.receive(mlm.encode(message))

    def advance(self, seconds: float, step: float = 0.25) -> None:
        """Move time on in steps, running the core's timers as a driver would."""
        end = self.clock.seconds() + seconds
        while self.clock.seconds() < end - 1e-9:
            self.clock.advance(min(step, end - self.clock.seconds()))
            wakeup = self.core.wakeup_at()
            if wakeup is not None and self.clock.seconds() >= wakeup:
                self.core.on_time()

    def connected(self) -> None:
        result = Result()
        self.core.connect(result)
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.owner.take()

    def setting(self, start: Callable[[Done], None], message: mlm.Message) -> Result:
        """Run one command to its OK; return its result."""
        result = Result()
        start(result)
        self.assertEqual(self.owner.take(), [message])
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        return result


class ConnectTests(CoreTestCase):
    def test_openSentAndOkConnects(self) -> None:
        """connect() sends CONNECTION_OPEN with the address; OK makes it CONNECTED."""
        result = Result()
        self.core.connect(result)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.assertIs(self.core.state, ClientState.CONNECTING)
        self.assertFalse(result.done)
        self.reply(mlm.Ok())
        self.assertIsNone(result.outcome)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_errorFailsConnect(self) -> None:
        """ERROR to CONNECTION_OPEN fails connect() with its code and reason."""
        result = Result()
        self.core.connect(result)
        self.reply(mlm.Error(mlm.FAILED, "too many clients"))
        assert isinstance(result.outcome, MalamuteError)
        self.assertEqual((result.outcome.code, result.outcome.reason), (300, "too many clients"))
        self.assertIs(self.core.state, ClientState.CLOSED)

    def test_connectTimesOut(self) -> None:
        """No answer within the timeout fails connect() with BrokerUnreachableError."""
        result = Result()
        self.core.connect(result)
        self.advance(4.9)
        self.assertFalse(result.done)
        self.advance(0.2)
        self.assertIsInstance(result.outcome, BrokerUnreachableError)
        self.assertIs(self.core.state, ClientState.CLOSED)
        self.assertIsNone(self.core.wakeup_at())

    def test_noPingsWhileConnecting(self) -> None:
        """Nothing but the OPEN is sent before the broker answers it."""
        self.core.connect(Result())
        self.advance(3)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])

    def test_commandsBeforeConnectRefused(self) -> None:
        """A command before connect() fails with ClientClosedError."""
        result = Result()
        self.core.set_producer("s", result)
        self.assertIsInstance(result.outcome, ClientClosedError)
        self.assertRaises(ClientClosedError, self.core.send, "subject", [b"x"])

    def test_heartbeatMustBeBelowTimeout(self) -> None:
        """A heartbeat not below the timeout is refused."""
        self.assertRaises(ValueError, ClientCore, self.clock, self.owner, "", 1.0, 1.0)


class HeartbeatTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()

    def test_pingsEveryHeartbeat(self) -> None:
        """CONNECTION_PING goes out once a heartbeat while the broker answers."""
        for _ in range(3):
            self.advance(1.0)
            self.assertEqual(self.owner.take(), [mlm.ConnectionPing()])
            self.reply(mlm.ConnectionPong())
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_silenceLosesConnection(self) -> None:
        """
        Nothing heard for the timeout: DISCONNECTED, the outstanding and the
        queued commands fail with BrokerUnreachableError, and pings go on.
        """
        first, second = Result(), Result()
        self.core.set_consumer("weather", "", first)
        self.core.set_consumer("news", "", second)
        self.advance(4.9)
        self.assertFalse(first.done)
        self.advance(0.2)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertIsInstance(first.outcome, BrokerUnreachableError)
        self.assertIsInstance(second.outcome, BrokerUnreachableError)
        self.owner.take()
        self.advance(3)
        self.assertEqual(self.owner.take(), [mlm.ConnectionPing()] * 3)

    def test_commandWhileDisconnectedFails(self) -> None:
        """A command while DISCONNECTED fails at once."""
        self.advance(5.1)
        result = Result()
        self.core.set_producer("s", result)
        self.assertIsInstance(result.outcome, BrokerUnreachableError)

    def test_pongResumes(self) -> None:
        """
        A PONG while DISCONNECTED (the broker still knows us) makes the core
        CONNECTED again without replay, and messages held meanwhile go out.
        """
        self.advance(5.1)
        self.core.send("subject", [b"held"])
        self.owner.take()
        self.reply(mlm.ConnectionPong())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.take(), [mlm.StreamSend("subject", [b"held"])])
        self.assertEqual(self.core.reconnects, 0)

    def test_creditWhileDisconnectedSentOnResume(self) -> None:
        """Credit granted while DISCONNECTED goes out when the broker answers again."""
        self.advance(5.1)
        self.core.credit(4)
        self.owner.take()
        self.reply(mlm.ConnectionPong())
        self.assertEqual(self.owner.take(), [mlm.Credit(4)])

    def test_lateOkIgnoredAfterResume(self) -> None:
        """
        The OK of a command that failed on the timeout, arriving late, puts
        the core back to CONNECTED and does not answer a later command.
        """
        self.core.set_producer("s", Result())
        self.advance(5.1)
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        later = Result()
        self.core.set_producer("t", later)
        self.assertFalse(later.done)


class CommandTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()

    def test_oneCommandAtATime(self) -> None:
        """Commands queue behind the outstanding one and go out one by one."""
        results = [Result() for _ in range(3)]
        self.core.set_producer("weather", results[0])
        self.core.set_consumer("news", "^sport", results[1])
        self.core.set_worker("echo", ".*", results[2])
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("weather")])
        self.assertIs(self.core.state, ClientState.CONFIRMING)
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.StreamRead("news", "^sport")])
        self.reply(mlm.Error(mlm.FAILED, "invalid pattern"))
        self.assertEqual(self.owner.take(), [mlm.ServiceOffer("echo", ".*")])
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertIsNone(results[0].outcome)
        assert isinstance(results[1].outcome, MalamuteError)
        self.assertEqual(results[1].outcome.code, mlm.FAILED)
        self.assertIsNone(results[2].outcome)
        # The refused pattern is not replayed.
        self.assertEqual(
            self.core.settings, (mlm.StreamWrite("weather"), mlm.ServiceOffer("echo", ".*"))
        )

    def test_strayReplyIgnored(self) -> None:
        """OK or a non-500 ERROR with no command outstanding changes nothing."""
        self.reply(mlm.Ok())
        self.reply(mlm.Error(mlm.FAILED, "queue full"))
        self.assertIs(self.core.state, ClientState.CONNECTED)
        self.assertEqual(self.owner.take(), [])

    def test_deliveriesPassedOn(self) -> None:
        """Each kind of delivery and a CONFIRM reach the owner, also mid-command."""
        self.core.set_producer("s", Result())
        self.reply(mlm.StreamDeliver("weather", "station", "temp.x", [b"20"]))
        self.reply(mlm.MailboxDeliver("bob", "me", "hi", "t1", [b"a", b"b"]))
        self.reply(mlm.ServiceDeliver("bob", "echo", "ping", "", []))
        self.reply(mlm.Confirm("t9", 200, "thanks"))
        self.assertEqual(
            self.owner.deliveries,
            [
                Delivery("STREAM_DELIVER", "station", "weather", "temp.x", "", (b"20",)),
                Delivery("MAILBOX_DELIVER", "bob", "me", "hi", "t1", (b"a", b"b")),
                Delivery("SERVICE_DELIVER", "bob", "echo", "ping", "", ()),
            ],
        )
        self.assertEqual(self.owner.confirmations, [Confirmation("t9", 200, "thanks")])
        self.assertIs(self.core.state, ClientState.CONFIRMING)

    def test_sends(self) -> None:
        """send, sendto, sendfor, credit and confirm go out as their messages."""
        self.core.send("temp.x", [b"1", b"2"])
        self.core.sendto("bob", "hi", [b"x"], "t1", 500)
        self.core.sendfor("echo", "ping", [], "t2", 0)
        self.core.credit(7)
        self.core.confirm("t3", 300, "no")
        self.assertEqual(
            self.owner.take(),
            [
                mlm.StreamSend("temp.x", [b"1", b"2"]),
                mlm.MailboxSend("bob", "hi", "t1", 500, [b"x"]),
                mlm.ServiceSend("echo", "ping", "t2", 0, []),
                mlm.Credit(7),
                mlm.Confirm("t3", 300, "no"),
            ],
        )

    def test_contentMustBeFrames(self) -> None:
        """A lone bytes passed as content is refused, not sent byte by byte."""
        self.assertRaises(TypeError, self.core.send, "s", b"payload")

    def test_tooLongForTheWire(self) -> None:
        """A name longer than a protocol string can carry raises at the call."""
        self.assertRaises(mlm.MalformedMessage, self.core.set_producer, "s" * 256, Result())
        self.assertRaises(mlm.MalformedMessage, self.core.sendto, "a" * 256, "", [])
        self.assertEqual(self.owner.take(), [])
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_malformedIgnored(self) -> None:
        """A malformed message from the broker is dropped."""
        self.core.receive([b"\x00\x01"])
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_closeWaitsForQueuedCommands(self) -> None:
        """close() goes out after the queued commands; OK closes."""
        first, closed = Result(), Result()
        self.core.set_producer("s", first)
        self.core.close(closed)
        self.assertRaises(ClientClosedError, self.core.send, "x", [])
        self.assertEqual(self.owner.take(), [mlm.StreamWrite("s")])
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.ConnectionClose()])
        self.assertIs(self.core.state, ClientState.CLOSING)
        self.reply(mlm.Ok())
        self.assertIs(self.core.state, ClientState.CLOSED)
        self.assertIsNone(closed.outcome)
        self.assertIsNone(self.core.wakeup_at())

    def test_closeTwice(self) -> None:
        """A close() on a closed client completes at once."""
        self.core.close(Result())
        self.reply(mlm.Ok())
        again = Result()
        self.core.close(again)
        self.assertIsNone(again.outcome)

    def test_closeWithoutAnswer(self) -> None:
        """close() completes after the close timeout if the broker is silent."""
        closed = Result()
        self.core.close(closed)
        self.advance(0.9)
        self.assertFalse(closed.done)
        self.advance(0.2)
        self.assertIsNone(closed.outcome)
        self.assertIs(self.core.state, ClientState.CLOSED)


class ReconnectTests(CoreTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.connected()
        self.setting(lambda d: self.core.set_producer("weather", d), mlm.StreamWrite("weather"))
        self.setting(
            lambda d: self.core.set_consumer("news", "^sport", d), mlm.StreamRead("news", "^sport")
        )
        self.setting(
            lambda d: self.core.set_consumer("news", "^art", d), mlm.StreamRead("news", "^art")
        )
        self.setting(lambda d: self.core.remove_consumer("old", d), mlm.StreamCancel("old"))
        self.setting(
            lambda d: self.core.set_worker("echo", ".*", d), mlm.ServiceOffer("echo", ".*")
        )
        self.replayed = [
            mlm.StreamWrite("weather"),
            mlm.StreamRead("news", "^sport"),
            mlm.StreamRead("news", "^art"),
            mlm.StreamCancel("old"),
            mlm.ServiceOffer("echo", ".*"),
        ]

    def replay(self) -> list[mlm.Message]:
        """Answer each replayed command with OK; return what was sent."""
        sent = []
        while self.core.state is ClientState.RECONNECTING:
            step = self.owner.take()
            self.assertEqual(len(step), 1, step)
            sent.extend(step)
            self.reply(mlm.Ok())
        return sent

    def test_error500ReopensAndReplaysInOrder(self) -> None:
        """
        ERROR 500 (the broker does not know us) sends CONNECTION_OPEN; after
        its OK every recorded setting is sent again, in order, one at a time.
        """
        self.reply(mlm.Error(mlm.COMMAND_INVALID, "command invalid: CONNECTION_PING"))
        self.assertIs(self.core.state, ClientState.RECONNECTING)
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.core.reconnects, 1)
        self.assertEqual(self.replay(), self.replayed)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_staleErrorsIgnoredWhileReopening(self) -> None:
        """Further ERROR 500s before the new OPEN's OK answer older messages: ignored."""
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(self.core.reconnects, 1)

    def test_commandsWaitForReplay(self) -> None:
        """
        A command cut short by ERROR 500 and one issued while reconnecting
        go out after the replay; stream messages sent meanwhile are held.
        """
        cut, later = Result(), Result()
        self.core.set_consumer("extra", "x", cut)
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.set_worker("calc", "", later)
        self.core.send("temp.x", [b"1"])
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(
            self.owner.take(), [mlm.StreamSend("temp.x", [b"1"]), mlm.StreamRead("extra", "x")]
        )
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.ServiceOffer("calc", "")])
        self.reply(mlm.Ok())
        self.assertIsNone(cut.outcome)
        self.assertIsNone(later.outcome)
        self.assertEqual(self.core.settings[-2:],
                         (mlm.StreamRead("extra", "x"), mlm.ServiceOffer("calc", "")))

    def test_disconnectedThenBrokerBack(self) -> None:
        """
        After a lost connection the pings go on; the restarted broker's
        ERROR 500 to one of them starts the reopen and replay.
        """
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.advance(10)
        self.assertIn(mlm.ConnectionPing(), self.owner.take())
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertIs(self.core.state, ClientState.CONNECTED)

    def test_creditGrantedAgain(self) -> None:
        """The credit not used up is granted again right after the new OPEN's OK."""
        self.core.credit(5)
        for _ in range(2):
            self.reply(mlm.MailboxDeliver("bob", "me", "hi", "", []))
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.owner.take()
        self.reply(mlm.Ok())
        self.assertEqual(self.owner.take(), [mlm.Credit(3), self.replayed[0]])

    def test_supersededSettingsNotReplayed(self) -> None:
        """
        A new producer stream replaces the old; removing a consumer drops its
        earlier patterns (the removal itself is kept); repeats are kept once.
        """
        self.setting(lambda d: self.core.set_producer("alerts", d), mlm.StreamWrite("alerts"))
        self.setting(lambda d: self.core.remove_consumer("news", d), mlm.StreamCancel("news"))
        self.setting(
            lambda d: self.core.set_worker("echo", ".*", d), mlm.ServiceOffer("echo", ".*")
        )
        self.assertEqual(
            self.core.settings,
            (
                mlm.StreamCancel("old"),
                mlm.ServiceOffer("echo", ".*"),
                mlm.StreamWrite("alerts"),
                mlm.StreamCancel("news"),
            ),
        )

    def test_silenceWhileReopening(self) -> None:
        """No OK to the new OPEN within the timeout: DISCONNECTED, waiting commands fail."""
        waiting = Result()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.core.set_producer("s", waiting)
        self.advance(5.1)
        self.assertIs(self.core.state, ClientState.DISCONNECTED)
        self.assertIsInstance(waiting.outcome, BrokerUnreachableError)

    def test_error500DuringReplayStartsOver(self) -> None:
        """The broker forgetting us again mid-replay restarts the reopen."""
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.reply(mlm.Ok())
        self.owner.take()
        self.reply(mlm.Ok())
        self.owner.take()
        self.reply(mlm.Error(mlm.COMMAND_INVALID, ""))
        self.assertEqual(self.owner.take(), [mlm.ConnectionOpen(address="me")])
        self.reply(mlm.Ok())
        self.assertEqual(self.replay(), self.replayed)
        self.assertEqual(self.core.reconnects, 2)
